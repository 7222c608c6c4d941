"""A never-wedged PyTorch serving process doing, in turns, what servers do between requests —
the shapes that made the daemon and `report` call healthy work trouble (issue: verdicts from
evidence). Nothing here ever waits on anything that does not end by itself; the long kernels
spin on a host-pinned flag that a CPU thread writes after a fixed time.

    python3 gpu/healthy_serve.py RUN_S

Phases, in a loop until RUN_S: eager decode; an idle gap; pure-Python tokenizing; building a
model on the CPU; a legitimate 3 s kernel then a synchronize; a 2.5 s kernel with 1,500 small
launches queued behind it; torch.compile (first turn) and its use; a checkpoint save/load;
CUDA-graph capture and 2 s of replays then a synchronize; first use of kernels not used yet.
Prints "phase NAME MONOTONIC_NS" as each begins, and "done TURNS" at the end (exit 0).
"""
import os
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

from torch_wedge import HostPointer, spin_on_flag  # noqa: E402


def phase(name):
    print(f"phase {name} {time.monotonic_ns()}", flush=True)


def long_kernel(seconds):
    """A kernel that runs `seconds` (spins until a CPU thread writes its flag)."""
    flag = torch.zeros(1, dtype=torch.int32).pin_memory()
    out = torch.zeros(1, dtype=torch.int32, device="cuda")

    def release():
        time.sleep(seconds)
        flag[0] = 1

    threading.Thread(target=release, daemon=True).start()
    spin_on_flag[(1,)](HostPointer(flag), out)
    return flag, out


def decode(w, x, seconds):
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        for _ in range(8):
            x = torch.tanh(x @ w)
        x.sum().item()  # read back each step, as a decode loop does
    return x


def tokenize(seconds):
    t0, n = time.monotonic(), 0
    text = "the quick brown fox jumps over the lazy dog " * 50
    while time.monotonic() - t0 < seconds:
        n += sum(len(tok) for tok in text.split())
    return n


LAZY_OPS = [
    lambda t: torch.sort(t)[0],
    lambda t: torch.fft.fft(t.to(torch.complex64)).real,
    lambda t: torch.cumsum(t, 0),
    lambda t: torch.topk(t, 5)[0],
    lambda t: torch.nn.functional.gelu(t),
    lambda t: torch.logsumexp(t, 0, keepdim=True),
    lambda t: torch.argsort(t).float(),
    lambda t: torch.special.erf(t),
]


def main():
    run_s = float(sys.argv[1])
    w = torch.randn(512, 512, device="cuda") / 23
    x = torch.randn(8, 512, device="cuda")
    small = torch.zeros(256, device="cuda")
    compiled = None
    t0, turn = time.monotonic(), 0
    print(f"ready {os.getpid()}", flush=True)
    while time.monotonic() - t0 < run_s:
        phase("decode")
        x = decode(w, x, 4)
        phase("idle")
        time.sleep(3)
        phase("tokenize")
        tokenize(6)
        phase("cpu_model")
        m = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(24)])
        m(torch.randn(64, 1024)).sum().item()
        phase("long_kernel_sync")
        long_kernel(3.0)
        torch.cuda.synchronize()
        phase("long_kernel_queue")
        long_kernel(2.5)
        for _ in range(1500):
            small.add_(1.0)
        torch.cuda.synchronize()
        phase("compile")
        if compiled is None:
            compiled = torch.compile(lambda a: torch.relu(a @ w) + 1.0)
        compiled(x).sum().item()
        phase("checkpoint")
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "ckpt.pt")
            torch.save({"w": w, "m": m.state_dict()}, path)
            w = torch.load(path, map_location="cuda")["w"]
        phase("graph")
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                y = torch.tanh(x @ w)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(50):
                y = torch.tanh(y @ w)
        g0 = time.monotonic()
        while time.monotonic() - g0 < 2.0:
            g.replay()
        torch.cuda.synchronize()
        del g
        phase("lazy")
        LAZY_OPS[turn % len(LAZY_OPS)](torch.randn(4096, device="cuda")).sum().item()
        turn += 1
    torch.cuda.synchronize()
    print(f"done {turn}", flush=True)


if __name__ == "__main__":
    main()
