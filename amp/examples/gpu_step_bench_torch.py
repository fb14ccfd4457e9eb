"""PyTorch's figures for gpu_step_bench.rs: the same MLP and GPT (the main job's model,
`Gpt` of torch_baseline.py beside this file) steps on the same GPU, float32 and float16
autocast + GradScaler, and a float16-autocast conv2d forward and backward (median
milliseconds, the loss read back each step)."""
import time
import torch

from torch_baseline import Gpt

B, I, H, O = 512, 1024, 4096, 1024
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False


def median_ms(step):
    """Median milliseconds of `step` over 20 calls, after 5 warm-up calls."""
    for _ in range(5):
        step()
    ts = []
    for _ in range(20):
        t = time.perf_counter()
        step()
        ts.append((time.perf_counter() - t) * 1e3)
    ts.sort()
    return ts[len(ts) // 2]


def step_ms(amp):
    dev = "cuda"
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(I, H), torch.nn.ReLU(), torch.nn.Linear(H, O)).to(dev)
    x = torch.randn(B, I, device=dev)
    y = torch.randn(B, O, device=dev)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    scaler = torch.amp.GradScaler("cuda", enabled=amp)

    def step():
        opt.zero_grad()
        with torch.autocast("cuda", dtype=torch.float16, enabled=amp):
            out = model(x)
        loss = torch.nn.functional.mse_loss(out.float(), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        return loss.item()

    return median_ms(step)


def conv_ms():
    dev = "cuda"
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(64, 64, 3, padding=1).to(dev)
    x = torch.randn(32, 64, 56, 56, device=dev, requires_grad=True)

    def step():
        conv.weight.grad = None
        with torch.autocast("cuda", dtype=torch.float16):
            out = conv(x)
        s = out.float().sum()
        s.backward()
        return s.item()

    return median_ms(step)


def gpt_step_ms(amp):
    """One training step of the main job's model on 16 sequences of 128 tokens (AdamW lr
    3e-3, weight decay 0.01), as gpu_step_bench.rs's gpt_step_ms."""
    dev = "cuda"
    torch.manual_seed(0)
    model = Gpt().to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    b, t, vocab = 16, 128, 96
    x = ((torch.arange(b * t) * 7919) % vocab).reshape(b, t).to(dev)
    y = (((torch.arange(b * t) + 1) * 7919) % vocab).reshape(b, t).to(dev)
    scaler = torch.amp.GradScaler("cuda", enabled=amp)

    def step():
        opt.zero_grad()
        with torch.autocast("cuda", dtype=torch.float16, enabled=amp):
            loss = model.loss(x, y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        return loss.item()

    return median_ms(step)


for amp in (False, True):
    print(f"torch_cuda_mlp_step_{'amp_f16' if amp else 'f32'}_ms {step_ms(amp):.3f} ms")
for amp in (False, True):
    print(f"torch_cuda_gpt_step_{'amp_f16' if amp else 'f32'}_ms {gpt_step_ms(amp):.3f} ms")
print(f"torch_cuda_conv2d_amp_f16_fwd_bwd_ms {conv_ms():.3f} ms")
