"""Builds the Cython extensions (prelude._fasttoken, kernels.cpu); all metadata lives in pyproject.toml."""
from glob import glob
from pathlib import Path

from Cython.Build import cythonize
from setuptools import Extension, setup

extensions = [
    Extension(
        "prelude._fasttoken." + Path(source).stem,
        [source],
        language="c++",
        include_dirs=["prelude/_fasttoken"],
        depends=sorted(glob("prelude/_fasttoken/*.hpp")),
        # -pthread: batch encode runs on a pool of std::threads (ft_pool.hpp)
        extra_compile_args=["-O3", "-std=c++17", "-pthread"],
        extra_link_args=["-pthread"],
    )
    for source in sorted(glob("prelude/_fasttoken/*.pyx"))
] + [
    Extension(
        "kernels.cpu." + Path(source).stem,
        [source],
        language="c++",
        include_dirs=["kernels/cpu"],
        depends=sorted(glob("kernels/cpu/*.hpp")),
        # -pthread: vocabulary ranges run on std::threads. No -march: the kernel carries one
        # clone per instruction set (target_clones) and picks at load time.
        extra_compile_args=["-O3", "-std=c++17", "-pthread"],
        extra_link_args=["-pthread"],
    )
    for source in sorted(glob("kernels/cpu/*.pyx"))
]

setup(
    ext_modules=cythonize(
        extensions,
        language_level=3,
        compiler_directives={"boundscheck": False, "wraparound": False, "cdivision": True},
    )
)
