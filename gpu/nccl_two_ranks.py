"""A real 2-rank NCCL job (one process per GPU). Rank 1 runs a Triton kernel that
spins on a host-pinned flag before the all-reduce; rank 0 enters the all-reduce and waits
there. A CPU thread of rank 1 sets the flag after RELEASE_S seconds, so both ranks finish.

    NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 \
        torchrun --nproc-per-node 2 gpu/nccl_two_ranks.py RELEASE_S
NVLink multicast stays off: those three variables, always.
"""
import os
import sys
import threading
import time

import torch
import torch.distributed as dist
# The spinning Triton kernel and its host-pointer wrapper are torch_wedge.py's (same folder).
from torch_wedge import HostPointer, spin_on_flag


def main():
    release_s = float(sys.argv[1]) if len(sys.argv) > 1 else 20.0
    rank = int(os.environ["RANK"])
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl")
    x = torch.ones(1 << 20, device="cuda")
    dist.all_reduce(x)  # warm-up: NCCL connected
    torch.cuda.synchronize()
    print(f"rank {rank} pid {os.getpid()} ready", file=sys.stderr, flush=True)
    if rank == 1:
        flag = torch.zeros(1, dtype=torch.int32).pin_memory()
        out = torch.zeros(1, dtype=torch.int32, device="cuda")

        def release():
            time.sleep(release_s)
            flag[0] = 1
            print("rank 1: released", file=sys.stderr, flush=True)

        threading.Thread(target=release, daemon=True).start()
        spin_on_flag[(1,)](HostPointer(flag), out)  # the culprit: stuck before the all-reduce
    dist.all_reduce(x)
    for _ in range(200):
        x.mul_(1.0)  # keep issuing small ops behind it
    torch.cuda.synchronize()
    print(f"rank {rank} done: {x[0].item()}", file=sys.stderr, flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
