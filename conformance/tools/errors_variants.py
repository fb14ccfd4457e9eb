"""Derives more `errors` cases from conformance/data/errors.json, checked by PyTorch itself.

Each case of errors.json changes one argument of a valid call (`op/argN/kind/1`). This script
re-makes that change with other dtypes and sizes, runs every variant through PyTorch, and keeps
the ones PyTorch refuses, with its exception type and first message line:

- dtype changes (`int64`, `bool`): the argument becomes int32, int64, bool, float64, float16,
  bfloat16 (the other arguments unchanged);
- shape changes (`extra_leading_dim`, `last_dim_plus_3`, `rank_minus_1`, `zero_dim`): the same
  call with every float32 tensor made float64, and with the changed size altered (a leading
  dimension of 2, a last dimension plus 1);

usage: python errors_variants.py ../data/errors.json > ../data/errors_variants.json
(needs torch 2.15 on the CPU; deterministic: the new data comes from a fixed seed).
"""
import copy
import json
import sys
import warnings

import torch

warnings.filterwarnings("ignore")

DT = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32,
      "float64": torch.float64, "int64": torch.int64, "int32": torch.int32, "bool": torch.bool}
GEN = torch.Generator().manual_seed(20261124)


def is_lit(x):
    return isinstance(x, dict) and "dtype" in x and "shape" in x and "data" in x


def to_torch(lit):
    dt = DT[lit["dtype"]]
    if dt.is_floating_point:
        return torch.tensor([float(v) for v in lit["data"]], dtype=torch.float64).to(dt).reshape(lit["shape"])
    return torch.tensor(lit["data"], dtype=dt).reshape(lit["shape"])


def arg(x):
    if is_lit(x):
        return to_torch(x)
    if isinstance(x, list):
        return [arg(v) for v in x]
    return x


def num(v):
    f = float(v)
    if f != f:
        return "nan"
    if f in (float("inf"), float("-inf")):
        return "inf" if f > 0 else "-inf"
    return f


def lit_of(t, requires_grad=False):
    name = next(k for k, v in DT.items() if v == t.dtype)
    flat = t.reshape(-1)
    if t.dtype.is_floating_point:
        data = [num(v) for v in flat.double().tolist()]
    elif t.dtype == torch.bool:
        data = [bool(v) for v in flat.tolist()]
    else:
        data = [int(v) for v in flat.tolist()]
    out = {"dtype": name, "shape": list(t.shape), "data": data}
    if requires_grad:
        out["requires_grad"] = True
    return out


def fresh(shape, dtype):
    n = 1
    for s in shape:
        n *= s
    if dtype == torch.bool:
        return torch.rand(n, generator=GEN).reshape(shape) > 0.5
    if not dtype.is_floating_point:
        return torch.randint(0, 3, (n,), generator=GEN).reshape(shape).to(dtype)
    return torch.randn(n, generator=GEN, dtype=torch.float64).reshape(shape).to(dtype)


def call(name, args, kwargs):
    cur = torch
    for p in name.split(".")[1:]:
        cur = getattr(cur, p)
    return cur(*args, **kwargs)


def refusal(case):
    try:
        call(case["call"], [arg(a) for a in case["args"]], {k: arg(v) for k, v in case["kwargs"].items()})
    except Exception as ex:  # noqa: BLE001 (every refusal counts)
        return {"type": type(ex).__name__, "message": str(ex).splitlines()[0] if str(ex) else ""}
    return None


def all_float32_to(case, dtype):
    out = copy.deepcopy(case)

    def conv(x):
        if is_lit(x) and x["dtype"] == "float32":
            return lit_of(to_torch(x).to(DT[dtype]), x.get("requires_grad", False))
        if isinstance(x, list):
            return [conv(v) for v in x]
        return x
    out["args"] = [conv(a) for a in out["args"]]
    out["kwargs"] = {k: conv(v) for k, v in out["kwargs"].items()}
    return out


def variants(case):
    op, a, kind, _ = case["id"].split("/")
    i = int(a[3:])
    x = case["args"][i]
    if not is_lit(x):
        return
    if kind in ("int64", "bool"):
        for dt in ("int32", "int64", "bool", "float64", "float16", "bfloat16"):
            if dt == kind:
                continue
            v = copy.deepcopy(case)
            v["args"][i] = lit_of(fresh(x["shape"], DT[dt]))
            yield f"{op}/{a}/{dt}/from_{kind}", v
        return
    yield f"{op}/{a}/{kind}/float64", all_float32_to(case, "float64")
    shape = list(x["shape"])
    dt = DT[x["dtype"]]
    if kind == "extra_leading_dim" and shape:
        new = [2] + shape[1:]
    elif kind == "last_dim_plus_3" and shape:
        new = shape[:-1] + [max(1, shape[-1] - 2)]
    else:
        return
    v = copy.deepcopy(case)
    v["args"][i] = lit_of(fresh(new, dt), x.get("requires_grad", False))
    yield f"{op}/{a}/{kind}/2", v


def main(path):
    doc = json.load(open(path))
    out = []
    for case in doc["cases"]:
        for vid, v in variants(case):
            err = refusal(v)
            if err is None:
                continue
            v["id"] = vid
            v["expect_error"] = err
            out.append(v)
    json.dump({"format": "amp-vectors/1", "suite": "errors",
               "source": f"torch {torch.__version__} (cpu), conformance/tools/errors_variants.py",
               "notes": "Variants of errors.json's cases (other dtypes and sizes) that PyTorch refuses.",
               "cases": out}, sys.stdout)
    print(file=sys.stderr, end=f"{len(out)} variants refused by PyTorch\n")


if __name__ == "__main__":
    main(sys.argv[1])
