"""`swml-lab`'s commands that run a workload in a lab they build and remove:
demo (the allreduce benchmark), train (DDP training, swml against Gloo),
bench (the sweep against a user-space switch and Gloo), vm (the demo in qemu
VMs). cli/lab.py adds them to its group; what they share: cli/lab_options.py."""
from __future__ import annotations

import shlex
import sys
from pathlib import Path

import click

from switchml_xdp import wire
from switchml_xdp.lab.addressing import MAX_BOXES
from switchml_xdp.lab.box_ports import MAX_PORTS
from switchml_xdp.lab.racks import MAX_RACKS
from switchml_xdp.lab.shaping import MAX_QUEUE_PACKETS, MAX_RATE_MBIT
from switchml_xdp.lab.wiring import HOST_QUEUE_PACKETS
from switchml_xdp.switch.dataplane import DEFAULT_FANOUT, FANOUTS

from .common import DscpClasses, allreduce_options
from .lab_options import (
    box_options,
    burst_option,
    check_burst,
    check_k_fits,
    check_port_hooks,
    lab_errors,
    lab_options,
    list_of,
    mtu_option,
    port_hooks_option,
    rack_options,
    racks_of,
    run_rows,
)


@click.command()
@lab_options
@box_options
@allreduce_options("16MiB", iterations=5, warmup=1)
@click.option("--verify/--no-verify", default=True, show_default=True,
              help="check every element of every result")
@click.option("--fanout", type=click.Choice(FANOUTS), default=DEFAULT_FANOUT, show_default=True,
              help="the switch's `--fanout`; with unicast the lab carries no multicast from the "
                   "switch, as a cloud VPC")
@rack_options
def demo(workers, prefix, rate, boxes, ports, box_rate, size, iterations, warmup, dtype, backend, verify,
         fanout, racks, per_rack, uplink_rate, layout):
    """Switch + WORKERS workers in a lab, running an allreduce benchmark
    (with --boxes: one job over every box, and each box's share printed;
    with --racks: one job through a tree of boxes, or flat on the parent).

    Every argument is checked before anything is built."""
    from switchml_xdp.bench.lab_demo import run_demo, run_racks_demo

    if prefix:
        raise click.BadParameter("demo makes a fresh lab each run", param_hint="--prefix")
    sizes = racks_of(racks, per_rack, uplink_rate, layout)
    if sizes is not None:
        if fanout != DEFAULT_FANOUT:
            raise click.BadParameter("not with --racks", param_hint="--fanout")
        with lab_errors():
            try:
                run_racks_demo(sizes, layout or "tree", size, iterations, warmup, dtype, backend,
                               verify, rate, uplink_rate, out=click.echo)
            except RuntimeError as e:
                raise click.ClickException(str(e)) from None
        return
    if workers > wire.MAX_WORLD:
        raise click.BadParameter(f"a job has at most {wire.MAX_WORLD} ranks", param_hint="--workers")
    with lab_errors():
        try:
            run_demo(workers, size, iterations, warmup, dtype, backend, verify, rate, out=click.echo,
                     fanout=fanout, boxes=boxes, box_rate=box_rate, ports=ports)
        except RuntimeError as e:
            raise click.ClickException(str(e)) from None


@click.command()
@click.option("-n", "--workers", type=click.IntRange(1, 64), default=4, show_default=True,
              help="Number of lab hosts (each runs --ranks-per-host ranks; a job has at most 64 hosts).")
@click.option("--epochs", type=click.IntRange(1, None), default=30, show_default=True,
              help="Passes over the training set.")
@click.option("--batch", type=click.IntRange(1, None), default=16, show_default=True,
              help="Batch size per rank.")
@click.option("--lr", type=click.FloatRange(0, None, min_open=True), default=0.05, show_default=True,
              help="Learning rate (SGD).")
@click.option("--seed", type=int, default=0, show_default=True,
              help="Seed of the model's weights and the data split (the same for both runs).")
@click.option("--bucket-kb", type=click.FloatRange(0, None, min_open=True), default=1.0,
              show_default=True, help="DDP bucket size cap in KiB.")
@click.option("--backend", default="auto", show_default=True, type=click.Choice(["auto", "afxdp", "udp"]),
              help="The swml worker's datapath.")
@click.option("--rate", type=click.FloatRange(0, MAX_RATE_MBIT, min_open=True), default=None,
              metavar="MBIT", help="Shape every worker link to MBIT Mbit/s each way (TBF).")
@box_options
@click.option("--kill-box", default=None, metavar="B",
              help="Power box B off (0: sw, 1: sw1, ...; its link down, its daemon killed) "
                   "--kill-after seconds into the swml run, and print when each rank warned; "
                   "with --racks: parent (the same), or rN (rack N's box: its daemon killed and "
                   "its data plane removed, the rack's routing kept).")
@click.option("--kill-after", type=click.FloatRange(0, None, min_open=True), default=None,
              metavar="SECONDS", help="When --kill-box strikes, from the swml ranks' start.")
@click.option("--ranks-per-host", type=click.IntRange(1, 16), default=1, show_default=True,
              help="Ranks on each lab host, as torchrun --nproc_per_node: the swml run then "
                   "reduces each host's ranks first and streams one leader a host (the swml "
                   "process group); with 1, it uses the DDP hook.")
@click.option("--fsdp2", is_flag=True,
              help="Shard the model with FSDP2 (fully_shard) instead of DDP: the swml run over "
                   "the swml process group, the Gloo run over Gloo.")
@click.option("--png", default="swml-train.png", show_default=True, type=click.Path(dir_okay=False),
              help="Where to save the loss and accuracy curves.")
@click.option("--json", "json_path", default=None, type=click.Path(dir_okay=False),
              help="Also save both runs' curves as JSON.")
@rack_options
def train(workers, epochs, batch, lr, seed, bucket_kb, backend, rate, boxes, ports, box_rate,
          kill_box, kill_after, ranks_per_host, fsdp2, png, json_path, racks, per_rack,
          uplink_rate, layout):
    """Train an MLP on scikit-learn's digits with DDP, through the switch and with Gloo.

    Same seeds both times; prints final accuracy and time per epoch of both and
    saves a PNG of the loss and accuracy curves (needs the torch extra,
    scikit-learn and matplotlib). With --boxes, the swml run goes over every
    box (SWML_SWITCH, the swml process group) and prints each box's share;
    with --racks, each rank's SWML_SWITCH is its rack's box (tree) or the
    parent (flat)."""
    sizes = racks_of(racks, per_rack, uplink_rate, layout)
    layout = layout or "tree"
    if (kill_box is None) != (kill_after is None):
        raise click.UsageError("--kill-box and --kill-after go together")
    box = kill_target(kill_box, boxes, sizes, layout)
    try:
        import matplotlib  # noqa: F401 - (imported to fail here, with the hint below)
        import sklearn  # noqa: F401 - (the same)

        import switchml_xdp.torch  # noqa: F401 - (says how to install torch if it is missing)
        from switchml_xdp.lab.train_example import TrainConfig
        from switchml_xdp.lab.train_runs import run_lab_training
    except ImportError as e:
        raise click.ClickException(f"swml-lab train needs torch, scikit-learn and matplotlib: {e}") from None
    cfg = TrainConfig(epochs=epochs, batch=batch, lr=lr, seed=seed, bucket_kb=bucket_kb,
                      ranks_per_host=ranks_per_host, parallel="fsdp2" if fsdp2 else "ddp",
                      boxes=boxes, racks=sizes, layout=layout)
    kill = (box, kill_after) if box is not None else None
    with lab_errors():
        try:
            run_lab_training(workers, cfg, backend, png, json_path, rate, out=click.echo,
                             box_rate=box_rate, kill=kill, ports=ports, uplink_rate=uplink_rate)
        except RuntimeError as e:
            raise click.ClickException(str(e)) from None


def kill_target(kill_box: str | None, boxes: int, sizes: list[int] | None, layout: str) -> int | None:
    """--kill-box as an index into the lab's switches (racks: 0 the parent,
    1+N rack N's box); a click error in one line for a box the lab has not."""
    if kill_box is None:
        return None
    name = kill_box.strip().lower()
    if sizes is None:
        if name.isdigit() and int(name) < boxes:
            return int(name)
        raise click.BadParameter(f"the lab has boxes 0..{boxes - 1}, not {kill_box!r}",
                                 param_hint="--kill-box")
    if name == "parent":
        return 0
    racks = len(sizes) if layout == "tree" else 0
    if name[:1] == "r" and name[1:].isdigit() and int(name[1:]) < racks:
        return 1 + int(name[1:])
    has = (f"parent or r0..r{racks - 1} (rack boxes)" if racks
           else "parent only (flat racks have no rack boxes)")
    raise click.BadParameter(f"the racks' boxes are {has}, not {kill_box!r}", param_hint="--kill-box")


@click.command()
@click.option("-n", "--workers", default="2,4,8", show_default=True, callback=list_of(int, "workers"),
              help="worker counts, comma-separated (one lab each)")
@click.option("--rate", type=click.FloatRange(0, MAX_RATE_MBIT, min_open=True), default=None,
              metavar="MBIT", help="every worker link's rate, each way [default: 50, low enough "
                                   "that 2 cores keep up with 8 workers]")
@click.option("--size", default="8MiB", show_default=True, help="float32 tensor size (bytes; KiB/MiB/...)")
@click.option("--iterations", default=5, show_default=True, type=click.IntRange(1, None),
              help="timed allreduces per measurement")
@click.option("--warmup", default=1, show_default=True, type=click.IntRange(0, None),
              help="untimed allreduces before them")
@click.option("--loss", "losses", default="0,0.1%,1%", show_default=True,
              callback=list_of(float, "loss"), help="loss rates per link and direction")
@burst_option(" In the sweep: every nonzero rate's, on swml's UDP (Gloo's TCP loss stays random).")
@click.option("-k", "--elements", "ks", default="64,256", show_default=True,
              callback=list_of(int, "k"), help="elements a packet (swml systems)")
@click.option("--systems", default="swml-afxdp,swml-udp,userspace,gloo", show_default=True,
              callback=list_of(str, "systems"),
              help="what to run: swml-afxdp / swml-udp (the XDP switch, workers on the afxdp or "
                   "udp backend), userspace (the same protocol served by a user-space switch "
                   "process on a UDP socket instead of XDP: the baseline that shows what XDP "
                   "buys), gloo (torch.distributed's ring allreduce over TCP); and the 16-bit "
                   "pair: swml-afxdp16 (the switch's 16-bit block format) and gloo-fp16 (Gloo on "
                   "a float16 copy, as torch's fp16 compression hook)")
@click.option("--job-slots", type=click.IntRange(8, 1024), default=None,
              help="slots a job gets on the switches [default: what covers 8 ms of the "
                   "link's sending (a lost packet's recovery), 16..512]")
@click.option("--out", "out_dir", default=None,
              help="directory for lab_bench.json, lab_bench.md and the PNG plots [default: a new "
                   "./swml-lab-bench-DATE-TIME; the figures README quotes are in bench/results]")
@click.option("--no-check", is_flag=True, help="skip checking the first result against the exact sum")
@click.option("--env", "env", multiple=True, metavar="NAME=VALUE",
              help="extra environment for every rank process (e.g. SWML_AFXDP_SPIN=200)")
@click.option("--wait-quiet", default=600.0, show_default=True, type=click.FloatRange(0, None),
              metavar="SECONDS", help="before each measurement wait up to SECONDS for the machine to "
                                      "be quiet (no other lab, little CPU use); 0: never wait")
@click.option("--queue", type=click.IntRange(1, MAX_QUEUE_PACKETS), default=None,
              metavar="PACKETS", help="Every shaped switch port's queue depth in packets (its "
              f"buffer; the hosts' own interfaces keep {HOST_QUEUE_PACKETS}) [default: TBF's 20 ms]")
@click.option("--fanout", type=click.Choice(FANOUTS), default=DEFAULT_FANOUT, show_default=True,
              help="the XDP switch's `--fanout` (the lab keeps multicast: this measures the cost)")
@click.option("--boxes", default="1", show_default=True, callback=list_of(int, "boxes"),
              help="box counts, comma-separated (e.g. 1,2,3): for each, a lab of that many boxes "
                   "and the swml systems over all of them, a row each with its own bound "
                   "(docs/scale-out.md); Gloo runs once, the peer of every row")
@click.option("--box-rate", type=click.FloatRange(0, MAX_RATE_MBIT, min_open=True), default=None,
              metavar="MBIT", help="every box's port, each way [default: unshaped]")
@click.option("--ports", type=click.IntRange(1, MAX_PORTS), default=1, show_default=True,
              help="the switch as a box with that many ports, each on a segment of its own "
                   "(with --boxes 1), bound as that many boxes (docs/scale-out.md)")
@click.option("--collective", type=click.Choice(["allreduce", "reduce_scatter"]), default="allreduce",
              show_default=True, help="what is timed; reduce_scatter: each rank keeps its shard "
              "(with --fanout unicast the switch sends each rank only its shard's sums)")
@click.option("--racks", type=click.IntRange(1, MAX_RACKS), default=None,
              help="Instead of the sweep: racks of --per-rack workers (docs/scale-out.md, \"A tree "
                   "of boxes\"), three rows for the same bytes: one rack alone, the tree, the "
                   "same racks flat on the parent; a tree row more for each --loss after 0 "
                   "[--rate default: 100]")
@click.option("--per-rack", default=None, metavar="N[,N..]",
              help="With --racks: workers in each rack, one count or one a rack (e.g. 2,3,4)")
@click.option("--uplink-rate", type=click.FloatRange(0, MAX_RATE_MBIT, min_open=True), default=None,
              metavar="MBIT", help="With --racks: every rack's uplink, each way [default: unshaped]")
@click.option("--jobs", "jobs_spec", default=None, metavar="NxSIZE[@W][,NxSIZE[@W]..]",
              help="Instead of the sweep: competing jobs (N workers, float32 tensors of SIZE each, "
                   "weight W under --share weighted, default 1; e.g. 2x2MiB,2x4MiB,2x8MiB,2x16MiB) "
                   "through one box whose link (--box-rate, default --rate) is the bottleneck, all "
                   "starting together, beside the same jobs as Gloo rings; the share policies' "
                   "targets at the end [--rate default: 100, --iterations: 10]")
@click.option("--share", default=None, metavar="POLICY[,POLICY..]",
              help="With --jobs: the box's share policies, a run each (none: the box as it is, "
                   "no policy) [default: none,fair,weighted,srpt]")
@click.option("--reweight", default=None, metavar="W,W..",
              help="With --jobs and the weighted policy: the jobs' weights from mid-run on (one a "
                   "job, set with `swml-switch job`), and how long the rates take to follow")
@click.option("--no-gloo", is_flag=True,
              help="With --jobs: leave the Gloo rings out (many jobs' torch ranks on few cores)")
@click.option("--dscp", "dscp_classes", type=DscpClasses(), default=None, metavar="LIST",
              help="With --jobs: under a policy the box marks jobs (swml-switch up --dscp LIST) and "
                   "the lab's box port serves LIST as priority bands")
@mtu_option
@click.option("--link-queues", type=click.IntRange(1, wire.MAX_LANES), default=1, show_default=True,
              help="every lab link's queues, for the swml systems in lanes (--env SWML_LANES=Q; "
                   "the lab steers UDP port p to queue p mod Q)")
@port_hooks_option
def bench(workers, rate, queue, size, iterations, warmup, losses, ks, systems, job_slots, out_dir, no_check,
          env, wait_quiet, fanout, boxes, box_rate, ports, collective, racks, per_rack, uplink_rate,
          jobs_spec, share, reweight, no_gloo, dscp_classes, burst, mtu, link_queues,
          port_hooks):
    """Allreduce through switchml-xdp (afxdp, udp), a user-space switch and Gloo,
    on shaped lab links, sweeping workers, loss and k; JSON, Markdown, PNG plots.

    The default sweep (3 worker counts x 3 loss rates x 2 k x 4 systems) takes
    about 25 minutes on a quiet 2-core machine, longer while it waits for
    the machine to be quiet (--wait-quiet); e.g. `-n 2 --loss 0 -k 256`
    takes a few minutes."""
    import time

    from switchml_xdp.bench import lab_bench
    from switchml_xdp.bench.allreduce_bench import parse_size

    for value, hint in ((burst, "--burst"), (mtu, "--mtu"), (link_queues if link_queues > 1 else None,
                                                          "--link-queues")):
        if value is not None and (jobs_spec is not None or racks is not None):
            raise click.BadParameter("not with --jobs or --racks", param_hint=hint)
    check_burst(burst, losses)
    check_port_hooks(port_hooks, any(losses), jobs_spec is not None or racks is not None)
    if jobs_spec is not None:
        from .lab_bench_jobs import bench_jobs

        bench_jobs(jobs_spec, share, reweight, rate, box_rate, iterations, warmup, out_dir,
                   not no_gloo, dscp_classes)
        return
    for name in ("share", "reweight", "no_gloo", "dscp_classes"):
        if click.get_current_context().get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE:
            raise click.BadParameter("only with --jobs",
                                     param_hint=f"--{name.replace('_classes', '').replace('_', '-')}")
    if racks_of(racks, per_rack, uplink_rate) is not None:
        _bench_racks(racks, per_rack, rate, uplink_rate, size, iterations, warmup, losses, out_dir,
                     queue)
        return

    bad = [s for s in systems if s not in lab_bench.SYSTEMS]
    if bad:
        raise click.BadParameter(f"unknown system(s) {', '.join(bad)}; choose from "
                                 f"{', '.join(lab_bench.SYSTEMS)}", param_hint="--systems")
    if not workers or min(workers) < 1 or max(workers) > 64:
        raise click.BadParameter("worker counts must be in 1..64", param_hint="--workers")
    if not boxes or min(boxes) < 1 or max(boxes) > MAX_BOXES or len(set(boxes)) < len(boxes):
        raise click.BadParameter(f"box counts must be in 1..{MAX_BOXES}, each once",
                                 param_hint="--boxes")
    if ports > 1 and list(boxes) != [1]:
        raise click.BadParameter("a switch of several ports is one box: --boxes 1",
                                 param_hint="--ports")
    if any(not 1 <= k <= wire.MAX_K for k in ks):
        raise click.BadParameter(f"k must be in 1..{wire.MAX_K}", param_hint="--elements")
    check_k_fits(ks, mtu)
    try:
        size_bytes = parse_size(size)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--size") from None
    if collective == "reduce_scatter" and any(size_bytes % (4 * n) for n in workers):
        raise click.BadParameter(f"a reduce_scatter needs a size of float32s that every worker "
                                 f"count ({', '.join(map(str, workers))}) divides", param_hint="--size")
    if out_dir is None:
        out_dir = f"swml-lab-bench-{time.strftime('%Y%m%d-%H%M%S')}"
        if Path(out_dir).exists():
            raise click.ClickException(f"{out_dir} exists; give --out")
    cfg = lab_bench.BenchConfig(
        workers=workers, rate_mbit=rate or lab_bench.DEFAULT_RATE_MBIT, queue_packets=queue,
        size=size_bytes,
        iterations=iterations, warmup=warmup, losses=losses, ks=ks, systems=systems,
        out_dir=out_dir, job_slots=job_slots, check=not no_check,
        env=dict(e.split("=", 1) for e in env if "=" in e),
        wait_quiet=wait_quiet, fanout=fanout, collective=collective, boxes=boxes,
        box_rate_mbit=box_rate, ports=ports, burst=burst, mtu=mtu, link_queues=link_queues,
        port_hooks=port_hooks, command="swml-lab bench" + "".join(f" {shlex.quote(a)}" for a in sys.argv[2:]))
    with lab_errors():
        lab_bench.run_bench(cfg, out=click.echo)


# What a sweep has that the racks' rows do not take (bench --racks).
NOT_WITH_RACKS = ("workers", "ks", "systems", "job_slots", "no_check", "env", "fanout",
                  "boxes", "box_rate", "ports", "collective")


def _bench_racks(racks, per_rack, rate, uplink_rate, size, iterations, warmup, losses,
                 out_dir, queue) -> None:
    """`swml-lab bench --racks`: bench/racks_bench.py's rows."""
    import time

    from switchml_xdp.bench.allreduce_bench import parse_size
    from switchml_xdp.bench.racks_bench import RacksConfig, run_racks_bench

    ctx = click.get_current_context()
    for name in NOT_WITH_RACKS:
        if ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE:
            raise click.BadParameter("not with --racks", param_hint=f"--{name.replace('_', '-')}")
    sizes = racks_of(racks, per_rack, uplink_rate)
    try:
        size_bytes = parse_size(size)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--size") from None
    if ctx.get_parameter_source("losses") != click.core.ParameterSource.COMMANDLINE:
        losses = (0.0,)
    out = Path(out_dir or f"swml-lab-bench-racks-{time.strftime('%Y%m%d-%H%M%S')}")
    out.mkdir(parents=True, exist_ok=True)
    cfg = RacksConfig(sizes, rate or 100.0, uplink_rate, size_bytes, iterations, warmup,
                      (0.0, *(p for p in losses if p)), str(out / "racks_bench.json"),
                      str(out / "racks_bench.png"),
                      "swml-lab bench" + "".join(f" {shlex.quote(a)}" for a in sys.argv[2:]),
                      queue=queue)
    run_rows(run_racks_bench, cfg)


# The same in qemu VMs: the VMs in switchml_xdp/lab/vm.py, the run in switchml_xdp/bench/lab_demo.py.
@click.command()
@click.option("-n", "--workers", type=click.IntRange(1, 64), default=2, show_default=True,
              help="Number of worker VMs (one more VM runs the switch).")
@click.option("--size", default="1MiB", show_default=True, help="tensor size (bytes; K/M/G/KiB/MiB/GiB)")
@click.option("--iterations", default=5, show_default=True, type=click.IntRange(1, None),
              help="timed allreduces")
@click.option("--warmup", default=1, show_default=True, type=click.IntRange(0, None),
              help="untimed allreduces before them")
@click.option("--dtype", default="float32", show_default=True, type=click.Choice(["float32", "int32"]),
              help="element type")
@click.option("--accel", default="auto", show_default=True, type=click.Choice(["auto", "kvm", "tcg"]),
              help="auto: KVM if a short probe boot works, else TCG")
@click.option("--verify/--no-verify", default=True, show_default=True,
              help="check every element of every result")
def vm(workers, size, iterations, warmup, dtype, accel, verify):
    """Switch + WORKERS workers in qemu VMs (virtio-net, native XDP), running the benchmark."""
    from switchml_xdp.bench.lab_demo import run_vm_demo

    with lab_errors():
        run_vm_demo(workers, size, iterations, warmup, dtype, verify, accel, out=click.echo)
