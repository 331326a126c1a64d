#!/usr/bin/env python3
"""Goldens for the int8 weight quantisers of base_model_precision (tests/test_quant.c).

Quantises a few float32 weights with optimum-quanto (quantize(model,
weights=qint8) + freeze, as SimpleTuner's int8-quanto) and torchao
(quantize_(model, Int8WeightOnlyConfig()), SimpleTuner's int8-torchao) and
writes, per tensor i: w{i} (the float32 weight), quanto_q{i} / torchao_q{i}
(the int8 values, stored as F32: exact) and quanto_s{i} / torchao_s{i} (the
per-output-row scales), plus y{i}: the quanto-quantised nn.Linear's output on
x{i} (the dequantised weight in float32). Runs in the torch2 venv:
scripts/py_deps.sh diffusers, then
  ~/.cache/ctuner/py-venv-torch2/bin/python scripts/quant_golden.py OUT.safetensors
`make interop` regenerates it and runs the suite on the fresh file
(CT_QUANT_DATA=DIR build/ct_tests quant, DIR holding quant_golden.safetensors).
"""
import sys

import torch
from safetensors.torch import save_file


def weights():
    g = torch.Generator().manual_seed(20261126)
    ws = [torch.randn(17, 33, generator=g) * 0.05,
          torch.randn(40, 72, generator=g) * torch.linspace(0.001, 3.0, 40)[:, None],
          torch.randn(5, 512, generator=g) * 0.02]
    ws[2][1, 7] = 0.9  # an outlier: the row's scale follows it
    # exact half steps under quanto's scale absmax / 127 = 1 (ties to even)
    t = torch.tensor([127.0, -127.0, 0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 126.5, 3.0])
    ws.append(torch.stack([t, t * 0.5 + 63.5, -t]))
    return ws


def main(out):
    from optimum.quanto import freeze, qint8, quantize
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    t = {}
    g = torch.Generator().manual_seed(7)
    for i, w in enumerate(weights()):
        lin = torch.nn.Linear(w.shape[1], w.shape[0], bias=False)
        with torch.no_grad():
            lin.weight.copy_(w)
        mq = torch.nn.Sequential(lin)
        quantize(mq, weights=qint8)
        freeze(mq)
        qw = mq[0].weight
        x = torch.randn(3, w.shape[1], generator=g)
        with torch.no_grad():
            y = mq(x)
        la = torch.nn.Linear(w.shape[1], w.shape[0], bias=False)
        with torch.no_grad():
            la.weight.copy_(w)
        ma = torch.nn.Sequential(la)
        quantize_(ma, Int8WeightOnlyConfig())
        aw = ma[0].weight
        t[f"w{i}"] = w.contiguous()
        t[f"x{i}"] = x.contiguous()
        t[f"y{i}"] = y.contiguous()
        t[f"quanto_q{i}"] = qw._data.to(torch.float32).contiguous()
        t[f"quanto_s{i}"] = qw._scale.to(torch.float32).reshape(-1).contiguous()
        t[f"torchao_q{i}"] = aw.qdata.to(torch.float32).contiguous()
        t[f"torchao_s{i}"] = aw.scale.to(torch.float32).reshape(-1).contiguous()
        s_q = w.abs().amax(1) / 127
        s_a = torch.clamp(w.abs().amax(1) / 127.5, min=torch.finfo(torch.float32).eps)
        print(f"w{i} {tuple(w.shape)}: quanto scale == absmax/127: {torch.equal(t[f'quanto_s{i}'], s_q)}, "
              f"torchao scale == max(absmax/127.5, eps): {torch.equal(t[f'torchao_s{i}'], s_a)}",
              file=sys.stderr)
    save_file(t, out, metadata={"optimum-quanto": "0.2.7", "torchao": "0.18.0",
                                "torch": torch.__version__})


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/data/quant/quant_golden.safetensors")
