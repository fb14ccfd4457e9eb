"""PyTorch (CPU) side of the side-by-side benchmarks: prints one JSON object.
The workloads and keys are those of `cargo xtask bench` (bench/src/bench.rs); run both
in the same session and compare ratios, not absolute times:

    xtask/torch/torch-baseline > torch.json
    cargo xtask bench --compare torch.json
"""
import json
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


def median_time(f, n=7, warm=2):
    for _ in range(warm):
        f()
    ts = []
    for _ in range(n):
        t = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t)
    ts.sort()
    return ts[len(ts) // 2]


def main():
    torch.manual_seed(0)
    r = {"torch": torch.__version__, "threads": torch.get_num_threads()}
    n = 1024
    a, b = torch.randn(n, n), torch.randn(n, n)
    r["mm_f32_1024_gflops"] = 2 * n**3 / median_time(lambda: torch.mm(a, b)) / 1e9
    ab, bb = a.bfloat16(), b.bfloat16()
    r["mm_bf16_1024_gflops"] = 2 * n**3 / median_time(lambda: torch.mm(ab, bb), n=2, warm=1) / 1e9
    for size, key, runs in ((256, "mm_bf16_256_gflops", 41), (2048, "mm_bf16_2048_gflops", 5)):
        x, y = torch.randn(size, size).bfloat16(), torch.randn(size, size).bfloat16()
        r[key] = 2 * size**3 / median_time(lambda: torch.mm(x, y), n=runs, warm=2) / 1e9
    ah, bh = a.half(), b.half()
    r["mm_f16_1024_gflops"] = 2 * n**3 / median_time(lambda: torch.mm(ah, bh), n=2, warm=1) / 1e9
    x = torch.randn(8, 8)
    k = 2000

    for name, op in (("mm", torch.mm), ("add", torch.add)):
        def plain(op=op):
            for _ in range(k):
                op(x, x)

        def auto(plain=plain):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                plain()

        r[f"{name}_8x8_us"] = median_time(plain) / k * 1e6
        r[f"{name}_8x8_autocast_us"] = median_time(auto) / k * 1e6
    grads = [torch.randn(1 << 20) for _ in range(64)]
    found, inv = torch.zeros(1), torch.full((1,), 1 / 65536.0)
    t = median_time(lambda: torch._amp_foreach_non_finite_check_and_unscale_(grads, found, inv), n=5)
    r["unscale_64x1M_f32_gbps"] = 64 * (1 << 20) * 8 / t / 1e9
    src = torch.randn(64 << 20)
    dst = torch.empty_like(src)
    r["copy_256MB_gbps"] = src.numel() * 8 / median_time(lambda: dst.copy_(src), n=5) / 1e9
    r["cast_f32_bf16_64M_gbps"] = src.numel() * 6 / median_time(lambda: src.bfloat16(), n=5) / 1e9
    r["cast_f32_f16_64M_gbps"] = src.numel() * 6 / median_time(lambda: src.half(), n=5) / 1e9
    model = nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    X, Y = torch.randn(256, 784), torch.randint(0, 10, (256,))

    def step_f32():
        opt.zero_grad()
        F.cross_entropy(model(X), Y).backward()
        opt.step()

    scaler = torch.amp.GradScaler("cpu")

    def step_amp():
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(X), Y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()

    conv = nn.Conv2d(64, 64, 3, padding=1)
    xc = torch.randn(32, 64, 32, 32)

    def conv_f32():
        conv.zero_grad()
        conv(xc).sum().backward()

    def conv_amp():
        conv.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = conv(xc)
        y.float().sum().backward()

    w = (torch.randn(1024, 1024) / 32).bfloat16().requires_grad_()
    bias = (torch.randn(1024) / 32).bfloat16().requires_grad_()
    xl = torch.randn(256, 1024).bfloat16().requires_grad_()

    def linear_bf16():
        for p in (w, bias, xl):
            p.grad = None
        F.linear(xl, w, bias).sum().backward()

    r["linear_bf16_fwd_bwd_ms"] = median_time(linear_bf16, n=21, warm=3) * 1e3
    r["conv2d_f32_fwd_bwd_ms"] = median_time(conv_f32, n=5) * 1e3
    r["conv2d_autocast_bf16_fwd_bwd_ms"] = median_time(conv_amp, n=2, warm=1) * 1e3
    r["mlp_step_f32_ms"] = median_time(step_f32, n=10) * 1e3
    r["mlp_step_autocast_bf16_scaler_ms"] = median_time(step_amp, n=3, warm=1) * 1e3
    r["gpt_step_f32_ms"], r["gpt_step_autocast_bf16_scaler_ms"] = gpt_steps()
    r["isa"] = isa()
    print(json.dumps(r, indent=1))


class Gpt(nn.Module):
    """The main job's model (amp/examples/train/gpt.rs, GptConfig::default()): token and
    learned position embeddings, pre-norm causal TransformerEncoderLayers with GELU, a
    final LayerNorm and a linear head."""

    def __init__(self, vocab=96, context=128, d_model=128, layers=4, heads=4, ff=512):
        super().__init__()
        self.tok_emb = nn.Embedding(vocab, d_model)
        self.pos_emb = nn.Parameter(torch.randn(context, d_model) * 0.02)
        nn.init.normal_(self.tok_emb.weight, std=0.02)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(d_model, heads, dim_feedforward=ff, dropout=0.0,
                                       activation="gelu", batch_first=True, norm_first=True)
            for _ in range(layers))
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(context))

    def loss(self, x, y):
        t = x.shape[1]
        h = self.tok_emb(x) + self.pos_emb[:t]
        for layer in self.layers:
            h = layer(h, src_mask=self.mask[:t, :t], is_causal=True)
        logits = self.head(self.ln_f(h))
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def gpt_steps():
    """Milliseconds per training step of Gpt on 16 sequences of 128 tokens (forward,
    cross-entropy, backward, AdamW lr 3e-3 weight decay 0.01): float32, and the forward
    and loss under cpu bfloat16 autocast with a GradScaler (xtask bench's gpt_step_*_ms)."""
    times = []
    for amp_on in (False, True):
        torch.manual_seed(0)
        model = Gpt()
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
        b, t, vocab = 16, 128, 96
        x = (torch.arange(b * t) * 7919 % vocab).reshape(b, t)
        y = ((torch.arange(b * t) + 1) * 7919 % vocab).reshape(b, t)
        scaler = torch.amp.GradScaler("cpu")

        def step():
            opt.zero_grad()
            if amp_on:
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    loss = model.loss(x, y)
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
            else:
                model.loss(x, y).backward()
                opt.step()

        times.append(median_time(step, n=11, warm=3) * 1e3)
    return times


def isa():
    """The CPU features (as /proc/cpuinfo spells them) and PyTorch's CPU capability."""
    wanted = ["avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_bf16", "avx512_fp16",
              "amx_tile", "amx_bf16", "amx_fp16"]
    try:
        with open("/proc/cpuinfo") as f:
            flags = next(l for l in f if l.startswith("flags")).split()
    except (OSError, StopIteration):
        flags = []
    return {"cpu": [f for f in wanted if f in flags],
            "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "mkldnn_bf16": torch.ops.mkldnn._is_mkldnn_bf16_supported()}


if __name__ == "__main__":
    main()
