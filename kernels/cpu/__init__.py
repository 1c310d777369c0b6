"""Native CPU kernels built with the project's Cython/C++ toolchain (setup.py), for the hot loops
where torch's CPU path is far from the machine's memory speed."""
# torch first: the extension's libgomp.so.1 must resolve to the one torch loaded, so that the
# kernels and torch's ops share one OpenMP team (parallel.hpp).
import torch  # noqa: F401
