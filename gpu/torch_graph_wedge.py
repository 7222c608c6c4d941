"""A PyTorch CUDA graph whose Triton kernel node spins (issue 30's report, as a new user met
it): a decode-like step of LAYERS small layers (matmul, bias, GELU, residual, norm: ~6 kernel
nodes a layer) captured with `torch.cuda.graph`, the Triton kernel `spin_on_flag` captured in
layer AT. Three healthy replays (the flag set: the spin returns at once), then the flag is
cleared and the graph replayed again: that replay sticks at the Triton node until a CPU thread
sets the flag after RELEASE_S seconds. Prints the output's checksum, to compare runs with and
without the shim.

    python3 gpu/torch_graph_wedge.py RELEASE_S [LAYERS] [AT]     (AT -1: no stuck replay)
"""
import sys
import threading
import time

import torch

from torch_wedge import HostPointer, spin_on_flag


def main():
    release_s = float(sys.argv[1]) if len(sys.argv) > 1 else 8.0
    layers = int(sys.argv[2]) if len(sys.argv) > 2 else 24
    at = int(sys.argv[3]) if len(sys.argv) > 3 else 11
    torch.manual_seed(0)
    dim = 512
    ws = [torch.randn(dim, dim, device="cuda") / dim ** 0.5 for _ in range(layers)]
    bs = [torch.randn(dim, device="cuda") for _ in range(layers)]
    x = torch.randn(8, dim, device="cuda")
    flag = torch.ones(1, dtype=torch.int32).pin_memory()
    seen = torch.zeros(1, dtype=torch.int32, device="cuda")

    def step(h):
        for i in range(layers):
            if i == at:
                spin_on_flag[(1,)](HostPointer(flag), seen)
            h = torch.nn.functional.layer_norm(h + torch.nn.functional.gelu(h @ ws[i] + bs[i]),
                                               (dim,))
        return h

    step(x)  # compiles the Triton kernel and warms the allocator before the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    static_x = x.clone()
    with torch.cuda.graph(g):
        static_out = step(static_x)
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    if at >= 0:
        flag[0] = 0

        def release():
            time.sleep(release_s)
            flag[0] = 1
            print("torch_graph_wedge: released", file=sys.stderr, flush=True)

        t = threading.Thread(target=release, daemon=True)
        t.start()
        print(f"torch_graph_wedge: replaying with layer {at}'s Triton node stuck for "
              f"{release_s:.0f} s", flush=True)
    g.replay()
    torch.cuda.synchronize()
    # Weighted by position: each row of a layer norm's output sums to ~0, so a plain sum would
    # compare nothing (it read 0.000001 in every run of 2026-12-07 15:55).
    out = static_out.double().flatten()
    weights = torch.arange(1, out.numel() + 1, device=out.device, dtype=torch.float64)
    print(f"torch_graph_wedge: output checksum {(out * weights).sum().item():.6f}", flush=True)


if __name__ == "__main__":
    main()
