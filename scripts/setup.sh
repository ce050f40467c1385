#!/usr/bin/env bash
# One-shot, idempotent set-up of a Debian 12 machine (as root) for switchml-xdp:
# Debian packages (bcc, kernel headers, libxdp/libbpf, iproute2, bpftool), a
# virtual environment that sees Debian's bcc, and the package installed into it.
# Running it twice is harmless: every step checks before it acts.
# --vm: also what `swml-lab vm` needs (make vm-demo, make vm-test): qemu, Debian's
# kernel for the guests, a static busybox for their initramfs.
# --torch: also PyTorch (the package's [torch] extra), for what uses it: the tests
# (make test), `swml-lab train` and the Gloo peer of `swml-lab bench` (make
# bench-lab). The switch, the workers and `make demo` do not need it.
set -euo pipefail
vm=0 torch=0
for arg in "$@"; do
  case $arg in
    --vm) vm=1 ;;
    --torch) torch=1 ;;
    *) echo "usage: $0 [--vm] [--torch]" >&2; exit 2 ;;
  esac
done

top=$(cd "$(dirname "$0")/.." && pwd)
venv=${SWML_VENV:-$top/.venv}
say() { printf 'setup: %s\n' "$*"; }
warn() { printf 'setup: WARNING: %s\n' "$*" >&2; }

[ "$(id -u)" = 0 ] || { echo "setup: must run as root (netns, XDP, apt-get)" >&2; exit 1; }

# --- Debian packages -------------------------------------------------------
# python3-bpfcc: bcc's Python bindings (the PyPI "bcc" is an unrelated package).
# libxdp-dev/libbpf-dev: the worker's AF_XDP engine. clang/llvm: bcc's compiler.
pkgs=(python3-bpfcc bpfcc-tools libbpfcc-dev linux-headers-amd64 libxdp-dev libbpf-dev
      bpftool clang llvm iproute2 util-linux python3-venv python3-dev python3-numpy
      python3-pyroute2 gcc make pkg-config ethtool tcpdump iputils-ping
      python3-sklearn python3-matplotlib python3-psutil
      ruby shellcheck  # ruby, shellcheck: the tests check vagrant/ (ruby -c, shellcheck)
      clang-format)  # the unit tier checks the C style (tests/unit/test_style.py)
# The VM lab's guests boot linux-image-amd64 (not this machine's kernel) with this
# machine's root over 9p; its headers are linux-headers-amd64's, installed above.
if [ "$vm" = 1 ]; then pkgs+=(qemu-system-x86 linux-image-amd64 busybox-static cpio); fi
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  say "installing Debian packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  say "Debian packages present"
fi

# --- kernel headers for bcc ------------------------------------------------
# bcc compiles against /lib/modules/$(uname -r)/build. Where this kernel ships no
# headers (VMs with custom kernels), Debian's generic amd64 headers compile XDP
# programs fine: link them in as this kernel's build/source trees.
kver=$(uname -r)
moddir=/lib/modules/$kver
if [ ! -e "$moddir/build/include" ]; then
  hdr=$(ls -d /usr/src/linux-headers-*-amd64 2>/dev/null | sort -V | tail -n 1)
  common=$(ls -d /usr/src/linux-headers-*-common 2>/dev/null | sort -V | tail -n 1)
  [ -n "$hdr" ] && [ -n "$common" ] || { echo "setup: no linux-headers-*-amd64 under /usr/src" >&2; exit 1; }
  warn "no kernel headers for $kver; linking Debian's $(basename "$hdr") as its build tree"
  mkdir -p "$moddir"
  ln -sfn "$hdr" "$moddir/build"
  ln -sfn "$common" "$moddir/source"
fi

# --- bpffs -----------------------------------------------------------------
mountpoint -q /sys/fs/bpf || { say "mounting bpffs at /sys/fs/bpf"; mount -t bpf bpf /sys/fs/bpf; }

# --- virtual environment ---------------------------------------------------
# Made from Debian's python3 with system site-packages so that `import bcc` works.
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import bcc' 2>/dev/null; then
  say "creating virtual environment $venv"
  rm -rf "$venv"
  /usr/bin/python3 -m venv --system-site-packages "$venv"
fi
stamp="$venv/.swml-installed"
# Only sources count: the __pycache__/ that any import writes and the engine (.so)
# that the install itself builds in the tree must not make the next run reinstall.
newest=$(find "$top/pyproject.toml" "$top/setup.py" "$top/worker" "$top/switchml_xdp" "$top/xdp" \
  -type f \( -name '*.py' -o -name '*.c' -o -name '*.h' -o -name '*.toml' \) \
  -newer "$stamp" -print -quit 2>/dev/null || true)
extras="test"
need_torch=''
if [ "$torch" = 1 ]; then
  extras="test,torch"
  "$venv/bin/python" -c 'import torch' 2>/dev/null || need_torch=1
fi
if [ ! -f "$stamp" ] || [ -n "$newest" ] || [ -n "$need_torch" ]; then
  say "installing switchml-xdp${need_torch:+ and torch} into $venv"
  # [torch] pins torch==2.13.0: here pip finds a local CPU build; elsewhere a plain
  # `pip install torch` pulls a CUDA build of GBs (README: the CPU index for hosts
  # without a GPU). A venv that has torch keeps it when a later run lacks --torch.
  # sklearn/matplotlib come from Debian (PyPI's would replace Debian's numpy).
  "$venv/bin/pip" install -q --disable-pip-version-check -e "${top}[${extras}]"
  touch "$stamp"
else
  say "switchml-xdp already installed in $venv"
fi
say "ready: $venv/bin/swml-switch, swml-worker, swml-lab"
