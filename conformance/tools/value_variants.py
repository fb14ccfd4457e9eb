"""Value variants of the vector files: every case again with other numbers, its
expectations computed by PyTorch itself (the way `torch_runner.py` replays a case).

PyTorch's vectors are kept aside with other values as well; a port that passes its copy of
the files only because of the particular numbers in them fails these. A variant keeps the
case's op, call, shapes, dtypes, non-tensor arguments, integer and boolean tensors
(indices, targets, masks), tolerances and program; each floating-point tensor is redrawn:
its elements permuted and each finite one multiplied by a factor drawn from [0.5, 1)
(so a value keeps its sign and the domain of ops such as `log`, `acos` or `log1p`), then
rounded to the tensor's dtype. Infinities and NaNs keep their count and move with the
permutation. A variant PyTorch refuses, or whose expectations PyTorch does not reproduce
on a second replay (`torch_runner.py`'s check), is left out and counted.

With `--scenarios`, an autocast file gets scenario variants instead (to
OUTDIR/<name>_scenarios.json): each case under float16 autocast (its bfloat16 inputs made
float16, or kept), with its float32 inputs made float64 (which CPU autocast never casts),
made float16, or with its first float32 input made bfloat16 (mixed dtypes), and with
float32 inputs where the file has only the bfloat16 case (the recurrent cells). A 16-bit output is
compared with the tolerance the file gives 16-bit outputs; ops listed in
`autocast_cpu_torch_differs.txt` (where PyTorch no longer follows the documented lists for
16-bit inputs) are left out of the 16-bit input scenarios.

With `--subsets`, a grad file gets, for each case with several inputs that require grad,
two variants: the first such input, then the last, not requiring grad (to
OUTDIR/<name>_subsets.json): the gradients and second-order gradients of the others, as
PyTorch computes them.

With `--kwargs`, an autocast or grad file gets each case again with one keyword argument
changed to another value from `KWARGS` (a loss without `reduction` also gets each
reduction), to OUTDIR/<name>_kwargs.json; PyTorch computes the expectations and variants
it refuses are left out.

usage: python value_variants.py [--seed S] [--per-case K] [--range LO HI] IN.json [...] OUTDIR
       python value_variants.py --scenarios AUTOCAST.json OUTDIR
       python value_variants.py --subsets GRAD.json [...] OUTDIR
       python value_variants.py --kwargs FILE.json [...] OUTDIR
       (each IN.json's variants go to OUTDIR/<name>_values.json; needs torch, CPU)"""
import argparse
import copy
import json
import math
import os
import random
import sys
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_runner as tr  # noqa: E402

warnings.filterwarnings("ignore")

NAME = {v: k for k, v in tr.DT.items()}


def num(v):
    """A JSON number or the format's string for a non-finite float."""
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    return v


def lit(t, requires_grad=None):
    """The tensor literal of `t` (its values exactly: they are read from its dtype)."""
    t = t.detach()
    if t._is_zerotensor():  # autograd's efficient zeros have no storage to read
        t = torch.zeros(t.shape, dtype=t.dtype)
    t = t.contiguous()
    if t.dtype.is_floating_point:
        data = [num(v) for v in t.double().reshape(-1).tolist()]
    else:
        data = t.reshape(-1).tolist()
    out = {"dtype": NAME[t.dtype], "shape": list(t.shape), "data": data}
    if requires_grad:
        out["requires_grad"] = True
    return out


# Ops whose inputs have structure a permutation breaks (a positive-definite matrix): their
# tensors are only scaled, all by one factor.
SCALED_ONLY = ("cholesky",)


# The range of the factors a redraw multiplies by (`--range`).
RANGE = [0.5, 1.0]


def redraw(x, rng, whole=False):
    """`x` (any argument value) with each floating-point tensor literal redrawn (`whole`:
    scaled by one factor, not permuted)."""
    if tr.is_tensor_lit(x):
        if not tr.DT[x["dtype"]].is_floating_point or not x["data"]:
            return x
        vals = [float(v) for v in x["data"]]
        if whole:
            f = rng.uniform(*RANGE)
            vals = [v * f for v in vals]
        else:
            rng.shuffle(vals)
            vals = [v * rng.uniform(*RANGE) if math.isfinite(v) else v for v in vals]
        t = torch.tensor(vals, dtype=torch.float64).to(tr.DT[x["dtype"]]).reshape(x["shape"])
        return lit(t, x.get("requires_grad"))
    if isinstance(x, list):
        return [redraw(v, rng, whole) for v in x]
    if isinstance(x, dict):
        return {k: redraw(v, rng, whole) for k, v in x.items()}
    return x


def like(shape_of, tensors):
    """`tensors` as a list, or its one element where the original expectation was one
    literal rather than a list."""
    if isinstance(shape_of, list):
        return tensors
    return tensors[0]


def expect_autocast(case):
    outs = tr.autocast_outputs(case)
    case["expect"]["output"] = like(case["expect"]["output"], [lit(o) for o in outs])


def expect_grad(case):
    with tr.grad_backend(case):
        return expect_grad_in(case)


def expect_grad_in(case):
    leaves = []
    args = [tr.arg(a, leaves) for a in case["args"]]
    kwargs = {k: tr.arg(v) for k, v in case["kwargs"].items()}
    o = tr.outs(tr.call(case["call"], args, kwargs))
    e = case["expect"]
    e["output"] = like(e["output"], [lit(t) for t in o])
    go = case["grad_output"]
    gouts = [tr.tensor(x) for x in (go if isinstance(go, list) else [go])]
    second = "second_order_grads" in e
    grads = torch.autograd.grad(o, leaves, gouts, allow_unused=True, create_graph=second)
    e["grads"] = [None if g is None else lit(g) for g in grads]
    if not second:
        return
    pen = [(g * g).sum() for g in grads if g is not None and g.requires_grad]
    if not pen:
        del e["second_order_grads"]  # the format: absent where none depends on an input
        return
    g2 = torch.autograd.grad(sum(pen), leaves, allow_unused=True)
    e["second_order_grads"] = [None if g is None else lit(g) for g in g2]


def expect_train(case):
    losses, scales, skipped, params = tr.train(case)
    e = case["expect"]
    e["losses"], e["scales"], e["skipped"] = losses, scales, skipped
    e["final_params"] = like(e["final_params"], [lit(p) for p in params])


def expect_scaler(case):
    """Replays the program, writing what PyTorch does into each action's expectation; an
    action expected to fail must still fail with the same text (else the variant is
    dropped)."""
    if "expect_init_error" in case:
        return
    scaler = torch.amp.GradScaler("cpu", **case["init"])
    params, opts = {}, {}
    for o in case["optimizers"]:
        ps = [tr.tensor(p).requires_grad_(True) for p in o["params"]]
        params[o["name"]] = ps
        opts[o["name"]] = torch.optim.SGD(ps, lr=o["lr"])
    for a in case["actions"]:
        act = a["action"]
        try:
            if act == "scale":
                inp = a["input"]
                res = scaler.scale(tr.tensor(inp) if tr.is_tensor_lit(inp) else [tr.tensor(x) for x in inp])
                got = [lit(r) for r in tr.outs(res)]
                if "expect" in a:
                    a["expect"] = like(a["expect"], got)
            elif act == "set_grads":
                for p, g in zip(params[a["optimizer"]], a["grads"]):
                    p.grad = None if g is None else tr.tensor(g)
            elif act == "unscale_":
                scaler.unscale_(opts[a["optimizer"]])
                if "expect_grads" in a:
                    a["expect_grads"] = [None if p.grad is None else lit(p.grad) for p in params[a["optimizer"]]]
            elif act == "step":
                scaler.step(opts[a["optimizer"]])
                skipped = False
                if scaler.is_enabled():
                    st = scaler._per_optimizer_states[id(opts[a["optimizer"]])]
                    skipped = bool(sum(v.item() for v in st["found_inf_per_device"].values()))
                if "expect_skipped" in a:
                    a["expect_skipped"] = skipped
                    a["expect_params"] = [lit(p) for p in params[a["optimizer"]]]
            elif act == "update":
                scaler.update(a.get("new_scale"))
                if "expect_scale" in a:
                    a["expect_scale"] = scaler.get_scale()
                    a["expect_growth_tracker"] = scaler._get_growth_tracker()
            elif act == "zero_grad":
                opts[a["optimizer"]].zero_grad(set_to_none=True)
            elif act == "get_scale":
                if "expect" in a:
                    a["expect"] = scaler.get_scale()
            elif act == "state_dict":
                if "expect" in a:
                    a["expect"] = dict(scaler.state_dict())
            elif act == "load_state_dict":
                scaler.load_state_dict(a["state"])
            elif act == "new_scaler":
                scaler = torch.amp.GradScaler("cpu", **a["init"])
            elif act == "set":
                getattr(scaler, f"set_{a['field']}")(a["value"])
            else:
                raise ValueError(f"unknown action {act}")
        except Exception as ex:  # noqa
            if "expect_error" in a and a["expect_error"] in str(ex):
                return
            raise
        if "expect_error" in a:
            raise ValueError("the failing action no longer fails")


def redrawn(suite, case, rng):
    """`case` with its inputs redrawn (its expectations still the original's)."""
    v = copy.deepcopy(case)
    if suite in ("autocast", "grad"):
        whole = any(w in v["op"] for w in SCALED_ONLY)
        v["args"] = redraw(v["args"], rng, whole)
        v["kwargs"] = redraw(v["kwargs"], rng, whole)
        if suite == "grad":
            v["grad_output"] = redraw(v["grad_output"], rng)
    elif suite == "train":
        v["model"] = redraw(v["model"], rng)
        v["batches"] = redraw(v["batches"], rng)
    elif suite == "scaler":
        for o in v.get("optimizers", []):
            o["params"] = redraw(o["params"], rng)
        for a in v.get("actions", []):
            if a["action"] in ("scale", "set_grads"):
                key = "input" if a["action"] == "scale" else "grads"
                a[key] = redraw(a[key], rng)
    else:
        raise ValueError(f"suite {suite} has no value variants")
    return v


def converted(x, frm, to, first=None):
    """`x` with its tensor literals of dtype `frm` made `to` (only the first one when
    `first` is a one-element list, set to True once it is done)."""
    if tr.is_tensor_lit(x):
        if x["dtype"] != frm or (first is not None and first[0]):
            return x
        if first is not None:
            first[0] = True
        return lit(tr.tensor(x).to(tr.DT[to]), x.get("requires_grad"))
    if isinstance(x, list):
        return [converted(v, frm, to, first) for v in x]
    if isinstance(x, dict):
        return {k: converted(v, frm, to, first) for k, v in x.items()}
    return x


def scenario(case, name):
    """The autocast `case` in scenario `name`, or None where it would not differ."""
    v = copy.deepcopy(case)
    if name == "float16_autocast":
        for st in v["autocast"]:
            if st.get("dtype") == "bfloat16":
                st["dtype"] = "float16"
        v["args"] = converted(v["args"], "bfloat16", "float16")
        v["kwargs"] = converted(v["kwargs"], "bfloat16", "float16")
    elif name in ("float64_inputs", "float16_inputs"):
        to = name.split("_")[0]
        v["args"] = converted(v["args"], "float32", to)
        v["kwargs"] = converted(v["kwargs"], "float32", to)
    elif name == "mixed_inputs":
        v["args"] = converted(v["args"], "float32", "bfloat16", [False])
    elif name == "float16_autocast_bfloat16_inputs":
        for st in v["autocast"]:
            if st.get("dtype") == "bfloat16":
                st["dtype"] = "float16"
    elif name == "float32_inputs":
        v["args"] = converted(v["args"], "bfloat16", "float32")
        v["kwargs"] = converted(v["kwargs"], "bfloat16", "float32")
    else:
        raise ValueError(name)
    return None if v == case else v


SCENARIOS = ("float16_autocast", "float64_inputs", "float16_inputs", "mixed_inputs",
             "float16_autocast_bfloat16_inputs", "float32_inputs")


def scenarios(doc, differs_path):
    """The scenario variants of an autocast file's cases, and the ones left out."""
    tol16 = {(c["expect"]["rtol"], c["expect"]["atol"]) for c in doc["cases"]
             if any(o["dtype"] in ("bfloat16", "float16")
                    for o in (c["expect"]["output"] if isinstance(c["expect"]["output"], list)
                              else [c["expect"]["output"]]))}
    assert len(tol16) == 1, tol16
    (rtol16, atol16), = tol16
    differs = {line.split()[0] for line in open(differs_path) if line.strip()}
    def adjust(v):
        """The file's 16-bit tolerance for a 16-bit output."""
        out = v["expect"]["output"]
        if any(o["dtype"] in ("bfloat16", "float16") for o in (out if isinstance(out, list) else [out])):
            v["expect"]["rtol"], v["expect"]["atol"] = rtol16, atol16

    cases, dropped = [], []
    ids = {c["id"] for c in doc["cases"]}
    for case in doc["cases"]:
        for name in SCENARIOS:
            if name in ("float16_inputs", "mixed_inputs", "float16_autocast_bfloat16_inputs") \
                    and case["op"] in differs:
                continue
            # float32 inputs where the file has only the bfloat16 case (the cells).
            if name == "float32_inputs" and ("bf16_inputs" not in case["id"]
                                             or case["id"].replace("bf16_inputs", "f32_inputs") in ids
                                             or case["op"] in differs):
                continue
            v = scenario(case, name)
            if v is None:
                continue
            v["id"] = f"{case['id']}/{name}"
            derive(v, "autocast", expect_autocast, cases, dropped, adjust)
    return cases, dropped


# How each suite's expectations are computed.
EXPECT = {"autocast": expect_autocast, "grad": expect_grad, "train": expect_train,
          "scaler": expect_scaler}


def derive(v, suite, expect, cases, dropped, adjust=None):
    """Fills the derived case `v`'s expectations with `expect` (then `adjust(v)`) and keeps
    it in `cases` when PyTorch replays it; else records why in `dropped`."""
    try:
        expect(v)
        if adjust is not None:
            adjust(v)
        json.dumps(v, allow_nan=False)
        m = tr.RUN[suite](v)
        if m:
            raise ValueError(f"PyTorch does not reproduce it: {m}")
        cases.append(v)
    except Exception as ex:  # noqa
        dropped.append((v["id"], str(ex).splitlines()[0][:160]))


def grad_leaves(x, out):
    """The tensor literals of `x` that require grad, in argument order, into `out`."""
    if tr.is_tensor_lit(x):
        if x.get("requires_grad"):
            out.append(x)
    elif isinstance(x, list):
        for v in x:
            grad_leaves(v, out)
    elif isinstance(x, dict):
        for v in x.values():
            grad_leaves(v, out)
    return out


def subsets(doc):
    """A grad file's cases with one input at a time not requiring grad, and the ones
    left out."""
    cases, dropped = [], []
    for case in doc["cases"]:
        n = len(grad_leaves(case["args"], []))
        if n < 2:
            continue
        # The first and the last (a layer's input and its last weight or bias).
        for k in sorted({0, n - 1}):
            v = copy.deepcopy(case)
            del grad_leaves(v["args"], [])[k]["requires_grad"]
            v["id"] = f"{case['id']}/no_grad_{k}"
            derive(v, "grad", expect_grad, cases, dropped)
    return cases, dropped


# Other values for the keyword arguments the files use.
KWARGS = {
    "accumulate": [True], "align_corners": [True], "alpha": [-0.5, 3.0],
    "beta": [0.0, 2.0, 0.25], "dim": [0, -1, 2], "eps": [1e-3, 0.1],
    "margin": [0.0, 1.5, -0.3], "p": [1, 3, 1.5, float("inf")],
    "mode": ["nearest", "bicubic", "circular", "constant"],
    "padding_mode": ["border", "reflection"],
    "reduction": ["none", "sum", "mean"], "scale": [1.7], "threshold": [1.0, 0.5],
    "value": [-2.0], "momentum": [0.5], "stride": [3], "padding": [0, 2], "kernel_size": [3],
    "training": [True, False],
}
# Ops that take `reduction` (a variant adds it where the case leaves the default).
LOSSES = ("loss", "kl_div", "cross_entropy", "nll")


def kwarg_variants(doc):
    """The file's cases with one keyword argument changed at a time, and the ones left
    out."""
    cases, dropped = [], []
    expect = expect_grad if doc["suite"] == "grad" else expect_autocast
    for case in doc["cases"]:
        keys = list(case["kwargs"].items())
        if any(w in case["op"] for w in LOSSES) and "reduction" not in case["kwargs"]:
            keys.append(("reduction", "mean"))
        for k, was in keys:
            for value in KWARGS.get(k, []):
                if value == was:
                    continue
                v = copy.deepcopy(case)
                v["kwargs"][k] = value
                v["id"] = f"{case['id']}/{k}={value}"
                derive(v, doc["suite"], expect, cases, dropped)
    return cases, dropped


def write(doc, cases, dropped, path, outdir, suffix, how, what):
    """Writes the derived file `<name>_<suffix>.json` (`what`: its notes' first sentence,
    about the cases of `path`) and reports it."""
    out = dict(doc)
    out["source"] = f"torch {torch.__version__} (cpu), conformance/tools/value_variants.py {how}"
    out["notes"] = f"{what} of {os.path.basename(path)}'s cases {NOTES[suffix]} " + doc.get("notes", "")
    out["cases"] = cases
    name = os.path.splitext(os.path.basename(path))[0]
    with open(os.path.join(outdir, f"{name}_{suffix}.json"), "w") as f:
        json.dump(out, f)
    print(f"{path}: {len(cases)} {suffix}, {len(dropped)} left out", file=sys.stderr)
    for cid, why in dropped:
        print(f"  left out {cid}: {why}", file=sys.stderr)


# The notes each derived file's cases get, by suffix.
NOTES = {
    "values": "(inputs redrawn, expectations computed by PyTorch).",
    "scenarios": "(" + ", ".join(SCENARIOS) + "; see the tool).",
    "subsets": "(one input at a time not requiring grad; see the tool).",
    "kwargs": "(one keyword argument changed at a time; see the tool).",
}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--per-case", type=int, default=1)
    p.add_argument("--range", type=float, nargs=2, default=RANGE, metavar=("LO", "HI"),
                   help="the factors' range (default 0.5 1; a range past 1 or below 0 "
                        "leaves ops' domains, and PyTorch's NaNs become expectations)")
    p.add_argument("files", nargs="+")
    p.add_argument("--scenarios", action="store_true",
                   help="scenario variants of an autocast file (see above)")
    p.add_argument("--subsets", action="store_true",
                   help="requires-grad subsets of grad files (see above)")
    p.add_argument("--kwargs", action="store_true",
                   help="keyword-argument variants of autocast and grad files (see above)")
    a = p.parse_args()
    RANGE[:] = a.range
    *inputs, outdir = a.files
    os.makedirs(outdir, exist_ok=True)
    torch.manual_seed(a.seed)
    for path in inputs:
        doc = json.load(open(path))
        suite = doc["suite"]
        if a.kwargs:
            cases, dropped = kwarg_variants(doc)
            write(doc, cases, dropped, path, outdir, "kwargs", "--kwargs", "Keyword variants")
            continue
        if a.subsets:
            assert suite == "grad", f"{path}: --subsets takes a grad file"
            cases, dropped = subsets(doc)
            write(doc, cases, dropped, path, outdir, "subsets", "--subsets", "Requires-grad subsets")
            continue
        if a.scenarios:
            assert suite == "autocast", f"{path}: --scenarios takes an autocast file"
            differs = os.path.join(os.path.dirname(path), "autocast_cpu_torch_differs.txt")
            cases, dropped = scenarios(doc, differs)
            write(doc, cases, dropped, path, outdir, "scenarios", "--scenarios", "Scenario variants")
            continue
        rng = random.Random(f"{a.seed}/{os.path.basename(path)}")
        cases, dropped = [], []
        for case in doc["cases"]:
            for k in range(a.per_case):
                v = redrawn(suite, case, rng)
                v["id"] = f"{case['id']}/values{a.seed}.{k}"
                derive(v, suite, EXPECT[suite], cases, dropped)
        write(doc, cases, dropped, path, outdir, "values", f"--seed {a.seed}", "Value variants")


if __name__ == "__main__":
    main()
