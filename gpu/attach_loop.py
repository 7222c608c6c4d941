"""`wedgeprobe attach` on the GPU: a PyTorch process started *without* the shim, for `wedgeprobe attach`.
It warms up, prints "ready <pid>", keeps working for LOOP_S seconds (the attach happens then),
wedges, and keeps issuing work behind the wedge; a CPU thread releases the stuck kernel after
RELEASE_S seconds, so the GPU is never left wedged.

    python3 gpu/attach_loop.py eager LOOP_S RELEASE_S   # x.add_() launch loop, then the
                                                        # Triton spin_on_flag kernel
    python3 gpu/attach_loop.py graph LOOP_S RELEASE_S   # replays a graph captured before the
                                                        # attach, then captures (after it) a
                                                        # graph whose middle node spins

Prints the checksum of its work at the end, to compare with a run left alone.
"""
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

from torch_wedge import HostPointer, spin_on_flag  # noqa: E402


def release_after(flag, seconds):
    def go():
        time.sleep(seconds)
        flag[0] = 1
        print("attach_loop: released", file=sys.stderr, flush=True)

    threading.Thread(target=go, daemon=True).start()


def main():
    mode = sys.argv[1]
    loop_s = float(sys.argv[2])
    release_s = float(sys.argv[3])
    x = torch.zeros(1024, device="cuda")
    flag = torch.zeros(1, dtype=torch.int32).pin_memory()
    out = torch.zeros(1, dtype=torch.int32, device="cuda")
    # Warm-up: CUDA's initialisation, the Triton kernel's compilation and first launch (with
    # the flag already set, so it returns at once).
    flag[0] = 1
    spin_on_flag[(1,)](HostPointer(flag), out)
    before = None
    if mode == "graph":
        before = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                x.add_(1.0)
            torch.cuda.synchronize()
            with torch.cuda.graph(before, stream=s):
                for _ in range(10):
                    x.add_(1.0)
        torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    flag[0] = 0
    x.zero_()
    torch.cuda.synchronize()
    print(f"ready {os.getpid()}", flush=True)
    t0 = time.monotonic()
    n = 0
    while time.monotonic() - t0 < loop_s:
        if before is not None:
            before.replay()
            n += 10
        else:
            for _ in range(100):
                x.add_(1.0)
            n += 100
        if n % 1000 == 0:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    print(f"attach_loop: wedging after {n} ops", file=sys.stderr, flush=True)
    release_after(flag, release_s)
    if mode == "graph":
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            with torch.cuda.graph(g, stream=s):
                x.add_(1.0)
                spin_on_flag[(1,)](HostPointer(flag), out)
                x.add_(1.0)
        torch.cuda.current_stream().wait_stream(s)
        g.replay()
        n += 2
    else:
        spin_on_flag[(1,)](HostPointer(flag), out)
    for _ in range(2000):
        x.add_(1.0)  # blocks in the launch once the queue is full
    n += 2000
    torch.cuda.synchronize()
    total = x.sum().item()
    print(f"attach_loop: done; result {total:.1f} (expected {1024.0 * n:.1f}), flag {out.item()}",
          flush=True)


if __name__ == "__main__":
    main()
