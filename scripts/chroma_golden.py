#!/usr/bin/env python3
"""Golden files for a future ctuner ChromaTransformer2DModel (issue 34,
docs/chroma.md), written by diffusers itself (scripts/py_deps.sh diffusers).
Not consumed by a test yet: the model is the next step.

Writes into OUT (default tests/data/chroma):
  tiny/transformer/  save_pretrained of a random tiny ChromaTransformer2DModel
      (1 double + 1 single block, heads 2 x 16, axes 4,6,6, joint 32,
      approximator 16 channels, hidden 24, 2 layers; float32, one file)
  tiny/golden.safetensors  the forward's inputs as diffusers takes them
      (hidden_states packed 2x2 (B, L, 4C), encoder_hidden_states (B, T, J),
      timestep (B) in [0, 1] (x1000 inside), img_ids (L, 3), txt_ids (T, 3)
      zeros, attention_mask (B, T + L) of 1/0 over [text; image]: batch 0 has
      text tokens 3.. as padding, batch 1 none), dv the weights of the loss
      sum(out * dv); out and grad.NAME for every parameter with the mask as
      SimpleTuner's training passes it (bool: chroma/model.py model_predict),
      out_pipeline with the mask as ChromaPipeline passes it (float, which
      SDPA adds). Computed in float64 from the stored weights, saved float32.

Usage: py=$(scripts/py_deps.sh diffusers)
  $py scripts/chroma_golden.py [--out DIR] [--seed N]
  $py scripts/chroma_golden.py --check DIR   recompute, compare (exit 1 on a difference)
"""
import argparse
import os
import sys
import tempfile

import torch
from safetensors.torch import load_file, save_file
from diffusers import ChromaTransformer2DModel

CFG = dict(patch_size=1, in_channels=16, num_layers=1, num_single_layers=1, attention_head_dim=16,
           num_attention_heads=2, joint_attention_dim=32, axes_dims_rope=[4, 6, 6],
           approximator_num_channels=16, approximator_hidden_dim=24, approximator_layers=2)
B, H, W, T, PAD_FROM = 2, 4, 6, 5, 3
SEED = 0


def build():
    torch.manual_seed(7 + 1000 * SEED)
    m = ChromaTransformer2DModel(**CFG)
    with torch.no_grad():  # nothing left at 1 or 0: every tensor's role shows
        for n, p in m.named_parameters():
            if n.endswith("norm_q.weight") or n.endswith("norm_k.weight") or "norm" in n:
                p.copy_(1 + 0.2 * torch.randn_like(p))
            elif n.endswith(".bias"):
                p.copy_(0.05 * torch.randn_like(p))
    return m


def pack(x):  # (B, C, H, W) -> (B, H/2 * W/2, C*4), as ChromaPipeline._pack_latents
    b, c, h, w = x.shape
    return x.view(b, c, h // 2, 2, w // 2, 2).permute(0, 2, 4, 1, 3, 5).reshape(b, h * w // 4, c * 4)


def inputs():
    g = torch.Generator().manual_seed(107 + 1000 * SEED)
    C = CFG["in_channels"] // 4
    ids = torch.zeros(H // 2, W // 2, 3)
    ids[..., 1] += torch.arange(H // 2)[:, None]
    ids[..., 2] += torch.arange(W // 2)[None, :]
    L = H * W // 4
    mask = torch.ones(B, T + L)
    mask[0, PAD_FROM:T] = 0  # batch 0: text tokens PAD_FROM.. are padding
    d = {
        "hidden_states": pack(torch.randn(B, C, H, W, generator=g)),
        "encoder_hidden_states": torch.randn(B, T, CFG["joint_attention_dim"], generator=g),
        "timestep": torch.rand(B, generator=g),
        "img_ids": ids.reshape(-1, 3),
        "txt_ids": torch.zeros(T, 3),
        "attention_mask": mask,
    }
    d["dv"] = torch.randn(d["hidden_states"].shape, generator=g)
    return d


def run(model, inp, boolean):
    m = model.to(torch.float64)
    m.zero_grad()
    args = {k: v.to(torch.float64) for k, v in inp.items() if k != "dv"}
    args["attention_mask"] = inp["attention_mask"] > 0 if boolean else args["attention_mask"]
    out = m(**args, return_dict=False)[0]
    (out * inp["dv"].to(torch.float64)).sum().backward()
    return out.detach(), {n: p.grad.detach().clone() for n, p in m.named_parameters()}


def write(outdir):
    tdir = os.path.join(outdir, "tiny", "transformer")
    build().save_pretrained(tdir)
    stored = ChromaTransformer2DModel.from_pretrained(tdir)
    inp = inputs()
    out, grads = run(stored, inp, True)
    out_p, _ = run(stored, inp, False)
    gold = {k: v.float().contiguous() for k, v in inp.items()}
    gold["out"] = out.float()
    gold["out_pipeline"] = out_p.float()
    for n, g in grads.items():
        gold["grad." + n] = g.float().contiguous()
    save_file(gold, os.path.join(outdir, "tiny", "golden.safetensors"))


def main():
    global SEED
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/data/chroma")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--check")
    a = ap.parse_args()
    SEED = a.seed
    if a.check:
        with tempfile.TemporaryDirectory() as tmp:
            write(tmp)
            new = load_file(os.path.join(tmp, "tiny", "golden.safetensors"))
            old = load_file(os.path.join(a.check, "tiny", "golden.safetensors"))
            bad = [k for k in new if k not in old or not torch.allclose(new[k], old[k], rtol=1e-5, atol=1e-6)]
            if bad or set(old) != set(new):
                print("chroma golden differs:", bad[:10], file=sys.stderr)
                return 1
            print("chroma golden: the same")
            return 0
    write(a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
