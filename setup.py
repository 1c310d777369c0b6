"""Builds the Cython extensions (prelude._fasttoken, kernels.cpu), and an editable install's
bytecode; all metadata lives in pyproject.toml."""
import compileall
from glob import glob
from pathlib import Path

from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_py import build_py


def cython_extensions(package_dir: str) -> list[Extension]:
    """One C++17 extension per .pyx of the package, rebuilt when one of its headers or included
    binding files (.hpp, .pxd, .pxi) changes.
    -pthread: fasttoken's batch encode and the CPU kernels' row ranges run on std::threads. No
    -march: the kernels carry a baseline and an AVX2+FMA variant and pick one at run time."""
    return [
        Extension(
            package_dir.replace("/", ".") + "." + Path(source).stem,
            [source],
            language="c++",
            include_dirs=[package_dir],
            depends=sorted(glob(f"{package_dir}/*.hpp") + glob(f"{package_dir}/*.pxd")
                           + glob(f"{package_dir}/*.pxi")),
            extra_compile_args=["-O3", "-std=c++17", "-pthread"],
            extra_link_args=["-pthread"],
        )
        for source in sorted(glob(f"{package_dir}/*.pyx"))
    ]


class BuildPy(build_py):
    """An editable install also compiles the packages' modules to bytecode where they lie, as pip
    does for a regular install: a process that may not write bytecode (PYTHONDONTWRITEBYTECODE,
    set in many container images) otherwise compiles the hundred modules a server imports from
    source at every start, about 0.07 s of its startup on a small VM."""

    def run(self) -> None:
        super().run()
        if self.editable_mode:
            for package in self.packages:  # pyproject.toml's, subpackages included
                if "." not in package:  # a top-level one: compile_dir takes its subpackages too
                    compileall.compile_dir(str(Path(package).resolve()), quiet=1)


extensions = cython_extensions("prelude/_fasttoken") + cython_extensions("kernels/cpu")

setup(
    cmdclass={"build_py": BuildPy},
    ext_modules=cythonize(
        extensions,
        language_level=3,
        compiler_directives={"boundscheck": False, "wraparound": False, "cdivision": True},
    )
)
