"""One of many light serving processes on a node, for the daemon's own price at N processes
(issue 34): a PyTorch loop that launches 200 small ops, synchronizes and sleeps 5 ms — a
server between busy moments, not a launch-bound loop — with 40 idle threads beside it (a
serving process has dozens: tokenizer pools, HTTP workers), for SECONDS.

    python3 gpu/node_serve.py SECONDS
Prints "ready" once CUDA is up, "done N" at the end (exit 0); ends early once the file
$WP_STOP exists.
"""
import os
import sys
import threading
import time

import torch


def main():
    secs = float(sys.argv[1])
    stop = threading.Event()
    idle = [threading.Thread(target=stop.wait, daemon=True) for _ in range(40)]
    for t in idle:
        t.start()
    x = torch.zeros(1024, device="cuda")
    torch.cuda.synchronize()
    print("ready", flush=True)
    n, t0 = 0, time.monotonic()
    stop_file = os.environ.get("WP_STOP", "")
    while time.monotonic() - t0 < secs and not (stop_file and os.path.exists(stop_file)):
        for _ in range(200):
            x.add_(1.0)
        torch.cuda.synchronize()
        n += 200
        time.sleep(0.005)
    stop.set()
    ok = int(x[0].item()) == n
    print(f"done {n} {'ok' if ok else 'WRONG'}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
