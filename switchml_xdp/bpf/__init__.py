"""The one door to the kernel: compiling and loading BPF (bcc), attaching XDP,
pins in bpffs, program statistics. Nothing else in switchml_xdp imports bcc or
touches bpffs or XDP attachment.

Importing this package needs neither bcc nor pyroute2; calls that need them
import them.

    prog = compile_program("swml_switch.c", "swml_switch", {"SWML_K": 256, ...})
    mode = attach("eth1", prog.fd)                    # native, else generic
    attachment("eth1")                                # Attachment(mode, prog_id)
    detach("eth1", prog_id=...)
    tc_attach("eth1", prog.load("f", "sched_cls"), "f")  # tc ingress (clsact, bpf filter)
    retval, frame_out, ns = prog_test_run(prog.fd, frame)  # BPF_PROG_TEST_RUN, no traffic
"""
from .bpffs import PIN_ROOT, ensure_bpffs, pin_dir, remove_pins
from .compile import Program, c_string, compile_program, compiler_missing
from .errors import BpfError, PinnedMapError, XdpError
from .pinned_map import PinnedMap
from .prog_test_run import prog_test_run
from .stats import prog_name, prog_stats, stats_enabled
from .tc import TC_PRIO, TcError, TcFilter, tc_attach, tc_attachment, tc_detach
from .xdp import Attachment, XdpLink, attach, attach_link, attachment, detach

__all__ = ["Attachment", "BpfError", "PIN_ROOT", "PinnedMap", "PinnedMapError", "Program",
           "XdpError", "XdpLink", "attach", "attach_link", "attachment", "c_string",
           "compile_program", "compiler_missing", "detach", "ensure_bpffs", "pin_dir", "prog_name",
           "prog_stats",
           "remove_pins", "stats_enabled", "TC_PRIO", "tc_attach", "tc_attachment", "tc_detach", "TcError",
           "TcFilter", "prog_test_run"]
