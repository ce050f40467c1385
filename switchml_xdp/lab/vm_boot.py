"""What a lab VM boots, and with which accelerator.

The guest runs Debian's own kernel (linux-image-*-amd64, installed on the host
by `scripts/setup.sh --vm`) and the host's root file system, shared read-only
over virtio-9p: no disk image, nothing downloaded, the project as installed
here. Debian builds virtio-pci and 9p as modules, so the kernel needs them
before it can mount that root: a small initramfs made here holds a static
busybox, those modules (resolved through the kernel's own modules.dep) and
vm_init.sh, which loads them, mounts the host's root and hands over to
vm_guest.sh on it. Every other module (virtio_net, ...) then comes from the
host's /lib/modules/<version>, which the guest sees through the share.

KVM: /dev/kvm may open and yet guests never run (nested virtualisation that
hangs, or a CPU model KVM refuses). `choose_accel` boots the kernel once with
the initramfs told to power off at once; no "probe ok" on the console within
a few seconds means TCG.
"""
from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

QEMU = "qemu-system-x86_64"
BUSYBOX = Path("/bin/busybox")       # Debian's busybox-static: no libraries needed
BOOT_DIR = Path("/boot")
MODULES_DIR = Path("/lib/modules")
# What vm_init.sh needs to mount the host's root; their dependencies come along.
INITRAMFS_MODULES = ("virtio_pci", "9pnet_virtio", "9p")
INIT_SCRIPT = Path(__file__).with_name("vm_init.sh")
PROBE_OK = "swml-probe-ok"           # vm_init.sh prints it when booted with swml.probe=1
PROBE_TIMEOUT_S = 15.0               # KVM boots to it in about a second; TCG in ~8 s


class VmBootError(RuntimeError):
    pass


@dataclasses.dataclass(frozen=True)
class GuestKernel:
    version: str
    image: Path

    @property
    def modules(self) -> Path:
        return MODULES_DIR / self.version


def _version_key(kernel: GuestKernel) -> list:
    """Kernel versions in numeric order: 6.10 after 6.9."""
    return [int(n) if n.isdigit() else n for n in re.split(r"(\d+)", kernel.version)]


def find_guest_kernel() -> GuestKernel | None:
    """The newest Debian amd64 kernel in /boot whose modules are installed."""
    found = []
    for image in BOOT_DIR.glob("vmlinuz-*-amd64"):
        version = image.name.removeprefix("vmlinuz-")
        if (MODULES_DIR / version / "modules.dep").exists():
            found.append(GuestKernel(version, image))
    return max(found, key=_version_key, default=None)


def missing() -> str | None:
    """Why this machine cannot boot lab VMs, or None."""
    if os.geteuid() != 0:
        return "needs root (taps, bridges, network namespaces)"
    if shutil.which(QEMU) is None:
        return f"{QEMU} is not installed (scripts/setup.sh --vm installs qemu-system-x86)"
    if find_guest_kernel() is None:
        return ("no Debian guest kernel (/boot/vmlinuz-*-amd64 with its modules; "
                "scripts/setup.sh --vm installs linux-image-amd64)")
    if not BUSYBOX.exists() or _dynamically_linked(BUSYBOX):
        return f"no static busybox at {BUSYBOX} (scripts/setup.sh --vm installs busybox-static)"
    if shutil.which("cpio") is None:
        return "cpio is not installed"
    if not Path("/dev/net/tun").exists():
        return "no /dev/net/tun (taps)"
    return None


def _dynamically_linked(path: Path) -> bool:
    """An ELF with a program interpreter needs a dynamic loader the initramfs lacks."""
    with open(path, "rb") as f:
        return b"/ld-linux" in f.read(8192)


def module_closure(kernel: GuestKernel, names: tuple[str, ...]) -> list[Path]:
    """The modules `names` and their dependencies, relative to the kernel's
    module dir, each after everything it needs (insmod order)."""
    deps: dict[str, list[str]] = {}
    by_name: dict[str, str] = {}
    for line in (kernel.modules / "modules.dep").read_text().splitlines():
        path, _, rest = line.partition(":")
        deps[path] = rest.split()
        by_name[Path(path).name.split(".ko")[0].replace("-", "_")] = path
    order: list[str] = []

    def visit(path: str) -> None:
        if path in order:
            return
        for dep in deps.get(path, []):
            visit(dep)
        order.append(path)

    for name in names:
        if name not in by_name:
            raise VmBootError(f"kernel {kernel.version} has no module {name}")
        visit(by_name[name])
    return [Path(p) for p in order]


def build_initramfs(kernel: GuestKernel, dest: Path) -> Path:
    """Write the initramfs (newc cpio) for `kernel` to `dest`."""
    with tempfile.TemporaryDirectory(prefix="swml-initramfs-") as tmp:
        root = Path(tmp)
        (root / "bin").mkdir()
        shutil.copy2(BUSYBOX, root / "bin" / "busybox")
        shutil.copy2(INIT_SCRIPT, root / "init")
        (root / "init").chmod(0o755)
        (root / "modules").mkdir()
        names = []
        for rel in module_closure(kernel, INITRAMFS_MODULES):
            shutil.copy2(kernel.modules / rel, root / "modules" / rel.name)
            names.append(rel.name)
        (root / "modules" / "order").write_text("\n".join(names) + "\n")
        files = sorted(str(p.relative_to(root)) for p in root.rglob("*"))
        with open(dest, "wb") as out:
            subprocess.run(["cpio", "-o", "-H", "newc", "--quiet"], cwd=root, check=True,
                           input="\n".join(files).encode(), stdout=out)
    return dest


def accel_argv(accel: str) -> list[str]:
    """qemu options for 'kvm' or 'tcg' (TCG with one host thread per vCPU)."""
    if accel == "kvm":
        return ["-accel", "kvm", "-cpu", "host"]
    return ["-accel", "tcg,thread=multi", "-cpu", "max"]


def boot_argv(kernel: GuestKernel, initramfs: Path, accel: str, cmdline: str, memory_mb: int,
              cpus: int) -> list[str]:
    """A headless qemu with no default devices booting `kernel` directly."""
    return [QEMU, *accel_argv(accel), "-m", str(memory_mb), "-smp", str(cpus),
            "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
            "-kernel", str(kernel.image), "-initrd", str(initramfs),
            "-append", f"console=ttyS0 panic=-1 {cmdline}"]


def choose_accel(kernel: GuestKernel, initramfs: Path, wanted: str = "auto",
                 timeout: float = PROBE_TIMEOUT_S) -> tuple[str, str]:
    """("kvm" | "tcg", why). 'auto' probes KVM with a boot that powers off at once."""
    if wanted in ("kvm", "tcg"):
        return wanted, "asked for"
    try:
        fd = os.open("/dev/kvm", os.O_RDWR)
        os.close(fd)
    except OSError as e:
        return "tcg", f"/dev/kvm: {e.strerror}"
    argv = boot_argv(kernel, initramfs, "kvm", "quiet swml.probe=1", 128, 1)
    t0 = time.monotonic()
    proc = subprocess.Popen([*argv, "-serial", "stdio"], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return "tcg", f"a KVM guest did not boot within {timeout:g} s"
    if PROBE_OK in out:
        return "kvm", f"a KVM guest booted in {time.monotonic() - t0:.1f} s"
    last = next((line for line in reversed(out.splitlines()) if line.strip()), "no output")
    return "tcg", f"KVM failed: {last.strip()}"
