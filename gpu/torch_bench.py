"""The shim's benchmark workload: a launch-bound PyTorch loop (one tiny kernel per op, no
graphs) and the same ops replayed as a CUDA graph. Prints one JSON line with the wall time
per kernel of each, so gpu/bench_torch.sh can compare sides (baseline, shim, shim + eBPF,
torch.profiler) interleaved across rounds.

    python3 gpu/torch_bench.py SECONDS_PER_MODE [profiler]
If WP_GO is set, waits (after CUDA is initialised) until that file exists: the driver attaches
wedgeprobe in between.
"""
import contextlib
import json
import os
import sys
import time

import torch


def eager(x, seconds):
    n = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(1000):
            x.add_(1.0)
        torch.cuda.synchronize()  # the queue never fills: launch-bound, not queue-bound
        n += 1000
    return (time.perf_counter() - t0) / n


def capture_adds(x):
    """`x.add_(1.0)` 100 times, captured as one CUDA graph (warmed up on a side stream)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            x.add_(1.0)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(100):
            x.add_(1.0)
    return g


def graphed(x, seconds):
    g = capture_adds(x)
    n = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(10):
            g.replay()
        torch.cuda.synchronize()
        n += 1000
    return (time.perf_counter() - t0) / n


def main():
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 3.0
    profile = len(sys.argv) > 2 and sys.argv[2] == "profiler"
    x = torch.zeros(256, device="cuda")
    for _ in range(2000):
        x.add_(1.0)
    torch.cuda.synchronize()
    go = os.environ.get("WP_GO")
    if go:
        print("ready", flush=True)
        while not os.path.exists(go):
            time.sleep(0.05)
    ctx = contextlib.nullcontext()
    if profile:
        from torch.profiler import ProfilerActivity, profile as prof
        ctx = prof(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
    with ctx:
        e = eager(x, seconds)
        g = graphed(x, seconds)
    print(json.dumps({"eager_ns_per_kernel": e * 1e9, "graph_ns_per_kernel": g * 1e9}),
          flush=True)


if __name__ == "__main__":
    main()
