"""The recorder's-price benchmark with the machine's drift taken out: every side's processes start once,
warm up, and then take turns on the GPU — one turn is one eager generation (gpu/serve_bench.py's
decode: 128 tokens at batch 8, each read back), a CUDA-graph decode step replayed for a while,
and the launch-bound loop (gpu/torch_bench.py's `x.add_()`, eager and as a 100-node graph).
Only one process runs at a time; the others wait on a pipe (no CPU). The turn order is
shuffled every round, so each side meets the machine's slow and fast minutes alike, and each
round's figures are compared with base's figures of the same round (a paired ratio).

Why: on the H200 VM the same side measured 15–40% apart between rounds of separate runs
(BENCHMARKS.md, the recorder's price), so a 2% goal could not be separated with one process per round.

    python3 gpu/serve_turns.py OUT [--sides base,shim,shim_daemon,exact] [--per-side 2]
                               [--rounds 10] [--pin 2-9] [--graph-s 0.7] [--loop-s 0.5]

Sides: base (nothing), shim (CUDA_INJECTION64_PATH, default recording), shim_daemon (+ one
`wedgeprobe daemon` attached to these processes only: max_targets), exact
(WEDGEPROBE_SHIM_RECORD=exact), cupti_off (the shim loaded, off), attached (started bare, the
shim put in by `wedgeprobe attach` once warm). Binaries: $NEW (default
target/release). Writes OUT/turns.jsonl (every turn) and prints the tables.
"""
import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def worker():
    if os.environ.get("WP_TURNS_FAKE"):  # the coordinator's own check, without a GPU
        print(json.dumps({"ready": os.getpid()}), flush=True)
        for line in sys.stdin:
            if line.startswith("quit"):
                break
            k = 1.0 + random.random() * 0.1
            print(json.dumps({"eager_tok_s": 600 * k, "eager_cpu_ms_per_step": 12 / k,
                              "graph_steps_s": 405 * k, "loop_eager_ns": 7000 / k,
                              "loop_graph_ns": 950 / k}), flush=True)
        return
    sys.path.insert(0, HERE)
    import torch
    import serve_bench as sb
    from torch_bench import capture_adds

    model, cfg = sb.build()
    prompt = torch.randint(0, cfg.vocab_size, (sb.BATCH, sb.PROMPT), device="cuda")
    sb.generate(model, prompt)  # warm-up: allocator, cuBLAS handles, lazy module loads
    g, _, _ids = sb.graph_step(model, cfg)
    x = torch.zeros(256, device="cuda")
    lg = capture_adds(x)
    for _ in range(20):
        g.replay()
        lg.replay()
    torch.cuda.synchronize()
    print(json.dumps({"ready": os.getpid()}), flush=True)
    for line in sys.stdin:
        cmd = line.split()
        if not cmd or cmd[0] == "quit":
            break
        graph_s, loop_s = float(cmd[1]), float(cmd[2])
        r = turn(sb, model, prompt, g, x, lg, graph_s, loop_s)
        print(json.dumps(r), flush=True)


def turn(sb, model, prompt, g, x, lg, graph_s, loop_s):
    """One turn: an eager generation (tok/s and CPU ms per step), the graph decode step `g`
    replayed for `graph_s`, the launch-bound loop on `x` eager and as the 100-node graph `lg`
    for `loop_s` each."""
    import torch

    r = {}
    t0, c0 = time.perf_counter(), time.thread_time()
    sb.generate(model, prompt)
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    r["eager_tok_s"] = sb.DECODE_TOKENS * sb.BATCH / dt
    r["eager_cpu_ms_per_step"] = (time.thread_time() - c0) * 1e3 / sb.DECODE_TOKENS
    r["graph_steps_s"] = 1 / timed(graph_s, 20, g.replay)
    # Inline, not through `timed`: a Python call per op would add to what is measured.
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < loop_s:
        for _ in range(1000):
            x.add_(1.0)
        torch.cuda.synchronize()
        n += 1000
    r["loop_eager_ns"] = (time.perf_counter() - t0) / n * 1e9
    r["loop_graph_ns"] = timed(loop_s, 10, lg.replay) / 100 * 1e9
    return r


def timed(seconds, per_sync, step):
    """Seconds per `step`, run in groups of `per_sync` with a synchronize after each group,
    for about `seconds`."""
    import torch

    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(per_sync):
            step()
        torch.cuda.synchronize()
        n += per_sync
    return (time.perf_counter() - t0) / n


def side_env(side, new):
    shim = os.path.join(new, "libcupti_shim.so")
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    extra = {
        "base": {},
        "shim": {"CUDA_INJECTION64_PATH": shim},
        "shim_daemon": {"CUDA_INJECTION64_PATH": shim},
        "exact": {"CUDA_INJECTION64_PATH": shim, "WEDGEPROBE_SHIM_RECORD": "exact"},
        "cupti_off": {"CUDA_INJECTION64_PATH": shim, "WEDGEPROBE_SHIM": "off"},
        # Started bare; `wedgeprobe attach` puts the shim in once it is warm.
        "attached": {},
    }[side]
    env.update(extra)
    return env


class Worker:
    def __init__(self, side, k, out, new, pin):
        self.side, self.name = side, f"{side}.{k}"
        cmd = [sys.executable, os.path.abspath(__file__), "worker"]
        if pin:
            cmd = ["taskset", "-c", pin] + cmd
        self.err = open(os.path.join(out, f"{self.name}.err"), "w")
        self.p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=self.err, text=True, env=side_env(side, new))
        self.pid = None

    def wait_ready(self):
        line = self.p.stdout.readline()
        if not line:
            raise SystemExit(f"{self.name} exited before ready (see {self.err.name})")
        self.pid = json.loads(line)["ready"]

    def turn(self, graph_s, loop_s):
        self.p.stdin.write(f"turn {graph_s} {loop_s}\n")
        self.p.stdin.flush()
        line = self.p.stdout.readline()
        if not line:
            raise SystemExit(f"{self.name} exited during a turn (see {self.err.name})")
        return json.loads(line)

    def quit(self):
        try:
            self.p.stdin.write("quit\n")
            self.p.stdin.flush()
        except OSError:
            pass
        self.p.wait(timeout=60)


def start_daemon(out, new, pids):
    cfg = os.path.join(out, "daemon.toml")
    with open(cfg, "w") as f:
        f.write(f'listen = "127.0.0.1:19466"\ndump_dir = "{out}/dumps"\nlog_format = "json"\n'
                f"max_targets = {len(pids)}\n")
    log = os.path.join(out, "daemon.log")
    d = subprocess.Popen([os.path.join(new, "wedgeprobe"), "daemon", "--config", cfg],
                         stderr=open(log, "w"), stdout=subprocess.DEVNULL)
    deadline = time.time() + 60
    while time.time() < deadline:
        attached = set()
        for line in open(log):
            try:
                e = json.loads(line)
            except ValueError:
                continue
            if e.get("event") == "attached":
                attached.add(e.get("pid"))
        if set(pids) <= attached:
            time.sleep(1)
            return d
        time.sleep(0.2)
    raise SystemExit(f"the daemon did not attach to {pids} in 60 s (see {log})")


def tables(rows, sides):
    keys = [("eager_tok_s", True), ("eager_cpu_ms_per_step", False), ("graph_steps_s", True),
            ("loop_eager_ns", False), ("loop_graph_ns", False)]
    rounds = sorted({r["round"] for r in rows})
    per = {}  # (round, side, key) -> mean over the side's workers in that round
    for rd in rounds:
        for s in sides:
            for k, _ in keys:
                v = [r[k] for r in rows if r["round"] == rd and r["side"] == s]
                if v:
                    per[(rd, s, k)] = statistics.mean(v)
    for k, higher in keys:
        print(f"\n### {k} ({'higher' if higher else 'lower'} is better)")
        print("| side | median | paired vs base (median of rounds) | quartiles of the ratio | rounds |")
        print("|---|---|---|---|---|")
        for s in sides:
            vals = [per[(rd, s, k)] for rd in rounds if (rd, s, k) in per]
            if not vals:
                continue
            ratios = [per[(rd, s, k)] / per[(rd, "base", k)] - 1 for rd in rounds
                      if (rd, s, k) in per and (rd, "base", k) in per]
            if s != "base" and len(ratios) >= 2:
                q = statistics.quantiles(ratios, n=4)
                rel = f"{100 * statistics.median(ratios):+.2f}%"
                quart = f"{100 * q[0]:+.2f}% … {100 * q[2]:+.2f}%"
            else:
                rel, quart = "—", "—"
            print(f"| {s} | {statistics.median(vals):,.2f} | {rel} | {quart} | {len(vals)} |")


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        return worker()
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--sides", default="base,shim,shim_daemon,exact")
    ap.add_argument("--per-side", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--pin", default="")
    ap.add_argument("--graph-s", type=float, default=0.7)
    ap.add_argument("--loop-s", type=float, default=0.5)
    ap.add_argument("--seed", type=int, default=12)
    ap.add_argument("--daemon-at-round", type=int, default=0,
                    help="attach the daemon only from this round on (before it, the "
                         "shim_daemon processes run the shim alone: what the daemon changes, "
                         "within the same processes)")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    new = os.environ.get("NEW", os.path.join(os.getcwd(), "target/release"))
    sides = a.sides.split(",")
    t_start = time.time()
    # Daemon-side processes first: the daemon attaches to them (max_targets) and no others.
    daemon_side = [Worker("shim_daemon", k, a.out, new, a.pin) for k in range(a.per_side)] \
        if "shim_daemon" in sides else []
    for w in daemon_side:
        w.wait_ready()
    daemon = None
    if daemon_side and a.daemon_at_round == 0:
        daemon = start_daemon(a.out, new, [w.pid for w in daemon_side])
    others = [Worker(s, k, a.out, new, a.pin) for s in sides if s != "shim_daemon"
              for k in range(a.per_side)]
    for w in others:
        w.wait_ready()
    workers = daemon_side + others
    for w in workers:
        if w.side == "attached":
            t0 = time.time()
            out = subprocess.run([os.path.join(new, "wedgeprobe"), "attach", "--pid", str(w.pid)],
                                 capture_output=True, text=True, timeout=60)
            print(f"{w.name}: attach exit {out.returncode} in {time.time() - t0:.1f} s: "
                  f"{(out.stdout + out.stderr).strip()[:300]}", flush=True)
    print(f"{len(workers)} workers ready after {time.time() - t_start:.0f} s", flush=True)
    rng = random.Random(a.seed)
    rows = []
    with open(os.path.join(a.out, "turns.jsonl"), "w") as log:
        for rd in range(a.rounds):
            if daemon_side and daemon is None and rd == a.daemon_at_round:
                daemon = start_daemon(a.out, new, [w.pid for w in daemon_side])
                print(f"daemon attached before round {rd}", flush=True)
            order = workers[:]
            rng.shuffle(order)
            for w in order:
                r = w.turn(a.graph_s, a.loop_s)
                r.update(round=rd, side=w.side, worker=w.name, t=round(time.time() - t_start, 1))
                rows.append(r)
                log.write(json.dumps(r) + "\n")
                log.flush()
            print(f"round {rd}: " + ", ".join(
                f"{r['worker']} {r['eager_tok_s']:.0f}" for r in rows[-len(order):]), flush=True)
    for w in workers:
        w.quit()
    if daemon:
        daemon.send_signal(2)
        daemon.wait(timeout=30)
        kinds = {}
        for line in open(os.path.join(a.out, "daemon.log")):
            try:
                e = json.loads(line)
            except ValueError:
                continue
            if e.get("event") == "verdict":
                kinds[e.get("kind")] = kinds.get(e.get("kind"), 0) + 1
        print("daemon verdicts logged:", kinds or "none")
    for w in workers:
        lines = sum("wedgeprobe shim" in ln for ln in open(w.err.name))
        print(f"{w.name}: pid {w.pid}, {lines} shim log lines")
    tables(rows, sides)
    print(f"\ntotal {time.time() - t_start:.0f} s")


if __name__ == "__main__":
    main()
