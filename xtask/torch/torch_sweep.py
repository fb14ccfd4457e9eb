"""PyTorch (CPU) side of the size sweep: prints one JSON object whose entries have the keys,
workloads and timing of `cargo xtask bench --sweep` (bench/src/sweep.rs). Run both in the
same session and compare ratios, not absolute times:

    xtask/torch/torch-baseline --sweep > torch_sweep.json
    cargo xtask bench --sweep --compare torch_sweep.json

With `--serve` it measures on demand, for `cargo xtask bench --sweep --with-torch`, which
interleaves PyTorch's measurement of each entry with ours: it reads one key (`op/mode/n`)
per line on standard input and answers one JSON line with that entry's timing (its round
times in "times"), or {"missing": true}.

Each entry is timed as sweep.rs times it: two calls to warm up and size the rounds, one
untimed round, then ROUNDS rounds of `reps` calls each (a round lasts about ROUND_S); the
figure is the median round's time per call, the spread is the slowest round over the
fastest minus one. An entry whose first call takes over SLOW_S seconds (PyTorch's float16
products on a CPU without float16 arithmetic: 43 s for one 2048-cubed mm) is that call.
"""
import json
import math
import sys
import time

import torch
import torch.nn.functional as F

SIZES = [8, 16, 32, 64, 96, 128, 192, 256, 384, 512, 1024, 2048]
ROUNDS = 5
ROUND_S = 0.025
# an entry whose first call takes longer than this is that one call
SLOW_S = 1.0
# bmm is shaped like attention scores: [B*H, T, D] x [B*H, D, T] with T = n
BH, HEAD = 32, 64
DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}


def measure(f):
    t = time.perf_counter()
    f()
    first = time.perf_counter() - t
    if first > SLOW_S:
        # one call is the measurement (float16 products without hardware support)
        return {"s": first, "min_s": first, "max_s": first, "reps": 1, "rounds": 1,
                "times": [first]}
    t = time.perf_counter()
    f()
    one = time.perf_counter() - t
    reps = max(1, min(10000, math.ceil(ROUND_S / max(one, 1e-9))))
    for _ in range(reps):
        f()
    rounds = []
    for _ in range(ROUNDS):
        t = time.perf_counter()
        for _ in range(reps):
            f()
        rounds.append((time.perf_counter() - t) / reps)
    rounds.sort()
    return {"s": rounds[len(rounds) // 2], "min_s": rounds[0], "max_s": rounds[-1], "reps": reps,
            "rounds": ROUNDS, "times": rounds}


def data(shape, dtype, gen):
    return (torch.rand(shape, generator=gen) * 4 - 2).to(dtype)


def workloads(n, gen):
    """(op, mode, work, unit, function) for one size, in sweep.rs's order: op by op, each
    op's modes in turn (the data is drawn in set-up order)."""
    out = []
    for mode in ("f32", "bf16", "f16", "autocast_bf16"):
        dt = torch.float32 if mode == "autocast_bf16" else DTYPES[mode]
        auto = mode == "autocast_bf16"

        def region(f, auto=auto):
            if auto:
                def g():
                    with torch.autocast("cpu", dtype=torch.bfloat16):
                        return f()
                return g
            return f

        a, b = data((n, n), dt, gen), data((n, n), dt, gen)
        out.append(("mm", mode, 2 * n**3, "GFLOP/s", region(lambda a=a, b=b: torch.mm(a, b))))
        q, k = data((BH, n, HEAD), dt, gen), data((BH, HEAD, n), dt, gen)
        out.append(("bmm", mode, 2 * BH * n * HEAD * n, "GFLOP/s",
                    region(lambda q=q, k=k: torch.bmm(q, k))))
        x = data((n, n), dt, gen).requires_grad_()
        w = (data((n, n), dt, gen) / math.sqrt(n)).requires_grad_()
        bias = data((n,), dt, gen).requires_grad_()
        gdt = torch.bfloat16 if auto else dt
        g = data((n, n), gdt, gen)

        def linear(x=x, w=w, bias=bias, g=g, auto=auto):
            for p in (x, w, bias):
                p.grad = None
            if auto:
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    y = F.linear(x, w, bias)
            else:
                y = F.linear(x, w, bias)
            y.backward(g)

        out.append(("linear_fwd_bwd", mode, 6 * n**3, "GFLOP/s", linear))
    for mode, dt in DTYPES.items():
        size = dt.itemsize
        x, y = data((n, n), dt, gen), data((n, n), dt, gen)
        w, bias = data((n,), dt, gen), data((n,), dt, gen)
        out.append(("softmax", mode, 2 * n * n * size, "GB/s",
                    lambda x=x: torch.softmax(x, -1)))
        out.append(("layer_norm", mode, 2 * n * n * size, "GB/s",
                    lambda x=x, w=w, bias=bias: F.layer_norm(x, (n,), w, bias)))
        out.append(("add", mode, 3 * n * n * size, "GB/s", lambda x=x, y=y: torch.add(x, y)))
        out.append(("mul", mode, 3 * n * n * size, "GB/s", lambda x=x, y=y: torch.mul(x, y)))
        out.append(("gelu", mode, 2 * n * n * size, "GB/s", lambda x=x: F.gelu(x)))
    ops = list(dict.fromkeys(op for op, *_ in out))
    out.sort(key=lambda w: ops.index(w[0]))  # stable: each op's modes keep their order
    return out


def serve():
    """Answer `op/mode/n` lines with one JSON timing line each, until standard input ends."""
    gen = torch.Generator().manual_seed(0)
    size, table = None, {}
    for line in sys.stdin:
        key = line.strip()
        if not key:
            continue
        n = int(key.rsplit("/", 1)[1])
        if n != size:
            table = {f"{op}/{mode}/{n}": (work, unit, f) for op, mode, work, unit, f in workloads(n, gen)}
            size = n
        if key in table:
            work, unit, f = table[key]
            m = measure(f)
            m.update(work=work, unit=unit)
        else:
            m = {"missing": True}
        print(json.dumps(m), flush=True)


def main():
    if sys.argv[1:] == ["--serve"]:
        return serve()
    only = sys.argv[1] if len(sys.argv) > 1 else None
    gen = torch.Generator().manual_seed(0)
    entries = {}
    for n in SIZES:
        for op, mode, work, unit, f in workloads(n, gen):
            key = f"{op}/{mode}/{n}"
            if only and only not in key:
                continue
            m = measure(f)
            m.update(work=work, unit=unit)
            entries[key] = m
            del m["times"]
            print(f"  {key:<28} {m['s'] * 1e6:>12.2f} us", file=sys.stderr)
    print(json.dumps({"torch": torch.__version__, "threads": torch.get_num_threads(),
                      "entries": entries}, indent=1))


if __name__ == "__main__":
    main()
