"""Does every launch reach the shim's launch hooks? Run under the shim with
WEDGEPROBE_SHIM_VERIFY_HOOKS=1: CUPTI's launch callbacks stay on beside the hooks and the
shim prints, at exit, how many launches CUPTI saw and how many of them did not come through a
hook. The workload covers the callers we know: PyTorch eager ops (the runtime), cuBLAS GEMMs,
SDPA attention, a Triton kernel (binds cuLaunchKernelEx itself with dlsym), a CUDA graph
replay, and a small transformers Llama forward.

    CUDA_INJECTION64_PATH=.../libcupti_shim.so WEDGEPROBE_SHIM_VERIFY_HOOKS=1 python3 gpu/hook_coverage.py
"""
import torch
import torch.nn.functional as F
import triton
import triton.language as tl


@triton.jit
def add_one(x_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    tl.store(x_ptr + i, tl.load(x_ptr + i, mask=m) + 1, mask=m)


def main():
    x = torch.zeros(4096, device="cuda")
    for _ in range(100):
        x.add_(1.0)  # eager: the runtime's cudaLaunchKernel
    a = torch.randn(512, 512, device="cuda", dtype=torch.bfloat16)
    for _ in range(20):
        a = (a @ a).clamp_(-1, 1)  # cuBLAS
    q = torch.randn(2, 8, 128, 64, device="cuda", dtype=torch.bfloat16)
    for _ in range(10):
        F.scaled_dot_product_attention(q, q, q, is_causal=True)  # flash / efficient attention
    for _ in range(50):
        add_one[(4,)](x, 4096, BLOCK=1024)  # Triton's own launcher
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        x.add_(1.0)
    torch.cuda.synchronize()
    with torch.cuda.graph(g):
        for _ in range(10):
            x.add_(1.0)
    for _ in range(20):
        g.replay()
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, vocab_size=1000)
    with torch.device("cuda"):
        m = LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
    with torch.inference_mode():
        ids = torch.randint(0, 1000, (2, 16), device="cuda")
        for _ in range(3):
            m(input_ids=ids)
    torch.cuda.synchronize()
    print("x[0] =", x[0].item(), "(expected", 100 + 50 + 1 + 200, ")")


if __name__ == "__main__":
    main()
