"""The shim's recording cost inside one process, switched on and off between single
decode steps (`wedgeprobe_shim_measure_pass`, enabled by WEDGEPROBE_SHIM_MEASURE=toggle).

Why steps: on the H200 VM one process's eager speed moved ±20% between turns a second long
(2026-12-01, process-level turns), so turn-level pairs could not resolve a 2% cost. A decode step
is ~12 ms; pairing each step with its neighbour in the other state cancels whatever drifts
slower than that. Each pair runs its two states in a random order.

    CUDA_INJECTION64_PATH=.../libcupti_shim.so WEDGEPROBE_SHIM_MEASURE=toggle \\
        python3 gpu/step_ab.py [GENERATIONS] [GRAPH_PAIRS] [LOOP_PAIRS]

Without the toggle (no shim, or the switch off) both states are the same: that run's figure
is the method's own bias and noise. What it does not price: the hooks' detour while off (a
jump and a flag test; gpu/hook_cost.sh), and the flush thread's polls (they run in both
states; the shim's self_cost line prices them).

AB_ONLY=graph_marks: only the replay price of graph marks (`graph_marks`).
AB_RAW=PATH: also writes every pair's ratio, by workload, to PATH as JSON (the harness pools
several processes' pairs: `mark-cadence`).

Prints, per workload, the paired cost (+ = slower with recording): median of the per-pair
ratios, their mean with a 95% interval, and the pair count.
"""
import ctypes
import math
import os
import random
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torch  # noqa: E402

import serve_bench as sb  # noqa: E402
from torch_bench import capture_adds  # noqa: E402


def switch():
    path = os.environ.get("CUDA_INJECTION64_PATH")
    if not path or "toggle" not in os.environ.get("WEDGEPROBE_SHIM_MEASURE", ""):
        return lambda _off: None
    f = ctypes.CDLL(path).wedgeprobe_shim_measure_pass
    f.argtypes, f.restype = [ctypes.c_int], ctypes.c_int
    if f(0) != 0:
        sys.exit("step_ab: the shim's toggle is not enabled")
    return lambda off: f(int(off))


def graph_marks_switch():
    """The shim's graph-marks switch (kernels a mark covers in graphs instantiated from now;
    0: none), or None without the shim and its toggle."""
    path = os.environ.get("CUDA_INJECTION64_PATH")
    if not path or "toggle" not in os.environ.get("WEDGEPROBE_SHIM_MEASURE", ""):
        return None
    f = ctypes.CDLL(path).wedgeprobe_shim_graph_marks
    f.argtypes, f.restype = [ctypes.c_int], ctypes.c_int
    return f if f(4) >= 0 else None


def graph_marks(model, cfg, x, graph_pairs, loop_pairs, rng):
    """The replay price of graph marks: the decode graph and the 100-add loop graph captured
    twice — without marks and with them (the default, a mark every 4th kernel node) — and
    replayed in neighbouring pairs ("off" replays the unmarked one)."""
    gm = graph_marks_switch()
    if gm is None:
        print("graph marks: no switch (the shim with WEDGEPROBE_SHIM_MEASURE=toggle)")
        return
    # The switch's value: kernels a mark covers | 8192 (event-record leaves: their price
    # only), as marks::graph::SHAPE_*.
    # "bias": a second unmarked capture — two captures of one graph differ by themselves
    # (placement), which bounds what a small figure says.
    variants = {4: "", 8: " (every 8th)", 4 | 8192: " (event-record leaves, price only)",
                "bias": " (bias: a second capture, unmarked)"}
    if os.environ.get("GRAPH_MARK_VARIANTS") == "events":
        # 16384: event-record nodes in the chain (marks::graph::SHAPE_EVENT_IN_CHAIN).
        variants = {4: "", 4 | 16384: " (events in the chain, every 4th)",
                    1 | 16384: " (events in the chain, every kernel)",
                    "bias": " (bias: a second capture, unmarked)"}
    graphs = {}
    for code in (0, *variants):
        gm(0 if code == "bias" else code)
        g, _, ids = sb.graph_step(model, cfg)
        graphs[code] = (g, ids, capture_adds(x))
    gm(4)
    for _ in range(20):
        for g in graphs.values():
            g[0].replay()
            g[2].replay()
    torch.cuda.synchronize()
    for code, what in variants.items():
        pick = {}

        def set_off(off, code=code):
            pick["g"] = graphs[0 if off else code]

        set_off(False)
        summary(f"marks{what}: decode graph x4",
                timed_pairs(graph_pairs, set_off, rng, lambda: [pick["g"][0].replay() for _ in range(4)]))
        summary(f"marks{what}: loop graph x20",
                timed_pairs(loop_pairs, set_off, rng, lambda: [pick["g"][2].replay() for _ in range(20)]))


RAW = {}


def summary(name, costs):
    RAW[name] = costs
    n = len(costs)
    mean = statistics.fmean(costs)
    half = 1.96 * statistics.stdev(costs) / math.sqrt(n) if n > 1 else float("nan")
    print(f"  {name:22s} median {100 * statistics.median(costs):+6.2f}%  mean "
          f"{100 * mean:+6.2f}% ± {100 * half:.2f}%  ({n} pairs)", flush=True)


@torch.inference_mode()
def eager(model, cfg, gens, set_off, rng):
    """Per decode step: forward, argmax, the token read back (as sb.generate)."""
    prompt = torch.randint(0, cfg.vocab_size, (sb.BATCH, sb.PROMPT), device="cuda")
    wall, cpu = [], []
    for _ in range(gens):
        out = model(input_ids=prompt, use_cache=True)
        past = out.past_key_values
        tok = out.logits[:, -1].argmax(-1, keepdim=True)
        tok.tolist()
        step = 0
        while step + 2 <= sb.DECODE_TOKENS - 1:
            got = {}
            for state in rng.sample(["on", "off"], 2):
                set_off(state == "off")
                t0, c0 = time.perf_counter(), time.thread_time()
                out = model(input_ids=tok, past_key_values=past, use_cache=True)
                past = out.past_key_values
                tok = out.logits[:, -1].argmax(-1, keepdim=True)
                tok.tolist()
                got[state] = (time.perf_counter() - t0, time.thread_time() - c0)
                step += 1
            wall.append(got["on"][0] / got["off"][0] - 1)
            cpu.append(got["on"][1] / got["off"][1] - 1)
    set_off(False)
    return wall, cpu


def timed_pairs(pairs, set_off, rng, body):
    costs = []
    for _ in range(pairs):
        got = {}
        for state in rng.sample(["on", "off"], 2):
            set_off(state == "off")
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            body()
            torch.cuda.synchronize()
            got[state] = time.perf_counter() - t0
        costs.append(got["on"] / got["off"] - 1)
    set_off(False)
    return costs


def main():
    gens = int(sys.argv[1]) if len(sys.argv) > 1 else 16
    graph_pairs = int(sys.argv[2]) if len(sys.argv) > 2 else 400
    loop_pairs = int(sys.argv[3]) if len(sys.argv) > 3 else 200
    rng = random.Random(int(os.environ.get("AB_SEED", "7")))
    model, cfg = sb.build()
    # Only now: the driver loaded the shim at CUDA's initialisation; asked before, ctypes
    # would load a copy the driver never initialised (its switch off).
    set_off = switch()
    if os.environ.get("AB_ONLY") == "graph_marks":
        prompt = torch.randint(0, cfg.vocab_size, (sb.BATCH, sb.PROMPT), device="cuda")
        sb.generate(model, prompt)
        graph_marks(model, cfg, torch.zeros(256, device="cuda"), graph_pairs, loop_pairs, rng)
        return
    prompt = torch.randint(0, cfg.vocab_size, (sb.BATCH, sb.PROMPT), device="cuda")
    sb.generate(model, prompt)
    g, _, _ids = sb.graph_step(model, cfg)
    x = torch.zeros(256, device="cuda")
    lg = capture_adds(x)
    for _ in range(20):
        g.replay()
    torch.cuda.synchronize()
    label = os.environ.get("AB_LABEL", "")
    t0 = time.perf_counter()
    wall, cpu = eager(model, cfg, gens, set_off, rng)
    dt = time.perf_counter() - t0
    print(f"pid {os.getpid()} {label}: recording on vs off, paired neighbours "
          f"({gens} generations in {dt:.0f} s, {2 * len(wall) / dt:.0f} steps/s)", flush=True)
    summary("eager step wall", wall)
    summary("eager step cpu", cpu)

    def graph_body():
        for _ in range(4):
            g.replay()

    summary("graph 4 replays", timed_pairs(graph_pairs, set_off, rng, graph_body))

    def loop_body():
        for _ in range(1000):
            x.add_(1.0)

    summary("loop 1000 add_", timed_pairs(loop_pairs, set_off, rng, loop_body))
    summary("loop graph 20 replays", timed_pairs(loop_pairs, set_off, rng,
                                                 lambda: [lg.replay() for _ in range(20)]))
    if os.environ.get("AB_RAW"):
        import json
        with open(os.environ["AB_RAW"], "w") as f:
            json.dump(RAW, f)


if __name__ == "__main__":
    main()
