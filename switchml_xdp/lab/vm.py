"""`swml-lab vm`: the switch and N workers in qemu VMs on this machine, with
virtio-net NICs of several queues on a bridge that snoops IGMP.

    with VmLab(workers=2) as lab:        # boots nothing yet
        results = lab.bench(size="1MiB", iterations=5)

One VM runs `swml-switch up eth0 --mode native` (native XDP on virtio_net,
asserted: the guest checks `ip -d link` too), the others `swml-worker bench
--backend afxdp`. How a VM boots (Debian's kernel, the host's root over 9p,
KVM or TCG): lab/vm_boot.py; what runs inside: vm_guest.sh; the network:
lab/vm_net.py. Host and guests talk only through the run directory, shared
read-write into every guest (files, see vm_guest.sh), and the lab network.

Everything carries the run's prefix ("swv" + 5 hex digits): the namespace with
the bridge and taps, the qemu processes (-name), the run directory under /tmp.
close() removes all of it, on success, on failure and on SIGTERM; a lab whose
owner was killed is removed by the next run (remove_orphans).
"""
from __future__ import annotations

import ctypes
import dataclasses
import json
import os
import re
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from . import lifecycle, netns
from .addressing import SUBNET_PREFIXLEN, SWITCH_IP
from .errors import LabError
from .vm_boot import boot_argv, build_initramfs, choose_accel, find_guest_kernel, missing
from .vm_net import VmHost, VmNetwork, vm_host

PREFIX_STEM = "swv"
GUEST_SCRIPT = Path(__file__).with_name("vm_guest.sh")
# Where the guest mounts a tmpfs over the host's (read-only) root: vm_init.sh.
GUEST_TMPFS = (Path("/tmp"), Path("/run"), Path("/var/tmp"))
# The Vagrant lab's NIC set-up (MTU, queue pairs, offloads, allmulticast), run in
# every guest: one description of what a virtio NIC needs for native XDP.
TUNE_NIC = Path(__file__).resolve().parents[2] / "packaging" / "tune-nic.sh"
GUEST_IFACE = "eth0"
MTU = 1500                     # vagrant/cluster.json network.mtu; at most wire.MAX_MTU (3494)
# virtio_net wants a spare TX queue per vCPU for XDP_TX: 2 x vCPUs queue pairs.
QUEUES_PER_CPU = 2
SWITCH_CPUS, WORKER_CPUS = 2, 1
SWITCH_MEMORY_MB, WORKER_MEMORY_MB = 1024, 768
# Under TCG on this busy 2-core machine a guest reaches its init in 8-30 s and
# compiles a BPF program with bcc in 35-80 s; each step may take up to this long.
STEP_TIMEOUT_S = 600
# README's Vagrant guidance: the host must not coalesce or checksum-offload
# towards the guest, or virtio_net refuses native XDP.
GUEST_OFFLOADS_OFF = ("guest_csum", "guest_tso4", "guest_tso6", "guest_ecn", "guest_ufo")
NICE = 10                      # the VMs share the machine: lower priority than interactive work
PR_SET_PDEATHSIG = 1


def new_prefix() -> str:
    return PREFIX_STEM + secrets.token_hex(3)[:5]


def state_path(prefix: str) -> Path:
    """Names the owner of VM lab `prefix`, for remove_orphans (not the
    namespace lab's lab-*.json: `swml-lab down` has no business with VMs)."""
    return lifecycle.STATE_DIR / f"vm-{prefix}.json"


@dataclasses.dataclass
class Vm:
    host: VmHost
    role: str                  # "switch" | "worker"
    cpus: int
    memory_mb: int
    proc: subprocess.Popen | None = None

    @property
    def name(self) -> str:
        return self.host.name


class VmLab:
    """A switch VM and `workers` worker VMs; a context manager (see the module)."""

    def __init__(self, workers: int = 2, accel: str = "auto",
                 switch_args: tuple[str, ...] = (), out=print, box_ports: int = 1,
                 tree: bool = False, mtu: int = MTU):
        """box_ports: the switch VM serves as a box with that many ports, its
        NIC and box_ports - 1 veths, members of one bridge that holds its
        address (vm_guest.sh); the workers reach it through the NIC. tree:
        the switch VM's box is a rack box whose parent box runs in a
        namespace of the same VM, behind a veth uplink (vm_guest.sh). mtu:
        the network's and every guest NIC's (larger k needs more: mtu.py)."""
        if not 1 <= workers <= 64:
            raise LabError(f"workers must be 1..64 (a job's members), not {workers}")
        self.prefix = new_prefix()
        self.workers = workers
        self.wanted_accel = accel
        self.switch_args = tuple(switch_args)
        self.box_ports = box_ports
        self.tree = tree
        self.out = out
        self.accel = ""
        self.accel_reason = ""
        self.mtu = mtu
        self.net = VmNetwork(self.prefix, mtu)
        self.run_dir: Path | None = None
        self.switch = Vm(vm_host(self.prefix, "sw", QUEUES_PER_CPU * SWITCH_CPUS), "switch",
                         SWITCH_CPUS, SWITCH_MEMORY_MB)
        self.worker_vms = [Vm(vm_host(self.prefix, f"w{r}", QUEUES_PER_CPU * WORKER_CPUS), "worker",
                              WORKER_CPUS, WORKER_MEMORY_MB) for r in range(workers)]
        self.timings: dict[str, float] = {}
        self.switch_ready_line = ""
        self._closed = False

    @property
    def vms(self) -> list[Vm]:
        return [self.switch, *self.worker_vms]

    # -- lifecycle ---------------------------------------------------------------

    def __enter__(self) -> VmLab:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def boot(self, bench_args: tuple[str, ...] = ()) -> None:
        """Make the network and the run directory, choose KVM or TCG, start every VM."""
        why = missing()
        if why:
            raise LabError(f"cannot boot lab VMs: {why}")
        if not TUNE_NIC.exists():
            raise LabError(f"{TUNE_NIC} is missing: swml-lab vm runs from a checkout")
        need = sum(vm.memory_mb for vm in self.vms)
        free = _available_memory_mb()
        if need > free:
            raise LabError(f"{len(self.vms)} VMs need {need} MiB of memory, {free} MiB are available")
        remove_orphans()
        lifecycle.track(self)
        lifecycle.STATE_DIR.mkdir(parents=True, exist_ok=True)
        state_path(self.prefix).write_text(json.dumps({"owner_pid": os.getpid()}) + "\n")
        self.run_dir = Path(tempfile.mkdtemp(prefix=f"{self.prefix}-", dir="/tmp"))
        kernel = find_guest_kernel()
        initramfs = build_initramfs(kernel, self.run_dir / "initramfs.cpio")
        t0 = time.monotonic()
        self.accel, self.accel_reason = choose_accel(kernel, initramfs, self.wanted_accel)
        self.timings["accel_probe_s"] = time.monotonic() - t0
        self.out(f"vm lab {self.prefix}: {self.accel.upper()} ({self.accel_reason}); guest kernel "
                 f"{kernel.version}; switch + {self.workers} workers; run dir {self.run_dir}")
        self.net.create()
        token = secrets.token_hex(16)
        for vm in self.vms:
            self.net.add_tap(vm.host)
            self._write_env(vm, token, bench_args)
        for vm in self.vms:
            self._start(vm, kernel, initramfs)

    def close(self) -> None:
        """Stop every VM, remove the network, the run directory and the state file."""
        if self._closed:
            return
        self._closed = True
        procs = [vm.proc for vm in self.vms if vm.proc is not None and vm.proc.poll() is None]
        netns.terminate_pids([p.pid for p in procs])
        for p in procs:
            p.wait()
        self.net.remove()
        if self.run_dir is not None:
            shutil.rmtree(self.run_dir, ignore_errors=True)
        state_path(self.prefix).unlink(missing_ok=True)
        lifecycle.untrack(self)

    # -- the bench -------------------------------------------------------------------

    def bench(self, size: str = "1MiB", iterations: int = 5, warmup: int = 1,
              dtype: str = "float32", verify: bool = True, timeout: float = STEP_TIMEOUT_S,
              extra: Sequence[str] = ()) -> list[dict]:
        """Boot, run `swml-worker bench` on every worker VM against the switch VM,
        return the per-rank JSON results (rank order). `extra`: more of the
        bench's options, after the guest's own (`--backend afxdp`): the last
        of an option's values is the one taken."""
        args = ["--size", size, "--iterations", str(iterations), "--warmup", str(warmup),
                "--dtype", dtype] + (["--verify"] if verify else []) + list(extra)
        self.boot(tuple(args))
        t0 = time.monotonic()
        self.switch_ready_line = self._wait_file(self.switch, "ready", timeout).strip()
        self.timings["switch_ready_s"] = time.monotonic() - t0
        self._check_native_xdp()
        self.out(f"switch VM: {self.switch_ready_line}")
        (self.run_dir / "go").touch()
        t1 = time.monotonic()
        results = []
        for vm in self.worker_vms:
            rc = self._wait_file(vm, "rc", timeout).strip()
            if rc != "0":
                raise LabError(f"worker VM {vm.name} failed (status {rc}):\n{self._tail(vm)}")
            results.append(json.loads(self._read(vm, "json").strip().splitlines()[-1]))
        self.timings["bench_s"] = time.monotonic() - t1
        self.timings.update(self._boot_times())
        (self.run_dir / "stop").touch()
        status = self._wait_file(self.switch, "rc", 60).strip()
        if status != "0":
            raise LabError(f"the switch VM's daemon ended with status {status}:\n{self._tail(self.switch)}")
        return results

    def switch_status(self) -> dict:
        """`swml-switch status --json` as the switch VM saw it just before it stopped."""
        return json.loads(self._read(self.switch, "status.json"))

    # -- inside -----------------------------------------------------------------------

    def _write_env(self, vm: Vm, token: str, bench_args: tuple[str, ...]) -> None:
        rank = "" if vm.role == "switch" else vm.name[1:]
        env = {
            "SWML_ROLE": vm.role, "SWML_IFACE": GUEST_IFACE, "SWML_MTU": self.mtu,
            "SWML_IP": vm.host.ip, "SWML_PREFIXLEN": SUBNET_PREFIXLEN,
            "SWML_SWITCH_IP": SWITCH_IP, "SWML_RANK": rank, "SWML_WORLD": self.workers,
            "SWML_PYTHON": sys.executable, "SWML_TUNE_NIC": TUNE_NIC,
            "SWML_SWITCH_ARGS": " ".join(map(shlex.quote, self.switch_args)),
            "SWML_BENCH_ARGS": " ".join(map(shlex.quote, bench_args)),
            "SWML_TOKEN": token, "SWML_WAIT_S": STEP_TIMEOUT_S, "SWML_BOX_PORTS": self.box_ports,
            "SWML_TREE": int(self.tree),
        }
        text = "".join(f"{k}={shlex.quote(str(v))}\n" for k, v in env.items())
        path = self.run_dir / f"{vm.name}.env"
        path.write_text(text)
        path.chmod(0o600)       # the job's token

    def _start(self, vm: Vm, kernel, initramfs: Path) -> None:
        h = vm.host
        shares = hidden_host_paths()
        cmdline = f"quiet net.ifnames=0 random.trust_cpu=on swml.vm={h.name} swml.guest={GUEST_SCRIPT}"
        if shares:
            cmdline += " swml.share=" + ",".join(f"hostp{i}:{path}" for i, path in enumerate(shares))
        nic = ",".join([f"virtio-net-pci,netdev=n0,mac={h.mac},mq=on,vectors={2 * h.queues + 2}",
                        *(f"{o}=off" for o in GUEST_OFFLOADS_OFF)])
        argv = [
            *boot_argv(kernel, initramfs, self.accel, cmdline, vm.memory_mb, vm.cpus),
            "-name", f"{self.prefix}-{h.name},process={self.prefix}-{h.name}",
            "-serial", f"file:{self.run_dir / f'{h.name}.console'}",
            "-fsdev", "local,id=root,path=/,security_model=none,readonly=on,multidevs=remap",
            "-device", "virtio-9p-pci,fsdev=root,mount_tag=hostroot",
            "-fsdev", f"local,id=run,path={self.run_dir},security_model=none",
            "-device", "virtio-9p-pci,fsdev=run,mount_tag=swmlrun",
            *(arg for i, path in enumerate(shares) for arg in (
                "-fsdev", f"local,id=hostp{i},path={path},security_model=none,readonly=on,"
                          "multidevs=remap",
                "-device", f"virtio-9p-pci,fsdev=hostp{i},mount_tag=hostp{i}")),
            "-netdev", f"tap,id=n0,ifname={h.tap},script=no,downscript=no,vhost=off,queues={h.queues}",
            "-device", nic,
            "-device", "virtio-rng-pci",
        ]
        log = open(self.run_dir / f"{h.name}.qemu", "w")
        vm.proc = netns.popen_in(self.net.ns, argv, stdin=subprocess.DEVNULL, stdout=log,
                                 stderr=subprocess.STDOUT, preexec_fn=_child_setup)
        log.close()

    def _check_native_xdp(self) -> None:
        """The ready line and the guest's own `ip -d link` must both say native."""
        link = self._read(self.switch, "xdp")
        if "native XDP" not in self.switch_ready_line or not re.search(r"\bprog/xdp\b", link):
            raise LabError(f"the switch VM is not in native XDP mode: {self.switch_ready_line}\n{link}")

    def _boot_times(self) -> dict[str, float]:
        """Guest uptime when stage two began, per VM (the kernel's boot plus stage one)."""
        return {f"boot_{vm.name}_s": float(self._read(vm, "booted")) for vm in self.vms
                if (self.run_dir / f"{vm.name}.booted").exists()}

    def _read(self, vm: Vm, what: str) -> str:
        return (self.run_dir / f"{vm.name}.{what}").read_text()

    def _wait_file(self, vm: Vm, what: str, timeout: float) -> str:
        """The content of <vm>.<what> once the guest published it (renamed into
        place whole); fails early if the VM died."""
        path = self.run_dir / f"{vm.name}.{what}"
        deadline = time.monotonic() + timeout
        while not path.exists():
            if vm.proc.poll() is not None:
                raise LabError(f"VM {vm.name} exited (qemu status {vm.proc.returncode}) before "
                               f"writing {path.name}:\n{self._tail(vm)}")
            if time.monotonic() > deadline:
                raise LabError(f"VM {vm.name} wrote no {path.name} within {timeout:g} s:\n{self._tail(vm)}")
            time.sleep(0.5)
        return path.read_text()

    def _tail(self, vm: Vm, lines: int = 25) -> str:
        """The end of what the VM said: its own log, else its console, else qemu's."""
        for what in ("log", "console", "qemu"):
            path = self.run_dir / f"{vm.name}.{what}"
            if path.exists() and path.stat().st_size:
                text = path.read_text(errors="replace").splitlines()[-lines:]
                return f"--- {path.name} ---\n" + "\n".join(text)
        return "(no output)"


def _available_memory_mb() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) // 1024
    return 0


def hidden_host_paths(wanted: list[Path] | None = None) -> list[Path]:
    """Host directories a guest needs (default: this checkout, the Python
    environment running it) that lie under a directory the guest covers with a
    tmpfs (a checkout in /tmp, as CI makes one): shared into the guest again,
    read-only, at the same path on top of the tmpfs."""
    if wanted is None:
        wanted = [Path(__file__).resolve().parents[2], Path(sys.prefix).resolve()]
    out: list[Path] = []
    for path in wanted:
        if not any(path == t or t in path.parents for t in GUEST_TMPFS):
            continue
        if any(path == q or q in path.parents for q in out):
            continue
        out = [q for q in out if path not in q.parents] + [path]
    return out


def _child_setup() -> None:
    """In each qemu before exec: lower priority, and die with the lab's process
    (PR_SET_PDEATHSIG survives nsenter's exec of qemu)."""
    os.setpriority(os.PRIO_PROCESS, 0, max(NICE, os.getpriority(os.PRIO_PROCESS, 0)))
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def remove_orphans() -> list[str]:
    """Remove VM labs whose owner process is gone (killed before it could close):
    their namespace (and what still runs in it), run directory and state file."""
    removed = []
    for state in lifecycle.STATE_DIR.glob(f"vm-{PREFIX_STEM}*.json"):
        try:
            owner = json.loads(state.read_text())["owner_pid"]
            os.kill(owner, 0)
            continue
        except ProcessLookupError:
            pass
        except (OSError, ValueError, KeyError):
            continue
        prefix = state.stem.removeprefix("vm-")
        net = VmNetwork(prefix, MTU)
        net._made = netns.ns_path(net.ns).exists()
        net.remove()
        for d in Path("/tmp").glob(f"{prefix}-*"):
            shutil.rmtree(d, ignore_errors=True)
        state.unlink(missing_ok=True)
        removed.append(prefix)
    return removed

