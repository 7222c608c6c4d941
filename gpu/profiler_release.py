"""The shim gives CUPTI back so torch.profiler can trace (one CUPTI subscriber per
process before CUDA 13.3). Prints how many GPU kernel events torch.profiler recorded.

    python3 gpu/profiler_release.py none|ctypes|external
none: the shim keeps CUPTI; ctypes: the process calls wedgeprobe_shim_release() itself;
external: it waits for the file in WP_GO while `wedgeprobe release --pid` is run from outside.
"""
import ctypes
import json
import os
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

mode = sys.argv[1]
x = torch.zeros(256, device="cuda")
x.add_(1.0)
torch.cuda.synchronize()
if mode == "ctypes":
    shim = ctypes.CDLL(os.environ["CUDA_INJECTION64_PATH"])
    print("wedgeprobe_shim_release() ->", shim.wedgeprobe_shim_release(), flush=True)
elif mode == "external":
    print("ready", flush=True)
    while not os.path.exists(os.environ["WP_GO"]):
        time.sleep(0.05)
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
    for _ in range(100):
        x.add_(1.0)
    torch.cuda.synchronize()
gpu = [e for e in p.events() if e.device_type == torch.autograd.DeviceType.CUDA]
print(json.dumps({"mode": mode, "gpu_kernel_events": len(gpu), "result": x.sum().item(),
                  "expected": 256 * 101.0}), flush=True)
