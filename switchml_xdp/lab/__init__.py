"""The lab: an emulated cluster (a switch, or M boxes, + N workers on a bridge) in
network namespaces.

    from switchml_xdp.lab import Lab
    with Lab(workers=4, rate_mbit=1000) as lab:
        lab.run(lab.workers[0], ["ping", "-c1", lab.switch.ip])
        with lab.enter(lab.workers[1]):   # this thread only
            ...

Modules, each on top of the ones before it:
    errors      LabError
    addressing  names, addresses and MACs derived from a lab's prefix; Host
    netns       named network namespaces: make, enter, run in, empty, remove
    shaping     rate limits on links (tc TBF/HTB), DSCP priority bands on box ports
    loss_values the injector's probabilities and port, checked (no BPF)
    burst       bursty loss: the Gilbert-Elliott model's p, r, h from a mean rate and length
    loss        the loss and duplication injector (XDP + tc, through switchml_xdp.bpf)
    lifecycle   state files, closing live labs at exit/SIGTERM, removing leftovers
    igmp        a bridge that snoops IGMP with a querier (Lab(igmp=True), the VM lab)
    wiring      the steps a lab is built of: namespaces, bridge, veth links, pass program
    box_ports   the switch as a box with several ports, each on its own segment (Lab(ports=P))
    link_mtu    every link of a lab at one MTU, up to one page's frame (Lab(mtu=N))
    steering    UDP to a receive queue by port on links of several queues (Lab(link_queues=Q))
    namespace_lab  Lab: builds, uses and removes one lab
    cluster     the real switch daemon and workers run inside a Lab
    train_example  `swml-lab train`'s rank: DDP training through the switch or Gloo
    box_runs    a job over the lab's boxes: a switch on each, each box's share printed
    lost_box    a box powered off mid-run (`swml-lab train --kill-box`), when ranks warned
    racks       RacksLab: racks of workers behind uplinks to a core, a tree of boxes or flat
    train_runs  `swml-lab train`: the lab (plain or racks), both runs, summary, PNG
The lab knows nothing of the benchmarks: `swml-lab demo` and `swml-lab vm`
run one in a lab (switchml_xdp/bench/lab_demo.py), never the other way round.
The same cluster in qemu VMs (`swml-lab vm`), apart from the above:
    vm_boot     the guest kernel, its initramfs (vm_init.sh), KVM or TCG
    vm_net      the VMs' bridge and multi-queue taps in a namespace of the run's own
    vm          VmLab: boots the VMs, runs the bench in them (vm_guest.sh), removes all
"""
from switchml_xdp.lab.addressing import Host
from switchml_xdp.lab.errors import LabError
from switchml_xdp.lab.lifecycle import cleanup_leftovers
from switchml_xdp.lab.namespace_lab import Lab

__all__ = ["Host", "Lab", "LabError", "cleanup_leftovers"]
