"""Native CPU kernels (C++ through ctypes), built on first use; see native.py."""
