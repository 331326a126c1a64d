#!/usr/bin/env python3
"""Goldens for the adapter layouts ctuner reads besides peft's (docs/lora.md,
"Adapter files"; src/model/lora_any.c), on scripts/lora_golden.py's "m3"
transformer (tests/data/lora/m3: 2 double + 2 single blocks, d 16) with
diffusers 0.42.1 (scripts/py_deps.sh diffusers).

Each case is an adapter file with random nonzero tensors and the transformer's
output on m3's inputs with it folded in (float64, saved float32):

  kohya        lora_unet_<BFL name>.lora_down/lora_up/alpha on EVERY BFL Linear:
               dense (not block-diagonal) fused qkv up (diffusers copies down to
               q, k and v), one block-diagonal txt qkv (diffusers' "is_sparse"
               split), linear1 / linear2 / modulation of the single blocks,
               final_layer, the embedders; ranks 2 and 3, alphas 3, 1.5, 0.5
               and absent (= rank); some tensors bf16.
  comfyui      diffusion_model.<BFL name>.lora_down... (ComfyUI's save), the
               block modules diffusers converts at this width.
  bfl          diffusion_model.<BFL name>.lora_A/lora_B.weight (ai-toolkit /
               BFL naming), alpha on some.
  lycoris_bfl  LyCORIS on BFL names (lora_unet_<BFL>.hada_w1_a..., lokr_w1...,
               lora_down...): LoHa, LoKr (whole, split, both split) and LoCon.

The reference outputs: for kohya and comfyui diffusers' own converter
(FluxLoraLoaderMixin.lora_state_dict -> _convert_kohya_flux_lora_to_diffusers)
gives the peft tensors, folded in as W += B @ A — except what it cannot do at
this width (linear1: it hard-codes FLUX.1's dims [3072, 3072, 3072, 12288];
final_layer and the embedders: written without the "transformer." prefix, so
load_lora_weights drops them, diffusers' "TODO: alphas"): those follow
ComfyUI's / kohya's rule W_bfl += alpha / rank up @ down. The script checks
that both rules agree on every module the converter handles. BFL names map to
diffusers' through flux_golden.py's to_bfl (checked there to invert diffusers'
single-file converter). LoHa / LoKr follow LyCORIS's rebuild (loha.py,
lokr.py; checked against lycoris.functional when lycoris-lora is installed).

Usage: py=$(scripts/py_deps.sh diffusers)
  $py scripts/lora_files_golden.py [--out DIR] [--seed N]   (default tests/data/lora_files)
  $py scripts/lora_files_golden.py --check DIR   recompute, compare (exit 1 on a difference)
"""
import argparse
import os
import sys
import tempfile

import torch
from safetensors.torch import load_file, save_file
from diffusers import FluxTransformer2DModel
from diffusers.loaders.lora_pipeline import FluxLoraLoaderMixin

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from flux_golden import to_bfl  # noqa: E402

BASE = "tests/data/lora/m3"


def transformer():
    return FluxTransformer2DModel.from_pretrained(os.path.join(BASE, "transformer")).double()


def inputs():
    d = load_file(os.path.join(BASE, "inputs.safetensors"))
    return {k: v.to(torch.float64) for k, v in d.items() if k != "target"}


def output(sd):
    m = transformer()
    m.load_state_dict(sd)
    with torch.no_grad():
        return m(**inputs(), return_dict=False)[0].float().contiguous()


def bfl_rows(sd):
    """For each BFL 2-D weight, the (diffusers name, row) of each of its rows,
    through to_bfl applied to row-labelled tensors."""
    names = sorted(sd)
    lab = {}
    for i, k in enumerate(names):
        r = torch.arange(sd[k].shape[0], dtype=torch.float64) + i * 2.0 ** 20
        lab[k] = r[:, None] if sd[k].dim() == 2 else r
    out = {}
    for kb, t in to_bfl(lab).items():
        if t.dim() == 2 and kb.endswith(".weight"):
            out[kb[:-7]] = [(names[int(v) >> 20], int(v) & ((1 << 20) - 1)) for v in t[:, 0].tolist()]
    return out


def add_bfl(sd, rows, deltas):
    """sd (diffusers names) with each BFL weight's delta added row by row."""
    sd = {k: v.clone() for k, v in sd.items()}
    for kb, dw in deltas.items():
        for r, (dn, dr) in enumerate(rows[kb]):
            sd[dn][dr] += dw[r]
    return sd


def rnd(g, *shape):
    """Random values a float32 file holds exactly (float64 for the arithmetic)."""
    return (0.3 * torch.randn(*shape, generator=g, dtype=torch.float64)).float().double()


def kohya(sd, rows, g, prefix="lora_unet_", dotted=False, only=None):
    """A kohya file on the BFL Linears (only: a name filter) and its BFL deltas."""
    f, deltas = {}, {}
    for n, kb in enumerate(sorted(rows)):
        if only and not only(kb):
            continue
        o, i = len(rows[kb]), sd[rows[kb][0][0]].shape[1]
        key = prefix + (kb if dotted else kb.replace(".", "_"))
        r = 3 if "mlp" in kb else 2
        down, up = rnd(g, r, i), rnd(g, o, r)
        if kb == "double_blocks.1.txt_attn.qkv":  # block-diagonal: diffusers' sparse split
            r = 6
            down, up = rnd(g, r, i), torch.zeros(o, r, dtype=torch.float64)
            for j in range(3):
                up[j * o // 3:(j + 1) * o // 3, 2 * j:2 * j + 2] = rnd(g, o // 3, 2)
        alpha = [3.0, 1.5, None, 0.5][n % 4]
        dt = torch.bfloat16 if n % 5 == 1 else torch.float32
        down, up = down.to(dt).double(), up.to(dt).double()  # the values the file holds
        f[key + ".lora_down.weight"] = down.to(dt)
        f[key + ".lora_up.weight"] = up.to(dt)
        if alpha is not None:
            f[key + ".alpha"] = torch.tensor(alpha, dtype=dt)
        deltas[kb] = (alpha if alpha is not None else r) / r * up @ down
    return f, deltas


def bfl_file(sd, rows, g):
    f, deltas = {}, {}
    for n, kb in enumerate(sorted(rows)):
        o, i = len(rows[kb]), sd[rows[kb][0][0]].shape[1]
        key = "diffusion_model." + kb
        a, b = rnd(g, 2, i), rnd(g, o, 2)
        f[key + ".lora_A.weight"], f[key + ".lora_B.weight"] = a.float(), b.float()
        alpha = 4.0 if n % 3 == 0 else None
        if alpha:
            f[key + ".alpha"] = torch.tensor(alpha)
        deltas[kb] = (alpha / 2 if alpha else 1.0) * b @ a
    return f, deltas


def factor(n):
    """LyCORIS's factorization(n, -1): the most balanced m <= k with m * k = n."""
    m = int(n ** 0.5)
    while n % m:
        m -= 1
    return m, n // m


def lycoris_bfl(sd, rows, g):
    """LoHa on the double blocks' qkv and img mlp, LoKr on linear1 (whole), linear2
    (w2 split), the modulations (both split), LoCon on the rest."""
    f, deltas = {}, {}
    for kb in sorted(rows):
        o, i = len(rows[kb]), sd[rows[kb][0][0]].shape[1]
        key = "lora_unet_" + kb.replace(".", "_")
        if "attn.qkv" in kb or "img_mlp" in kb:
            dim, alpha = 2, 3.0
            w = {k: rnd(g, *s) for k, s in (("hada_w1_a", (o, dim)), ("hada_w1_b", (dim, i)),
                                             ("hada_w2_a", (o, dim)), ("hada_w2_b", (dim, i)))}
            dw = (w["hada_w1_a"] @ w["hada_w1_b"]) * (w["hada_w2_a"] @ w["hada_w2_b"]) * alpha / dim
        elif "linear" in kb or "mod" in kb:
            (ol, ok), (im, inn) = factor(o), factor(i)
            dim, alpha = 1, 2.0
            w = {}
            if "linear1" in kb:  # both whole: scale 1 whatever alpha says
                w["lokr_w1"], w["lokr_w2"] = rnd(g, ol, im), rnd(g, ok, inn)
                w1, w2, s = w["lokr_w1"], w["lokr_w2"], 1.0
            elif "linear2" in kb:
                w["lokr_w1"], w["lokr_w2_a"], w["lokr_w2_b"] = rnd(g, ol, im), rnd(g, ok, dim), rnd(g, dim, inn)
                w1, w2, s = w["lokr_w1"], w["lokr_w2_a"] @ w["lokr_w2_b"], alpha / dim
            else:
                w["lokr_w1_a"], w["lokr_w1_b"] = rnd(g, ol, dim), rnd(g, dim, im)
                w["lokr_w2_a"], w["lokr_w2_b"] = rnd(g, ok, dim), rnd(g, dim, inn)
                w1, w2, s = w["lokr_w1_a"] @ w["lokr_w1_b"], w["lokr_w2_a"] @ w["lokr_w2_b"], alpha / dim
            dw = torch.kron(w1, w2) * s
        else:
            dim, alpha = 2, 1.0
            w = {"lora_down.weight": rnd(g, dim, i), "lora_up.weight": rnd(g, o, dim)}
            dw = w["lora_up.weight"] @ w["lora_down.weight"] * alpha / dim
        for k, v in w.items():
            f[key + "." + k] = v.float()
        f[key + ".alpha"] = torch.tensor(alpha)
        deltas[kb] = dw
    check_lycoris_functional(f, deltas)
    return f, deltas


def check_lycoris_functional(f, deltas):
    try:
        from lycoris.functional import loha, lokr
    except ImportError:
        print("lycoris-lora not installed: LoHa/LoKr rebuilt by the formulas only")
        return
    for kb, dw in deltas.items():
        key = "lora_unet_" + kb.replace(".", "_")
        t = {k[len(key) + 1:]: v.double() for k, v in f.items() if k.startswith(key + ".")}
        if "hada_w1_a" in t:  # functional.loha takes (w1d, w1u, w2d, w2u, t1, t2), gamma = alpha / dim
            ref = loha.diff_weight(t["hada_w1_b"], t["hada_w1_a"], t["hada_w2_b"], t["hada_w2_a"],
                                   None, None, gamma=t["alpha"].item() / t["hada_w1_b"].shape[0])
        elif any(k.startswith("lokr") for k in t):  # gamma = alpha; its rank_scale divides
            ref = lokr.diff_weight(t.get("lokr_w1"), t.get("lokr_w1_a"), t.get("lokr_w1_b"),
                                   t.get("lokr_w2"), t.get("lokr_w2_a"), t.get("lokr_w2_b"), None,
                                   gamma=t["alpha"].item())
        else:
            continue
        e = ((ref.reshape(dw.shape) - dw).abs().max() / dw.abs().max()).item()
        if e > 1e-12:
            sys.exit(f"{kb}: the formula differs from lycoris.functional by {e:.3g}")
    print("LoHa/LoKr deltas equal lycoris.functional's")


def via_diffusers(sd, f):
    """diffusers' own conversion of a kohya/ComfyUI file, folded in as W += B @ A."""
    # float64 copies (the file's values exactly): the converter's alpha scaling then rounds nothing
    conv = FluxLoraLoaderMixin.lora_state_dict({k: v.double() for k, v in f.items()})
    sd = {k: v.clone() for k, v in sd.items()}
    n = 0
    for k, a in conv.items():
        if not k.endswith(".lora_A.weight"):
            continue
        mod = k[: -len(".lora_A.weight")]
        assert mod.startswith("transformer."), k
        b = conv[mod + ".lora_B.weight"]
        sd[mod[len("transformer."):] + ".weight"] += b.double() @ a.double()
        n += 1
    return sd, n


def close(a, b, what, tol=1e-12):
    e = ((a - b).abs().max() / b.abs().max()).item()
    if e > tol:
        sys.exit(f"{what}: differs by {e:.3g}")


def write_all(out, seed):
    g = torch.Generator().manual_seed(1000 + seed)
    base = {k: v.detach() for k, v in transformer().state_dict().items()}
    rows = bfl_rows(base)
    block = lambda kb: ("blocks" in kb and "linear1" not in kb)  # what diffusers converts here
    cases = {}
    f, d = kohya(base, rows, g)
    ref = add_bfl(base, rows, d)
    # diffusers' converter on the modules it handles at this width agrees with the rule
    sub = {k: v for k, v in f.items() if "blocks" in k and "linear1" not in k}
    dd, n = via_diffusers(base, sub)
    dr = add_bfl(base, rows, {kb: v for kb, v in d.items() if block(kb)})
    for k in base:
        close(dd[k], dr[k], f"kohya {k}: diffusers' converter vs alpha / rank up @ down")
    print(f"kohya: diffusers' converter agrees on {n} peft modules")
    cases["kohya"] = (f, output(ref))
    f, d = kohya(base, rows, g, prefix="diffusion_model.", dotted=True, only=block)
    dd, n = via_diffusers(base, f)
    close(output(dd), output(add_bfl(base, rows, d)), "comfyui: diffusers vs the rule", 1e-10)
    cases["comfyui"] = (f, output(dd))
    f, d = bfl_file(base, rows, g)
    cases["bfl"] = (f, output(add_bfl(base, rows, d)))
    f, d = lycoris_bfl(base, rows, g)
    cases["lycoris_bfl"] = (f, output(add_bfl(base, rows, d)))
    for name, (f, o) in cases.items():
        os.makedirs(os.path.join(out, name), exist_ok=True)
        save_file({k: v.contiguous() for k, v in f.items()},
                  os.path.join(out, name, "adapter.safetensors"), metadata={"format": "pt"})
        base_out = output(base)
        save_file({"out": o, "base_out": base_out}, os.path.join(out, name, "golden.safetensors"))
        print(f"{name}: {len(f)} tensors, output moved {((o - base_out).abs().max()).item():.3g}")


def check(ref):
    with tempfile.TemporaryDirectory() as tmp:
        write_all(tmp, 0)
        ok = True
        for name in sorted(os.listdir(tmp)):
            for fn in ("adapter.safetensors", "golden.safetensors"):
                a, b = load_file(os.path.join(tmp, name, fn)), load_file(os.path.join(ref, name, fn))
                for k in sorted(set(a) | set(b)):
                    if k not in a or k not in b or not torch.allclose(a[k].float(), b[k].float(),
                                                                      rtol=1e-5, atol=1e-6):
                        print(f"{name}/{fn}: {k} differs from the committed golden")
                        ok = False
    print("lora_files goldens: " + ("same as committed" if ok else "DIFFER"))
    return ok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/data/lora_files")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--check")
    a = ap.parse_args()
    if a.check:
        sys.exit(0 if check(a.check) else 1)
    write_all(a.out, a.seed)


if __name__ == "__main__":
    main()
