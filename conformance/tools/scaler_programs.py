"""Random GradScaler programs (the `scaler` suite's format), each action's expectation
recorded from PyTorch's own `torch.amp.GradScaler('cpu')` and plain SGD, then replayed by
`torch_runner.py` as a check.

A program draws the scaler's options (scales from 1e-37 to 3e38, growth and backoff
factors, intervals, sometimes disabled), one or two optimizers of float32, bfloat16 or
float64 parameters (0-d to 9x9), and 2 to 7 iterations of: scale (a tensor or a list),
gradients per optimizer (sometimes an inf, -inf or NaN, sometimes a missing one), an
optional unscale_, step, get_scale / state_dict, update (sometimes with a new scale), a
setter, a state_dict carried into a new scaler, zero_grad. A program PyTorch refuses is
left out and counted.

usage: python scaler_programs.py SEED COUNT OUT.json   (needs torch, CPU)"""
import json
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


def t(shape, dtype='float32', scale=1.0, special=None):
    """A random tensor literal (one element `special` when given)."""
    x = torch.randn(shape, dtype=torch.float64) * scale
    if special is not None and x.numel():
        x.view(-1)[rng.randrange(x.numel())] = special
    return vv.lit(x.to(tr.DT[dtype]))
def prog(i):
    """Program `i`, its expectations not yet filled."""
    init = {}
    if rng.random() < 0.9: init['init_scale'] = rng.choice([65536.0, 4.0, 3.0, 1024.5, 7.0, 0.5, 1e-3, 3e38, 1e-37, 2.0**20, round(rng.uniform(0.1, 1e5), 3)])
    if rng.random() < 0.8: init['growth_factor'] = rng.choice([2.0, 1.1, 1.001, 4.0, 3.7])
    if rng.random() < 0.8: init['backoff_factor'] = rng.choice([0.5, 0.3, 0.9, 0.25, 0.77])
    if rng.random() < 0.8: init['growth_interval'] = rng.choice([1, 2, 3, 5, 2000])
    if rng.random() < 0.08: init['enabled'] = False
    pdt = rng.choice(['float32'] * 6 + ['bfloat16', 'float64'])
    opts = []
    for k in range(rng.choice([1, 1, 2])):
        shapes = [tuple(rng.randint(1, 9) for _ in range(rng.randint(0, 2))) for _ in range(rng.randint(1, 3))]
        opts.append({'name': f'opt{k}', 'lr': rng.choice([0.1, 0.01, 1.0]), 'params': [t(s, pdt) for s in shapes]})
    acts = []
    for it in range(rng.randint(2, 7)):
        if rng.random() < 0.15:
            acts.append({'action': 'scale', 'input': [t((), 'float32'), t((2,), rng.choice(['float32', 'bfloat16', 'float64']))], 'expect': []})
        else:
            acts.append({'action': 'scale', 'input': t((), rng.choice(['float32'] * 4 + ['bfloat16', 'float16', 'float64'])), 'expect': None})
        for o in opts:
            r = rng.random()
            special = float('inf') if r < 0.15 else float('-inf') if r < 0.2 else float('nan') if r < 0.27 else None
            grads = [t(tuple(p['shape']), pdt, scale=rng.choice([1.0, 100.0, 1e-3]), special=special if j == 0 else None) for j, p in enumerate(o['params'])]
            if rng.random() < 0.1 and len(grads) > 1: grads[-1] = None
            acts.append({'action': 'set_grads', 'optimizer': o['name'], 'grads': grads})
            if rng.random() < 0.4: acts.append({'action': 'unscale_', 'optimizer': o['name'], 'expect_grads': None})
            acts.append({'action': 'step', 'optimizer': o['name'], 'expect_skipped': None, 'expect_params': None})
        if rng.random() < 0.2: acts.append({'action': 'get_scale', 'expect': None})
        if rng.random() < 0.2: acts.append({'action': 'state_dict', 'expect': None})
        u = {'action': 'update', 'expect_scale': None, 'expect_growth_tracker': None}
        if rng.random() < 0.12: u['new_scale'] = rng.choice([1.0, 8.0, 0.25, 1e5, 3.3])
        acts.append(u)
        if rng.random() < 0.1:
            acts.append({'action': 'set', 'field': rng.choice(['growth_factor', 'backoff_factor', 'growth_interval']), 'value': None})
            f = acts[-1]['field']; acts[-1]['value'] = {'growth_factor': 3.0, 'backoff_factor': 0.125, 'growth_interval': 1}[f]
        if rng.random() < 0.1:
            sd = {'action': 'state_dict', 'expect': None}; acts.append(sd)
            acts.append({'action': 'new_scaler', 'init': {'init_scale': 2.0}})
            acts.append({'action': 'load_state_dict', 'state': '__SD__'})
        for o in opts: acts.append({'action': 'zero_grad', 'optimizer': o['name']})
    return {'id': f'program/{seed}/{i}', 'init': init, 'optimizers': opts, 'actions': acts}
cases = []; bad = 0
for i in range(n):
    c = prog(i)
    # resolve load_state_dict placeholders by a first replay that records the state dicts
    try:
        for k, a in enumerate(c['actions']):
            if a['action'] == 'load_state_dict' and a['state'] == '__SD__':
                head = dict(c); head['actions'] = [dict(x) for x in c['actions'][:k]]
                vv.expect_scaler(head)
                a['state'] = [x for x in head['actions'] if x['action'] == 'state_dict'][-1]['expect']
        vv.expect_scaler(c)
        for a in c['actions']:
            if a['action'] == 'step' and a.get('expect_skipped') is None: raise ValueError('unfilled')
        m = tr.run_scaler(c)
        if m: raise ValueError(m)
        cases.append(c)
    except Exception as ex:
        bad += 1
        if bad < 5: print('left out', c['id'], str(ex)[:200], file=sys.stderr)
doc = {'format': 'amp-vectors/1', 'suite': 'scaler',
       'source': f'torch {torch.__version__} (cpu), conformance/tools/scaler_programs.py {seed} {n}',
       'notes': 'Random GradScaler programs (see the tool); optimizers are plain SGD (p -= lr * grad). '
                'Each expectation was recorded from PyTorch and replayed.',
       'cases': cases}
with open(out, 'w') as f:
    json.dump(doc, f)
print(len(cases), 'programs', bad, 'left out', file=sys.stderr)
