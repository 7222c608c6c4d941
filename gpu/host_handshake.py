"""The boot deadlock of the design brief, on the GPU machine. Each process initialises CUDA,
runs one small kernel and its synchronize, then spins at 100% CPU in a host-side handshake
waiting for a peer's file that never comes (every peer waits for the others first). Nothing
runs on the GPU after that. Exits by itself at DEADLINE_S.

    python3 gpu/host_handshake.py RANK DIR DEADLINE_S [HEALTHY_S]

HEALTHY_S: first serve that long (a few launches every 20 ms, mostly idle), as a server that
hangs after hours of healthy work: the spin's duration then differs from the process's age.
"""
import os
import sys
import time

import torch


def wait_for_peers_ready(path, deadline):
    # The bug being reproduced: every rank waits for a peer's "ready" before writing its own.
    spins = 0
    while not os.path.exists(path):
        spins += 1
        if time.monotonic() > deadline:
            return spins
    return spins


def main():
    rank, d, deadline_s = int(sys.argv[1]), sys.argv[2], float(sys.argv[3])
    deadline = time.monotonic() + deadline_s
    healthy_s = float(sys.argv[4]) if len(sys.argv) > 4 else 0.0
    x = torch.ones(1024, device="cuda")
    x.mul_(2.0)
    torch.cuda.synchronize()
    t0 = time.monotonic()
    while time.monotonic() - t0 < healthy_s:
        for _ in range(4):
            x.mul_(1.0)
        torch.cuda.synchronize()
        time.sleep(0.02)
    print(f"rank {rank}: CUDA up, waiting for the peer", flush=True)
    spins = wait_for_peers_ready(os.path.join(d, f"ready.{1 - rank}"), deadline)
    print(f"rank {rank}: gave up after {spins} checks", flush=True)


if __name__ == "__main__":
    main()
