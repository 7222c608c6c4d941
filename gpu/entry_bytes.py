"""The first bytes of libcuda's exported launch entry points, and whether cuGetProcAddress hands
out the same addresses (where a launch hook could sit). Prints one line per symbol."""
import ctypes

lib = ctypes.CDLL("libcuda.so.1")
lib.cuInit(0)
gpa = lib.cuGetProcAddress_v2
gpa.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, ctypes.c_uint64,
                ctypes.c_void_p]
NAMES = ["cuLaunchKernel", "cuLaunchKernel_ptsz", "cuLaunchKernelEx", "cuLaunchKernelEx_ptsz",
         "cuLaunchCooperativeKernel", "cuLaunchCooperativeKernel_ptsz", "cuGraphLaunch",
         "cuGraphLaunch_ptsz", "cuStreamWriteValue64_v2", "cuFuncGetName", "cuStreamGetId",
         "cuStreamGetCtx", "cuCtxGetCurrent", "cuKernelGetName", "cuLibraryGetKernel"]
for n in NAMES:
    try:
        addr = ctypes.cast(getattr(lib, n), ctypes.c_void_p).value
    except AttributeError:
        print(n, "not exported")
        continue
    got = {}
    for flags, tag in ((1, "legacy"), (2, "ptsz")):
        p = ctypes.c_void_p()
        st = ctypes.c_int()
        base = n.replace("_ptsz", "")
        r = gpa(base.encode(), ctypes.byref(p), 13000, flags, ctypes.byref(st))
        got[tag] = (r, hex(p.value or 0))
    print(n, hex(addr), ctypes.string_at(addr, 64).hex(), "gpa:", got)
