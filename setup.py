"""Builds the Cython extensions of prelude._fasttoken; all metadata lives in pyproject.toml."""
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
]

setup(
    ext_modules=cythonize(
        extensions,
        language_level=3,
        compiler_directives={"boundscheck": False, "wraparound": False, "cdivision": True},
    )
)
