"""On the GPU machine: a PyTorch thread inside torch.cuda.synchronize()
behind a Triton kernel that spins on a host-pinned flag, entered before wedgeprobe arrives. A
CPU thread writes the flag after RELEASE_S seconds, so the GPU is never left wedged.

    python3 gpu/sync_wedge.py RELEASE_S
"""
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_wedge import wedge  # noqa: E402


def main():
    release_s = float(sys.argv[1]) if len(sys.argv) > 1 else 12.0
    wedge(release_s, "sync_wedge")
    print("sync_wedge: kernel launched, synchronizing", flush=True)
    t0 = time.monotonic()
    torch.cuda.synchronize()
    print(f"sync_wedge: synchronize returned after {time.monotonic() - t0:.2f} s", flush=True)


if __name__ == "__main__":
    main()
