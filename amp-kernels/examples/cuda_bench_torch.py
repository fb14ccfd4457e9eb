"""PyTorch's figures for the workloads of cuda_bench.rs, on the same GPU."""
import time
import torch

dev = "cuda"


def median(f, reps=20):
    for _ in range(3):
        f()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        f()
        torch.cuda.synchronize()
        ts.append(time.perf_counter() - t)
    ts.sort()
    return ts[reps // 2]


torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
n = 4096
for dt, name in [(torch.float16, "f16"), (torch.bfloat16, "bf16"), (torch.float32, "f32")]:
    a = torch.randn(n, n, device=dev).to(dt)
    b = torch.randn(n, n, device=dev).to(dt)
    t = median(lambda: torch.mm(a, b))
    print(f"torch_cuda_mm_{name}_{n}_tflops {2 * n**3 / t / 1e12:.1f} TFLOP/s")
numel = 1 << 20
grads = [torch.randn(numel, device=dev) for _ in range(64)]
found = torch.zeros(1, device=dev)
inv = torch.full((1,), 1.0 / 65536.0, device=dev)
t = median(lambda: torch._amp_foreach_non_finite_check_and_unscale_(grads, found, inv))
print(f"torch_cuda_unscale_gbps {64 * numel * 8 / t / 1e9:.1f} GB/s")
big = torch.zeros(64 * numel, device=dev)
t = median(lambda: big.clone())
print(f"torch_cuda_copy_gbps {64 * numel * 8 / t / 1e9:.1f} GB/s")
x = torch.randn(32, 64, 56, 56, device=dev).half()
w = torch.randn(64, 64, 3, 3, device=dev).half()
dy = torch.randn(32, 64, 56, 56, device=dev).half()
conv_args = ([1, 1], [1, 1], [1, 1], False, [0, 0], 1)
passes = [
    ("fwd", lambda: torch.nn.functional.conv2d(x, w, padding=1)),
    ("bwd_data", lambda: torch.ops.aten.convolution_backward(dy, x, w, None, *conv_args, [True, False, False])),
    ("bwd_filter", lambda: torch.ops.aten.convolution_backward(dy, x, w, None, *conv_args, [False, True, False])),
]
for name, f in passes:
    print(f"torch_cuda_conv2d_f16_{name}_ms {median(f) * 1e3:.3f} ms")
