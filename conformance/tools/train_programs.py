"""Random training programs (the `train` suite's format): an MLP of 2 or 3 linear
layers (PyTorch's default initialisation) with relu, tanh, gelu or sigmoid between,
trained on random batches by plain or momentum SGD, under bfloat16 autocast or not, with
a GradScaler (or a disabled one), gradient accumulation, clipping after an explicit
unscale_, and injected infinities; the losses, scales, skips and final parameters are
PyTorch's (`torch_runner.py`'s loop), replayed as a check. A program whose losses or
scales are not finite is left out. Tolerances are the suite's: 1e-4 / 1e-5 in float32,
0.03 / 0.003 under autocast.

usage: python train_programs.py SEED COUNT OUT.json   (needs torch, CPU)"""
import json
import math
import os
import random
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_runner as tr  # noqa: E402
import value_variants as vv  # noqa: E402

seed, n, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
rng = random.Random(seed)
torch.manual_seed(seed)
base = json.load(open(os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'data', 'train.json')))


def lin(o, i):
    """A linear layer's literal, initialised as `torch.nn.Linear` is."""
    w = torch.empty(o, i); torch.nn.init.kaiming_uniform_(w, a=5 ** 0.5)
    b = torch.empty(o).uniform_(-1 / i ** 0.5, 1 / i ** 0.5)
    return {'type': 'linear', 'weight': vv.lit(w), 'bias': vv.lit(b)}


cases = []
for k in range(n):
    ac = rng.random() < 0.75
    dims = [rng.choice([4, 6, 8])] + [rng.choice([8, 16, 32]) for _ in range(rng.randint(1, 2))] + [rng.choice([1, 3, 4])]
    model = []
    for j in range(len(dims) - 1):
        model.append(lin(dims[j + 1], dims[j]))
        if j < len(dims) - 2: model.append({'type': rng.choice(['relu', 'tanh', 'gelu', 'sigmoid'])})
    nparams = 2 * (len(dims) - 1)
    acc = rng.choice([1, 1, 2, 3])
    steps = rng.randint(3, 6)
    bs = rng.choice([4, 8])
    batches = [{'input': vv.lit(torch.randn(bs, dims[0])), 'target': vv.lit(torch.randn(bs, dims[-1]))} for _ in range(acc * steps)]
    inj = [{'step': s, 'param': rng.randrange(nparams)} for s in range(steps) if rng.random() < 0.25]
    sc = {'enabled': False} if rng.random() < 0.1 else {'init_scale': rng.choice([128.0, 1024.0, 65536.0, 2.0 ** 24]), 'growth_factor': 2.0, 'backoff_factor': 0.5, 'growth_interval': rng.choice([1, 2, 3])}
    c = {'id': f'train/{seed}/{k}', 'model': model, 'loss': 'mse_loss',
         'optimizer': {'type': 'sgd', 'lr': rng.choice([0.01, 0.05, 0.1]), 'momentum': rng.choice([0.0, 0.0, 0.9])},
         'scaler': sc, 'accumulate': acc, 'inject_inf': inj, 'clip_grad_norm': rng.choice([None, None, 0.5, 1.0]),
         'autocast': {'device': 'cpu', 'dtype': 'bfloat16'} if ac else None, 'batches': batches,
         'expect': {'losses': [], 'scales': [], 'skipped': [], 'final_params': [], 'rtol': 0.03 if ac else 1e-4, 'atol': 0.003 if ac else 1e-5}}
    vv.expect_train(c)
    if not all(math.isfinite(x) for x in c['expect']['losses'] + c['expect']['scales']): print('left out (not finite)', c['id'], file=sys.stderr); continue
    m = tr.run_train(c)
    if m: print('left out', c['id'], m, file=sys.stderr); continue
    cases.append(c)
doc = dict(base)
doc['cases'] = cases
doc['source'] = f'torch {torch.__version__} (cpu), conformance/tools/train_programs.py {seed} {n}'
with open(out, 'w') as f:
    json.dump(doc, f)
print(len(cases), 'programs', file=sys.stderr)
