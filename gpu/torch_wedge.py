"""A PyTorch program whose Triton kernel spins on a host-pinned flag while the Python thread
keeps issuing torch ops (the shim's GPU check). A CPU thread sets the flag after RELEASE_S
seconds, so the GPU is never left wedged (and a killed process takes its context, and the
kernel, with it). Prints the result of the ops, to compare runs with and without the shim.

    python3 gpu/torch_wedge.py [RELEASE_S] [OPS]
"""
import sys
import threading
import time

import torch
import triton
import triton.language as tl


@triton.jit
def spin_on_flag(flag_ptr, out_ptr):
    # Spins until the host writes the flag (pinned memory is mapped into the GPU's address
    # space under UVA, so the host pointer works on the device).
    while tl.load(flag_ptr, volatile=True) == 0:
        pass
    tl.store(out_ptr, tl.load(flag_ptr, volatile=True))


class HostPointer:
    """What Triton needs of a pointer argument: data_ptr() and dtype."""

    def __init__(self, t):
        self.t = t
        self.dtype = t.dtype

    def data_ptr(self):
        return self.t.data_ptr()


def wedge(release_s, who):
    """Launches `spin_on_flag` on the current stream after one small op, with a CPU thread
    that releases it after `release_s` seconds. Returns (x, out): a 1024-float tensor that
    holds 1.0, and where the kernel writes the flag."""
    flag = torch.zeros(1, dtype=torch.int32).pin_memory()
    out = torch.zeros(1, dtype=torch.int32, device="cuda")
    x = torch.zeros(1024, device="cuda")
    x.add_(1.0)
    torch.cuda.synchronize()

    def release():
        time.sleep(release_s)
        flag[0] = 1
        print(f"{who}: released", file=sys.stderr, flush=True)

    threading.Thread(target=release, daemon=True).start()
    spin_on_flag[(1,)](HostPointer(flag), out)
    return x, out


def main():
    release_s = float(sys.argv[1]) if len(sys.argv) > 1 else 10.0
    ops = int(sys.argv[2]) if len(sys.argv) > 2 else 3000
    x, out = wedge(release_s, "torch_wedge")
    t0 = time.monotonic()  # the launch is asynchronous: this is when the kernel was queued
    print(f"torch_wedge: wedged, issuing {ops} ops", flush=True)
    for _ in range(ops):
        x.add_(1.0)  # blocks in the launch once the queue is full
    torch.cuda.synchronize()
    print(f"torch_wedge: done after {time.monotonic() - t0:.2f} s; result {x.sum().item():.1f} "
          f"(expected {1024.0 * (ops + 1):.1f}), flag {out.item()}", flush=True)


if __name__ == "__main__":
    main()
