"""Native CPU kernels built with the project's Cython/C++ toolchain (setup.py), for the hot loops
where torch's CPU path is far from the machine's memory speed."""
