"""Writes transformer_encoder_layer.json: PyTorch's nn.TransformerEncoderLayer in float64,
forward and backward, for amp-nn/tests/nn/transformer.rs.

Each case builds a tiny layer (d_model 8, 2 heads, feed-forward 16, dropout 0, training
mode), sets every parameter from a fixed-seed generator, runs it on a fixed-seed input
with a mask, and backpropagates sum(output * grad_output) for a fixed-seed grad_output.
The file holds the settings, the input, the mask (its dtype and where it hides),
grad_output, every parameter (by its
state_dict name), the output, the input's gradient and every parameter's gradient.

Cases:
- `pre_norm_gelu_causal`: norm_first=True, activation="gelu", batch_first=True, the
  causal mask of nn.Transformer.generate_square_subsequent_mask with is_causal=True;
- `post_norm_relu_bool_mask`: norm_first=False, activation="relu", batch_first=False, a
  boolean mask (True: may not attend) that hides a few keys, is_causal=False.

usage: python amp-nn/tests/data/gen_transformer.py > amp-nn/tests/data/transformer_encoder_layer.json
(needs torch on the CPU, e.g. the venv of xtask/torch/torch-baseline; deterministic).
"""
import json

import torch
import torch.nn as nn

torch.set_default_dtype(torch.float64)
D, HEADS, FF, N, L = 8, 2, 16, 2, 5


def flat(t):
    return {"shape": list(t.shape), "data": [float(v) for v in t.detach().reshape(-1).tolist()]}


def case(name, seed, norm_first, activation, batch_first, mask_kind):
    gen = torch.Generator().manual_seed(seed)
    layer = nn.TransformerEncoderLayer(D, HEADS, dim_feedforward=FF, dropout=0.0,
                                       activation=activation, layer_norm_eps=1e-5,
                                       batch_first=batch_first, norm_first=norm_first)
    layer.train()
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
    shape = (N, L, D) if batch_first else (L, N, D)
    x = torch.randn(shape, generator=gen).requires_grad_()
    grad_output = torch.randn(shape, generator=gen)
    if mask_kind == "causal":
        mask = nn.Transformer.generate_square_subsequent_mask(L)
        is_causal = True
    else:
        mask = torch.zeros(L, L, dtype=torch.bool)
        mask[0, 3] = mask[2, 1] = mask[4, 0] = mask[4, 4] = True
        is_causal = False
    y = layer(x, src_mask=mask, is_causal=is_causal)
    (y * grad_output).sum().backward()
    params = dict(layer.named_parameters())
    return {
        "name": name,
        "options": {"d_model": D, "nhead": HEADS, "dim_feedforward": FF, "dropout": 0.0,
                    "activation": activation, "layer_norm_eps": 1e-5,
                    "batch_first": batch_first, "norm_first": norm_first},
        "is_causal": is_causal,
        # JSON has no -inf: the mask as where it hides (a float mask holds -inf there).
        "mask": {"dtype": str(mask.dtype).removeprefix("torch."), "shape": list(mask.shape),
                 "masked": [bool(v) for v in (mask != 0).reshape(-1).tolist()]},
        "input": flat(x),
        "grad_output": flat(grad_output),
        "params": {n: flat(p) for n, p in params.items()},
        "output": flat(y),
        "input_grad": flat(x.grad),
        "param_grads": {n: flat(p.grad) for n, p in params.items()},
    }


def main():
    cases = [
        case("pre_norm_gelu_causal", 21, True, "gelu", True, "causal"),
        case("post_norm_relu_bool_mask", 22, False, "relu", False, "bool"),
    ]
    print(json.dumps({"torch": torch.__version__.split("+")[0], "cases": cases}, indent=1))


if __name__ == "__main__":
    main()
