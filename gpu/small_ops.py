"""A PyTorch process doing small ops (`x.add_(1.0)`, a synchronize every 1,000) — the shapes a
pod gives a serving process: run it in a mount namespace with a full /dev/shm, fork a child
from it, trace it, attach to it. Its arithmetic is checked at the end.

    python3 gpu/small_ops.py RUN_S [--fork] [--wedge-at S --release-after S] [--log-every S]

--fork: once CUDA is in use, fork a child (no exec) that exits normally (`sys.exit`: atexit
        handlers run), as a server forks a helper; the parent goes on.
--wedge-at S: after S seconds, launch a Triton kernel that spins on a host-pinned flag (a CPU
        thread releases it after --release-after seconds) and keep issuing ops behind it.
--log-every S: print "progress MONOTONIC_NS OPS" every S seconds (for trace completeness).

Prints "ops N result R expected E" and exits 0 only if R == E.
"""
import argparse
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("run_s", type=float)
    p.add_argument("--fork", action="store_true")
    p.add_argument("--wedge-at", type=float)
    p.add_argument("--release-after", type=float, default=6.0)
    p.add_argument("--log-every", type=float)
    a = p.parse_args()
    x = torch.zeros(256, device="cuda")
    x.add_(1.0)
    torch.cuda.synchronize()
    ops = 1
    if a.fork:
        child = os.fork()
        if child == 0:
            sys.exit(0)  # a normal exit: the C atexit handlers (the shim's among them) run
        _, status = os.waitpid(child, 0)
        print(f"small_ops: forked child {child} exited with status {status}", flush=True)
    print(f"ready {os.getpid()}", flush=True)
    t0 = time.monotonic()
    next_log = t0
    wedged = False
    out = None
    while time.monotonic() - t0 < a.run_s:
        if a.wedge_at is not None and not wedged and time.monotonic() - t0 >= a.wedge_at:
            from torch_wedge import HostPointer, spin_on_flag

            flag = torch.zeros(1, dtype=torch.int32).pin_memory()
            out = torch.zeros(1, dtype=torch.int32, device="cuda")

            def release():
                time.sleep(a.release_after)
                flag[0] = 1

            threading.Thread(target=release, daemon=True).start()
            spin_on_flag[(1,)](HostPointer(flag), out)
            wedged = True
            print("small_ops: wedged", flush=True)
        for _ in range(1000):
            x.add_(1.0)
        ops += 1000
        torch.cuda.synchronize()
        if a.log_every and time.monotonic() >= next_log:
            print(f"progress {time.monotonic_ns()} {ops}", flush=True)
            next_log += a.log_every
    torch.cuda.synchronize()
    result = x[0].item()
    print(f"ops {ops} result {result:.1f} expected {float(ops):.1f}", flush=True)
    sys.exit(0 if result == float(ops) else 1)


if __name__ == "__main__":
    main()
