"""A Python "serving loop" on the simulated driver (ctypes): it launches a kernel that never
completes, then keeps launching in decode_step() until the launch blocks on the full queue —
so the report must show decode_step / serve_forever as the Python frames behind
cuLaunchKernel.   python3 py_launcher.py LIBCUDA"""
import ctypes
import sys

cuda = ctypes.CDLL(sys.argv[1])
u = ctypes.c_uint
cuda.cuLaunchKernel.argtypes = [ctypes.c_void_p, u, u, u, u, u, u, u, ctypes.c_void_p,
                                ctypes.c_void_p, ctypes.c_void_p]


def decode_step(fn, stream):
    for _ in range(2000):
        cuda.cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, stream, None, None)


def serve_forever():
    cuda.cuInit(0)
    stream = ctypes.c_void_p()
    cuda.cuStreamCreate(ctypes.byref(stream), 0)
    wedge = ctypes.c_void_p()
    cuda.cuModuleGetFunction(ctypes.byref(wedge), None, b"_Z17attn_wedge_kernelP7barrierPf")
    decode_step(wedge, stream)


serve_forever()
