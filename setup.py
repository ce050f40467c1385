"""Build steps that pyproject.toml cannot declare.

- The BPF sources in xdp/ travel inside the package (switchml_xdp/_xdp/) so that an
  installed daemon can compile them at `swml-switch up`; an editable install reads
  them from the checkout.
"""
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

TOP = Path(__file__).resolve().parent


class BuildPyWithBpfSources(build_py):
    def run(self):
        super().run()
        dest = Path(self.build_lib) / "switchml_xdp" / "_xdp"
        dest.mkdir(parents=True, exist_ok=True)
        for src in sorted((TOP / "xdp").glob("*.[ch]")):
            shutil.copy2(src, dest / src.name)


setup(cmdclass={"build_py": BuildPyWithBpfSources})
