"""Builds the Cython extensions (prelude._fasttoken, kernels.cpu); all metadata lives in pyproject.toml."""
from glob import glob
from pathlib import Path

from Cython.Build import cythonize
from setuptools import Extension, setup


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


extensions = cython_extensions("prelude/_fasttoken") + cython_extensions("kernels/cpu")

setup(
    ext_modules=cythonize(
        extensions,
        language_level=3,
        compiler_directives={"boundscheck": False, "wraparound": False, "cdivision": True},
    )
)
