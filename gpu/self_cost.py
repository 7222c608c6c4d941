"""The shim's own cost on the serving model's eager decode, from the shim itself
(WEDGEPROBE_SHIM_MEASURE=self_cost prints at exit: ns per launch in the shim, marks per launch
and why, ns per mark). Builds the model, generates GENERATIONS times (128 tokens at batch 8,
each read back), exits; prints launches per decode step so the per-step share can be worked out.

    CUDA_INJECTION64_PATH=.../libcupti_shim.so WEDGEPROBE_SHIM_MEASURE=self_cost \\
        python3 gpu/self_cost.py [GENERATIONS]
"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import serve_bench as sb  # noqa: E402


def main():
    gens = int(sys.argv[1]) if len(sys.argv) > 1 else 4
    model, cfg = sb.build()
    prompt = torch.randint(0, cfg.vocab_size, (sb.BATCH, sb.PROMPT), device="cuda")
    sb.generate(model, prompt)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(gens):
        sb.generate(model, prompt)
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    steps = gens * sb.DECODE_TOKENS
    print(f"{gens} generations after one warm-up: {steps * sb.BATCH / dt:.0f} tok/s, "
          f"{dt / steps * 1e3:.2f} ms per decode step", flush=True)


if __name__ == "__main__":
    main()
