"""Issue 12: the shim's recording cost measured inside one process, recording switched on and
off between turns seconds apart (`wedgeprobe_shim_measure_pass`, enabled by
WEDGEPROBE_SHIM_MEASURE=toggle). Separate processes on the H200 VM differ by ±10–25% in eager
speed and the machine drifts minute to minute (BENCHMARKS.md, session 7), more than the 2% goal;
within one process and a few seconds, that cancels. What it does not price: the hooks' detour
itself while off (a jump and a flag test; `gpu/hook_cost.sh` prices it in C, base vs `pass`),
and the daemon (it attaches to the whole process, both states alike).

    CUDA_INJECTION64_PATH=.../libcupti_shim.so WEDGEPROBE_SHIM_MEASURE=toggle \\
        python3 gpu/inproc_ab.py OUT.jsonl [ROUNDS] [GRAPH_S] [LOOP_S]

Each round runs both states in a random order; one turn = one eager generation (128 tokens at
batch 8, each read back), the graph decode step replayed for GRAPH_S, the launch-bound loop
eager and as a 100-node graph for LOOP_S each. Prints paired on/off ratios: median, quartiles.
"""
import ctypes
import json
import os
import random
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torch  # noqa: E402

import serve_bench as sb  # noqa: E402
from serve_turns import turn  # noqa: E402
from torch_bench import capture_adds  # noqa: E402

KEYS = [("eager_tok_s", True), ("eager_cpu_ms_per_step", False), ("graph_steps_s", True),
        ("loop_eager_ns", False), ("loop_graph_ns", False)]


def switch():
    shim = ctypes.CDLL(os.environ["CUDA_INJECTION64_PATH"])
    f = shim.wedgeprobe_shim_measure_pass
    f.argtypes, f.restype = [ctypes.c_int], ctypes.c_int
    if f(0) != 0:
        sys.exit("inproc_ab: the shim's toggle is not enabled (WEDGEPROBE_SHIM_MEASURE=toggle)")
    return f


def main():
    out = sys.argv[1]
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 20
    graph_s = float(sys.argv[3]) if len(sys.argv) > 3 else 0.5
    loop_s = float(sys.argv[4]) if len(sys.argv) > 4 else 0.4
    model, cfg = sb.build()
    pass_ = switch()  # after CUDA's initialisation: the shim sets the switch up in cuInit
    prompt = torch.randint(0, cfg.vocab_size, (sb.BATCH, sb.PROMPT), device="cuda")
    sb.generate(model, prompt)
    g, _, _ids = sb.graph_step(model, cfg)
    x = torch.zeros(256, device="cuda")
    lg = capture_adds(x)
    for state in ("on", "off"):
        pass_(int(state == "off"))
        turn(sb, model, prompt, g, x, lg, 0.2, 0.1)  # warm both states
    rng = random.Random(int(os.environ.get("AB_SEED", "7")))
    ratios = {k: [] for k, _ in KEYS}
    with open(out, "a") as f:
        for r in range(rounds):
            got = {}
            for state in rng.sample(["on", "off"], 2):
                pass_(int(state == "off"))
                got[state] = turn(sb, model, prompt, g, x, lg, graph_s, loop_s)
                f.write(json.dumps({"pid": os.getpid(), "label": os.environ.get("AB_LABEL", ""),
                                    "round": r, "state": state,
                                    **got[state]}) + "\n")
            for k, higher in KEYS:
                on, off = got["on"][k], got["off"][k]
                # As a cost: positive = recording makes it worse.
                ratios[k].append((off / on - 1) if higher else (on / off - 1))
        pass_(0)
    label = os.environ.get("AB_LABEL", "")
    print(f"pid {os.getpid()} {label}: recording on vs off, {rounds} paired rounds "
          "(cost: + = slower with recording)")
    for k, _ in KEYS:
        v = sorted(ratios[k])
        q = statistics.quantiles(v, n=4) if len(v) > 1 else [v[0]] * 3
        print(f"  {k:24s} median {100 * statistics.median(v):+6.2f}%  "
              f"quartiles {100 * q[0]:+6.2f} … {100 * q[2]:+6.2f}%")


if __name__ == "__main__":
    main()
