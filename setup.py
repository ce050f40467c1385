"""Build steps that pyproject.toml cannot declare.

- The BPF sources in xdp/ travel inside the package (switchml_xdp/_xdp/) so that an
  installed daemon can compile them at `swml-switch up`; an editable install reads
  them from the checkout.
- switchml_xdp/_layout.py, the headers' byte layouts as the C compiler reads
  them, is generated (switchml_xdp/layout_gen.py).
- The AF_XDP worker engine (worker/*.c) becomes the extension module
  switchml_xdp._engine, linked against libxdp and libbpf. Its headers are checked
  before compiling so that a missing library fails with the Debian package to
  install rather than a compiler error. SWML_SKIP_ENGINE=1 builds without it (the
  udp backend needs no C).
"""
import glob
import importlib.util
import os
import shutil
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

TOP = Path(__file__).resolve().parent
INCLUDE_DIRS = ["/usr/include", "/usr/local/include"]
LIB_GLOBS = ["/usr/lib/*/lib{0}.so", "/usr/lib/lib{0}.so", "/usr/lib64/lib{0}.so",
             "/usr/local/lib/lib{0}.so", "/usr/local/lib/*/lib{0}.so"]
# (header, library, Debian package) the engine needs.
ENGINE_DEPS = [("xdp/xsk.h", "xdp", "libxdp-dev"), ("bpf/libbpf.h", "bpf", "libbpf-dev")]


class BuildPyWithBpfSources(build_py):
    def run(self):
        super().run()
        dest = Path(self.build_lib) / "switchml_xdp" / "_xdp"
        dest.mkdir(parents=True, exist_ok=True)
        for src in sorted((TOP / "xdp").rglob("*.[ch]")):  # xdp/lab/ too
            target = dest / src.relative_to(TOP / "xdp")
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, target)
        # The byte layouts of the headers, as the C compiler reads them (layout_gen.py).
        pkg = TOP / "switchml_xdp" if self.editable_mode else Path(self.build_lib) / "switchml_xdp"
        _layout_gen().write(TOP, pkg / "_layout.py")


def _layout_gen():
    """switchml_xdp/layout_gen.py, imported by path: the package is not built yet."""
    spec = importlib.util.spec_from_file_location("layout_gen", TOP / "switchml_xdp" / "layout_gen.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def missing_engine_deps() -> list[str]:
    """What is missing to build the engine, as 'header/lib (Debian package)' strings."""
    missing = []
    for header, lib, pkg in ENGINE_DEPS:
        have_header = any(os.path.exists(os.path.join(d, header)) for d in INCLUDE_DIRS)
        have_lib = any(glob.glob(g.format(lib)) for g in LIB_GLOBS)
        if not have_header or not have_lib:
            what = " and ".join(w for w, ok in ((header, have_header), (f"lib{lib}.so", have_lib)) if not ok)
            missing.append(f"{what} (Debian package {pkg})")
    return missing


class BuildEngine(build_ext):
    def run(self):
        missing = missing_engine_deps()
        if missing:
            sys.exit("switchml-xdp: cannot build the AF_XDP worker engine (switchml_xdp._engine): "
                     f"missing {'; '.join(missing)}.\n"
                     f"  Install: apt-get install {' '.join(p for _, _, p in ENGINE_DEPS)}\n"
                     "  (or set SWML_SKIP_ENGINE=1 to install without it: udp backend only)")
        super().run()


engine = Extension(
    "switchml_xdp._engine",
    sources=sorted(str(p.relative_to(TOP)) for p in (TOP / "worker").glob("*.c")),
    depends=sorted(str(p.relative_to(TOP)) for p in [*(TOP / "worker").glob("*.h"),
                                                      TOP / "xdp" / "swml_wire.h",
                                                      TOP / "xdp" / "swml_auth.h"]),
    include_dirs=["worker", "xdp"],
    libraries=["xdp", "bpf"],
    extra_compile_args=["-O3", "-std=gnu11", "-Wall", "-Wno-unused-function",
                        "-fno-strict-aliasing",
                        # window.c must do the same double arithmetic as window.py
                        "-ffp-contract=off"],
)

setup(cmdclass={"build_py": BuildPyWithBpfSources, "build_ext": BuildEngine},
      ext_modules=[] if os.environ.get("SWML_SKIP_ENGINE") == "1" else [engine])
