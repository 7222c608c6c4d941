"""A serving-shaped workload for the recorder's price: Hugging Face transformers'
Llama architecture at ~1.2B parameters with random weights (nothing downloaded), bf16, on the
GPU. Two measurements, one JSON line:

- eager: greedy decode of DECODE_TOKENS tokens at batch 8 after a 32-token prompt, KV cache
  on, the next token read back to the host every step (what a serving loop does to stream and
  stop) — tokens/s over REPS generations;
- graph: a decode-shaped forward (batch 8, one token, no cache) captured once in a CUDA graph
  and replayed — steps/s over GRAPH_S seconds.

    python3 gpu/serve_bench.py [REPS] [GRAPH_S]
    python3 gpu/serve_bench.py loop SECONDS     a healthy serving loop (eager generations and
                                                graph replays alternating) for SECONDS
If WP_GO is set, prints "ready" once warmed up and waits for that file (the driver starts the
daemon in between, so attaching is not measured).
"""
import json
import os
import sys
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

BATCH, PROMPT, DECODE_TOKENS = 8, 32, 128


def build():
    cfg = LlamaConfig(
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        vocab_size=128256,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
    return model, cfg


@torch.inference_mode()
def generate(model, prompt):
    out = model(input_ids=prompt, use_cache=True)
    past = out.past_key_values
    tok = out.logits[:, -1].argmax(-1, keepdim=True)
    produced = [tok.tolist()]
    for _ in range(DECODE_TOKENS - 1):
        out = model(input_ids=tok, past_key_values=past, use_cache=True)
        past = out.past_key_values
        tok = out.logits[:, -1].argmax(-1, keepdim=True)
        produced.append(tok.tolist())  # the host sees every token, as a server does
    return produced


@torch.inference_mode()
def graph_step(model, cfg):
    ids = torch.randint(0, cfg.vocab_size, (BATCH, 1), device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            model(input_ids=ids, use_cache=False)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = model(input_ids=ids, use_cache=False)
    # The graph holds the input's address, not the tensor: the caller keeps `ids` alive, or
    # a later allocation reuses its memory and the replays read garbage token ids (seen on
    # the H200: an embedding index assert).
    return g, out, ids


def loop(seconds):
    model, cfg = build()
    prompt = torch.randint(0, cfg.vocab_size, (BATCH, PROMPT), device="cuda")
    g, _, _ids = graph_step(model, cfg)
    gens = replays = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        generate(model, prompt)
        gens += 1
        for _ in range(200):
            g.replay()
        torch.cuda.synchronize()
        replays += 200
    print(json.dumps({"seconds": time.perf_counter() - t0, "generations": gens,
                      "graph_replays": replays}), flush=True)


def main():
    if len(sys.argv) > 2 and sys.argv[1] == "loop":
        return loop(float(sys.argv[2]))
    reps = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    graph_s = float(sys.argv[2]) if len(sys.argv) > 2 else 3.0
    model, cfg = build()
    prompt = torch.randint(0, cfg.vocab_size, (BATCH, PROMPT), device="cuda")
    generate(model, prompt)  # warm-up: allocator, cuBLAS handles, lazy module loads
    g, _, _ids = graph_step(model, cfg)
    for _ in range(20):
        g.replay()
    torch.cuda.synchronize()
    go = os.environ.get("WP_GO")
    if go:
        print("ready", flush=True)
        while not os.path.exists(go):
            time.sleep(0.05)
    t0, c0 = time.perf_counter(), time.thread_time()
    for _ in range(reps):
        generate(model, prompt)
    torch.cuda.synchronize()
    eager_s = time.perf_counter() - t0
    # The launching thread's CPU time per decode step: eager decode is launch-bound, and this
    # varies less between runs on the VM than wall time (BENCHMARKS.md, the recorder's price).
    eager_cpu_ms_per_step = (time.thread_time() - c0) * 1e3 / (reps * DECODE_TOKENS)
    n = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < graph_s:
        for _ in range(20):
            g.replay()
        torch.cuda.synchronize()
        n += 20
    graph_elapsed = time.perf_counter() - t0
    print(json.dumps({
        "eager_tok_s": reps * DECODE_TOKENS * BATCH / eager_s,
        "eager_cpu_ms_per_step": eager_cpu_ms_per_step,
        "graph_steps_s": n / graph_elapsed,
        "params_m": sum(p.numel() for p in model.parameters()) / 1e6,
    }), flush=True)


if __name__ == "__main__":
    main()
