"""A Python "serving loop" on the simulated driver (ctypes): it launches a kernel that never
completes, then keeps launching in decode_step() until the launch blocks on the full queue —
so the report must show decode_step / serve_forever as the Python frames behind
cuLaunchKernel.   python3 py_launcher.py LIBCUDA

With `handshake` after LIBCUDA it is instead a rank of the boot deadlock:
CUDA initialised, then spinning at 100% CPU in wait_for_peers_ready() for a peer's file that
never comes, until DEADLINE_S (default 20) after its start.
    python3 py_launcher.py LIBCUDA handshake [S]
(PY_HEALTHY_BEFORE_S, PY_SPIN_WHEN, PY_SPIN_MARK: serving first, see the mode.)
With `build` it is a process building its model instead: CUDA initialised, then CPU work at
100% for S seconds that moves through functions (busy, not spinning: not a host stall)."""
import ctypes
import os
import sys
import time

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


def wait_for_peers_ready(path, deadline):
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            return


def init_attention(n):
    return sum(i * i for i in range(n))


def init_mlp(n):
    return sum(i ^ 7 for i in range(n))


def init_norm(n):
    return max(i % 13 for i in range(n))


def build_model(deadline):
    # Each step is one function for 0.06-0.15 s (measured on the 2-core dev machine), like
    # initialising a layer's weights. Spinning needs the same stack for 0.8 s
    # (host_stall::SPIN_CONFIRM_NS): steps of 4-8 M iterations took 0.3-0.6 s here and, on a
    # loaded CI machine, one passed 0.8 s and was called a stall; 5x headroom now.
    steps = [init_attention, init_mlp, init_norm]
    i = 0
    while time.monotonic() < deadline:
        steps[i % 3](1_000_000 * (1 + i % 2))
        i += 1


if len(sys.argv) > 2 and sys.argv[2] == "build":
    cuda.cuInit(0)
    build_model(time.monotonic() + (float(sys.argv[3]) if len(sys.argv) > 3 else 20.0))
elif len(sys.argv) > 2 and sys.argv[2] == "handshake":
    start = time.monotonic()
    cuda.cuInit(0)
    limit = float(sys.argv[3]) if len(sys.argv) > 3 else 20.0
    # PY_SLEEP_FIRST_S: the rank idles first (its whole life then averages under 80% of a core).
    time.sleep(float(os.environ.get("PY_SLEEP_FIRST_S", "0")))
    # PY_HEALTHY_BEFORE_S: light serving first (a launch and its synchronize every 20 ms);
    # PY_SPIN_WHEN=FILE: serve so until FILE exists; PY_SPIN_MARK=FILE: made as the spin begins.
    healthy = float(os.environ.get("PY_HEALTHY_BEFORE_S", "0"))
    when = os.environ.get("PY_SPIN_WHEN")
    if healthy > 0 or when:
        stream = ctypes.c_void_p()
        cuda.cuStreamCreate(ctypes.byref(stream), 0)
        fn = ctypes.c_void_p()
        cuda.cuModuleGetFunction(ctypes.byref(fn), None, b"_Z13decode_kernelPKfPfi")
        while time.monotonic() - start < healthy or (
            when and not os.path.exists(when) and time.monotonic() - start < limit
        ):
            cuda.cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, stream, None, None)
            cuda.cuStreamSynchronize(stream)
            time.sleep(0.02)
    if os.environ.get("PY_SPIN_MARK"):
        open(os.environ["PY_SPIN_MARK"], "w").close()
    wait_for_peers_ready("/nonexistent/ready.peer", start + limit)
else:
    serve_forever()
