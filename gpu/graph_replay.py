"""A CUDA graph of NODES small kernels (`x.add_(1.0)`, captured by PyTorch) replayed back to
back: the shape of production decode, for trace completeness and for the soak that checks
nothing grows over 100M node executions. Its arithmetic is checked at the end.

    python3 gpu/graph_replay.py NODES (--seconds S | --executions N) [--log-every S]

--log-every S: print "progress MONOTONIC_NS REPLAYS RSS_KIB DEVICE_MIB" every S seconds
(REPLAYS counts replays the GPU finished: a synchronize every 10 replays).
Prints "replays R node_executions E result X expected Y rss_kib A..B device_mib C..D" and exits
0 only if X == Y.
"""
import argparse
import sys
import time

import torch


def rss_kib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def device_mib():
    free, total = torch.cuda.mem_get_info()
    return (total - free) >> 20


def main():
    p = argparse.ArgumentParser()
    p.add_argument("nodes", type=int)
    p.add_argument("--seconds", type=float)
    p.add_argument("--executions", type=int)
    p.add_argument("--log-every", type=float)
    a = p.parse_args()
    x = torch.zeros(64, dtype=torch.float64, device="cuda")  # exact past 2**24 adds
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            x.add_(1.0)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    warm = 3
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(a.nodes):
            x.add_(1.0)
    torch.cuda.synchronize()
    print("ready", flush=True)
    rss0, dev0 = rss_kib(), device_mib()
    rss_max, dev_max = rss0, dev0
    replays = 0
    t0 = time.monotonic()
    next_log = t0
    target = a.executions // a.nodes if a.executions else None
    while True:
        if target is not None and replays >= target:
            break
        if a.seconds is not None and time.monotonic() - t0 >= a.seconds:
            break
        for _ in range(10):
            g.replay()
        torch.cuda.synchronize()
        replays += 10
        if a.log_every and time.monotonic() >= next_log:
            rss_max, dev_max = max(rss_max, rss_kib()), max(dev_max, device_mib())
            print(f"progress {time.monotonic_ns()} {replays} {rss_kib()} {device_mib()}", flush=True)
            next_log += a.log_every
    torch.cuda.synchronize()
    rss_max, dev_max = max(rss_max, rss_kib()), max(dev_max, device_mib())
    result = x[0].item()
    expected = float(warm + replays * a.nodes)
    print(f"replays {replays} node_executions {replays * a.nodes} seconds "
          f"{time.monotonic() - t0:.1f} result {result:.1f} expected {expected:.1f} rss_kib "
          f"{rss0}..{rss_max} device_mib {dev0}..{dev_max}", flush=True)
    sys.exit(0 if result == expected else 1)


if __name__ == "__main__":
    main()
