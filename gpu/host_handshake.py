"""Issue 13, item 1 on the GPU machine: the boot deadlock of the design brief. Each process
initialises CUDA, runs one small kernel and its synchronize, then spins at 100% CPU in a
host-side handshake waiting for a peer's file that never comes (every peer waits for the
others first). Nothing runs on the GPU after the first kernel. Exits by itself at DEADLINE_S.

    python3 gpu/host_handshake.py RANK DIR DEADLINE_S
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
    x = torch.ones(1024, device="cuda")
    x.mul_(2.0)
    torch.cuda.synchronize()
    print(f"rank {rank}: CUDA up, waiting for the peer", flush=True)
    spins = wait_for_peers_ready(os.path.join(d, f"ready.{1 - rank}"), deadline)
    print(f"rank {rank}: gave up after {spins} checks", flush=True)


if __name__ == "__main__":
    main()
