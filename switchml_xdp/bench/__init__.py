"""Benchmarks: commands that print figures (`python -m switchml_xdp.bench.NAME
--help`; most need root, a lab or both), and what they are built of. The
benchmarks use the lab (switchml_xdp/lab), never the other way round.

Commands:
    switch_cost    the switch program's ns/packet under load, and its start-up (`make bench`)
    switch_micro   each path of the switch program alone, through BPF_PROG_TEST_RUN
    engine_micro   the C engine's per-packet work with no network, stage by stage
    fanout_cost    unicast fan-out against multicast: TAT and the kernel programs' time
    afxdp_vs_udp   the two worker backends in the lab: goodput, ATE/s, packet rate
    precision      16- against 32-bit float sums over shaped lab links
    local_reduce   a host's local step (shared memory against Gloo on loopback)
    gpu_staging    the GPU staging pipeline against copy + allreduce + copy
`swml-lab bench` (`make bench-lab`), `swml-lab demo`, `swml-lab vm` and
`swml-worker bench` run the rest:
    lab_bench      the sweep against a user-space switch and Gloo; rank, rank_group:
                   its rank processes; report, lab_plots: its Markdown and plots;
                   constants, cpu, tcp_loss: its bounds, CPU accounting, TCP dropper
    lab_demo       the allreduce benchmark in a namespace or VM lab, and its summary
    allreduce_bench  one rank's allreduce benchmark (`swml-worker bench`)
    bpf_stats, output, local_procs: kernel BPF stats, printed rows, local ranks
"""
