#!/usr/bin/env python3
"""Golden files for ctuner's diffusers FluxTransformer2DModel load/save and
forward/backward, written by diffusers itself (scripts/py_deps.sh diffusers:
torch 2 + diffusers, their own venv). docs/flux.md says what is checked.

Writes into OUT (default tests/data/flux), per configuration NAME:
  NAME/transformer/  save_pretrained of a random tiny FluxTransformer2DModel
  NAME/golden.safetensors  the forward's inputs as diffusers takes them
        (hidden_states packed 2x2 (B, L, 4C), encoder_hidden_states (B, T, J),
        pooled_projections (B, P), timestep (B) in [0, 1] (diffusers multiplies
        by 1000 inside), img_ids (L, 3) = (0, row, col), txt_ids (T, 3) zeros,
        guidance (B) (dev only, also x1000 inside)), dv (B, L, 4C) the weights
        of the loss sum(out * dv), out (B, L, 4C) the output, and grad.NAME for
        every parameter (diffusers names). Computed in float64 from the stored
        weights, saved float32.
Configurations:
  dev      guidance_embeds, 2 double + 1 single blocks, heads 2 x 16, axes
           4,6,6, joint 32, pooled 16; weights BF16, one file; B 2, latent 4x6, T 5
  schnell  no guidance, 1 double + 1 single; weights F32 sharded (max_shard_size
           small, with diffusion_pytorch_model.safetensors.index.json); B 2,
           latent 6x4, T 3
  kontext/golden.safetensors  FLUX.1 Kontext on the dev weights: hidden_states
           is the target's packed tokens (latent 4x6) followed by a reference
           latent's (6x4), img_ids the target's (0, row, col) followed by the
           reference's (1, row, col), as FluxKontextPipeline.prepare_latents
           and its concatenation; dv is 0 on the reference tokens and out is
           the output sliced to the target tokens (noise_pred[:, :L]), so the
           gradients are those of a loss over the target only. B 2, T 5.
  bfl.safetensors  the schnell weights under BFL names (flux1-dev layout),
           made by to_bfl, the inverse of diffusers' convert_flux_transformer_
           checkpoint_to_diffusers (checked to invert it at FLUX.1's width: the
           converter fixes inner_dim 3072, so it cannot run on the tiny model).
  map_flux1.tsv  diffusers' converter applied at FLUX.1's width (d 3072, 24
           heads, guidance, 1 double + 1 single block; row-labelled tensors that
           take no memory): for each diffusers tensor, which BFL tensor's rows it
           takes: "dif dif_row bfl bfl_row rows" (tests/test_flux.c compares
           ctuner's map with it).

Usage: py=$(scripts/py_deps.sh diffusers)
  $py scripts/flux_golden.py [--out DIR] [--seed N]   write the goldens (N != 0: fresh
        weights and inputs, same shapes)
  $py scripts/flux_golden.py --check DIR           recompute, compare with DIR's (exit 1 on a difference)
  $py scripts/flux_golden.py --roundtrip SAVED --ref DIR/NAME
        SAVED (a transformer directory ctuner wrote) loads with
        FluxTransformer2DModel.from_pretrained: same config, identical tensors
        as DIR/NAME/transformer, the same output on DIR/NAME's inputs
  $py scripts/flux_golden.py --bfl-roundtrip FILE --ref DIR/NAME
        a BFL file ctuner wrote holds DIR/NAME/transformer's tensors under the
        names diffusers' converter reads (to_bfl, its checked inverse)
"""
import argparse
import json
import os
import sys
import tempfile

import torch
from safetensors.torch import load_file, save_file
from diffusers import FluxTransformer2DModel
from diffusers.utils import logging as dlogging
from diffusers.loaders.single_file_utils import convert_flux_transformer_checkpoint_to_diffusers

CONFIGS = {
    "dev": dict(model=dict(num_layers=2, num_single_layers=1, guidance_embeds=True),
                dtype=torch.bfloat16, shard=None, B=2, H=4, W=6, T=5, seed=1),
    "schnell": dict(model=dict(num_layers=1, num_single_layers=1, guidance_embeds=False),
                    dtype=torch.float32, shard="60KB", B=2, H=6, W=4, T=3, seed=2),
}
COMMON = dict(patch_size=1, in_channels=16, attention_head_dim=16, num_attention_heads=2,
              joint_attention_dim=32, pooled_projection_dim=16, axes_dims_rope=[4, 6, 6])


SEED = 0  # --seed: added to every configuration's seed (0: the committed set)


def build(cfg):
    torch.manual_seed(cfg["seed"] + 1000 * SEED)
    m = FluxTransformer2DModel(**COMMON, **cfg["model"])
    with torch.no_grad():  # nothing left at 1 or 0: every tensor's role shows
        for n, p in m.named_parameters():
            if n.endswith("norm_q.weight") or n.endswith("norm_k.weight") or "norm_added" in n:
                p.copy_(1 + 0.2 * torch.randn_like(p))
            elif n.endswith(".bias"):
                p.copy_(0.05 * torch.randn_like(p))
    return m


def pack(x):  # (B, C, H, W) -> (B, H/2 * W/2, C*4), as FluxPipeline._pack_latents
    B, C, H, W = x.shape
    return x.view(B, C, H // 2, 2, W // 2, 2).permute(0, 2, 4, 1, 3, 5).reshape(B, H * W // 4, C * 4)


def inputs(cfg, guidance):
    g = torch.Generator().manual_seed(100 + cfg["seed"] + 1000 * SEED)
    B, H, W, T = cfg["B"], cfg["H"], cfg["W"], cfg["T"]
    C = COMMON["in_channels"] // 4
    ids = torch.zeros(H // 2, W // 2, 3)
    ids[..., 1] += torch.arange(H // 2)[:, None]
    ids[..., 2] += torch.arange(W // 2)[None, :]
    d = {
        "hidden_states": pack(torch.randn(B, C, H, W, generator=g)),
        "encoder_hidden_states": torch.randn(B, T, COMMON["joint_attention_dim"], generator=g),
        "pooled_projections": torch.randn(B, COMMON["pooled_projection_dim"], generator=g),
        "timestep": torch.rand(B, generator=g),
        "img_ids": ids.reshape(-1, 3),
        "txt_ids": torch.zeros(T, 3),
    }
    if guidance:
        d["guidance"] = torch.tensor([3.5, 1.25])[:B]
    d["dv"] = torch.randn(d["hidden_states"].shape, generator=g)
    return d


def run(model, inp):
    """out and the parameter gradients of sum(out * dv), in float64."""
    m = model.to(torch.float64)
    m.zero_grad()
    args = {k: v.to(torch.float64) for k, v in inp.items() if k != "dv"}
    out = m(**args, return_dict=False)[0]
    (out * inp["dv"].to(torch.float64)).sum().backward()
    grads = {n: p.grad.detach().clone() for n, p in m.named_parameters()}
    return out.detach(), grads


def write_config(outdir, name, cfg):
    model = build(cfg)
    tdir = os.path.join(outdir, name, "transformer")
    model.to(cfg["dtype"]).save_pretrained(tdir, max_shard_size=cfg["shard"] or "10GB")
    stored = FluxTransformer2DModel.from_pretrained(tdir)  # exactly what was written
    inp = inputs(cfg, cfg["model"]["guidance_embeds"])
    out, grads = run(stored.to(torch.float32), inp)
    gold = {k: v.float().contiguous() for k, v in inp.items()}
    gold["out"] = out.float()
    for n, g in grads.items():
        gold["grad." + n] = g.float().contiguous()
    save_file(gold, os.path.join(outdir, name, "golden.safetensors"))
    return stored


def ids_of(h, w, first):  # FluxPipeline._prepare_latent_image_ids over an (h, w) token grid
    ids = torch.zeros(h, w, 3)
    ids[..., 0] = first
    ids[..., 1] += torch.arange(h)[:, None]
    ids[..., 2] += torch.arange(w)[None, :]
    return ids.reshape(-1, 3)


def write_kontext(outdir, stored):
    """Kontext's reference tokens on the dev model (pipeline_flux_kontext.py: prepare_latents
    packs image_latents with image_ids[..., 0] = 1; __call__ concatenates latents and
    image_latents on dim 1 and latent_ids and image_ids on dim 0, and slices the prediction
    to latents.size(1))."""
    B, H, W, RH, RW, T = 2, 4, 6, 6, 4, 5
    g = torch.Generator().manual_seed(300 + 1000 * SEED)
    C = COMMON["in_channels"] // 4
    x = pack(torch.randn(B, C, H, W, generator=g))
    ref = pack(torch.randn(B, C, RH, RW, generator=g))
    d = {
        "hidden_states": torch.cat([x, ref], dim=1),
        "encoder_hidden_states": torch.randn(B, T, COMMON["joint_attention_dim"], generator=g),
        "pooled_projections": torch.randn(B, COMMON["pooled_projection_dim"], generator=g),
        "timestep": torch.rand(B, generator=g),
        "img_ids": torch.cat([ids_of(H // 2, W // 2, 0), ids_of(RH // 2, RW // 2, 1)]),
        "txt_ids": torch.zeros(T, 3),
        "guidance": torch.tensor([3.5, 1.25]),  # the dev golden's (float32 sin at 1000x: see docs/kontext.md)
    }
    dv = torch.randn(x.shape, generator=g)
    d["dv"] = torch.cat([dv, torch.zeros_like(ref)], dim=1)  # the loss covers the target only
    out, grads = run(stored.to(torch.float32), d)
    gold = {k: v.float().contiguous() for k, v in d.items()}
    gold["out"] = out[:, : x.shape[1]].float().contiguous()  # noise_pred[:, : latents.size(1)]
    gold["n_target"] = torch.tensor([x.shape[1]], dtype=torch.int32)
    for n, gr in grads.items():
        gold["grad." + n] = gr.float().contiguous()
    os.makedirs(os.path.join(outdir, "kontext"), exist_ok=True)
    save_file(gold, os.path.join(outdir, "kontext", "golden.safetensors"))


def to_bfl(sd):
    """diffusers -> BFL names: the inverse of diffusers' converter (checked against it)."""
    b = {}
    cp = lambda src, dst: [b.__setitem__(dst + s, sd[src + s]) for s in (".weight", ".bias")]
    cp("x_embedder", "img_in")
    cp("context_embedder", "txt_in")
    cp("time_text_embed.timestep_embedder.linear_1", "time_in.in_layer")
    cp("time_text_embed.timestep_embedder.linear_2", "time_in.out_layer")
    cp("time_text_embed.text_embedder.linear_1", "vector_in.in_layer")
    cp("time_text_embed.text_embedder.linear_2", "vector_in.out_layer")
    if "time_text_embed.guidance_embedder.linear_1.weight" in sd:
        cp("time_text_embed.guidance_embedder.linear_1", "guidance_in.in_layer")
        cp("time_text_embed.guidance_embedder.linear_2", "guidance_in.out_layer")
    cp("proj_out", "final_layer.linear")
    for s in (".weight", ".bias"):
        scale, shift = sd["norm_out.linear" + s].chunk(2, dim=0)
        b["final_layer.adaLN_modulation.1" + s] = torch.cat([shift, scale])
    nd = 1 + max([int(k.split(".")[1]) for k in sd if k.startswith("transformer_blocks.")], default=-1)
    ns = 1 + max([int(k.split(".")[1]) for k in sd if k.startswith("single_transformer_blocks.")], default=-1)
    for i in range(nd):
        p, q = f"transformer_blocks.{i}.", f"double_blocks.{i}."
        cp(p + "norm1.linear", q + "img_mod.lin")
        cp(p + "norm1_context.linear", q + "txt_mod.lin")
        for s in (".weight", ".bias"):
            b[q + "img_attn.qkv" + s] = torch.cat([sd[p + "attn.to_" + x + s] for x in "qkv"])
            b[q + "txt_attn.qkv" + s] = torch.cat([sd[p + f"attn.add_{x}_proj" + s] for x in "qkv"])
        b[q + "img_attn.norm.query_norm.scale"] = sd[p + "attn.norm_q.weight"]
        b[q + "img_attn.norm.key_norm.scale"] = sd[p + "attn.norm_k.weight"]
        b[q + "txt_attn.norm.query_norm.scale"] = sd[p + "attn.norm_added_q.weight"]
        b[q + "txt_attn.norm.key_norm.scale"] = sd[p + "attn.norm_added_k.weight"]
        cp(p + "attn.to_out.0", q + "img_attn.proj")
        cp(p + "attn.to_add_out", q + "txt_attn.proj")
        cp(p + "ff.net.0.proj", q + "img_mlp.0")
        cp(p + "ff.net.2", q + "img_mlp.2")
        cp(p + "ff_context.net.0.proj", q + "txt_mlp.0")
        cp(p + "ff_context.net.2", q + "txt_mlp.2")
    for i in range(ns):
        p, q = f"single_transformer_blocks.{i}.", f"single_blocks.{i}."
        for s in (".weight", ".bias"):
            b[q + "linear1" + s] = torch.cat([sd[p + x + s] for x in
                                              ("attn.to_q", "attn.to_k", "attn.to_v", "proj_mlp")])
        cp(p + "proj_out", q + "linear2")
        b[q + "norm.query_norm.scale"] = sd[p + "attn.norm_q.weight"]
        b[q + "norm.key_norm.scale"] = sd[p + "attn.norm_k.weight"]
        cp(p + "norm.linear", q + "modulation.lin")
    return {k: v.contiguous() for k, v in b.items()}


def same_tensors(a, b, what):
    bad = sorted(set(a) ^ set(b))
    bad += [k for k in sorted(set(a) & set(b))
            if a[k].shape != b[k].shape or not torch.equal(a[k].float(), b[k].float())]
    if bad:
        print(f"{what}: {len(bad)} tensors differ or are missing on one side: {bad[:8]}")
    return not bad


def write_bfl(outdir, stored):
    """to_bfl is checked to invert diffusers' converter in flux1_map (the converter
    itself only runs at FLUX.1's width: it fixes inner_dim = 3072)."""
    sd = {k: v.detach().float() for k, v in stored.state_dict().items()}
    save_file(to_bfl(sd), os.path.join(outdir, "bfl.safetensors"), metadata={"format": "pt"})


def flux1_map():
    """diffusers' converter at FLUX.1 width on row-labelled tensors: label = tensor id * 2^20 + row."""
    d, mlp, nd, ns = 3072, 4 * 3072, 1, 1
    shapes = {"img_in": (d, 64), "txt_in": (d, 4096), "time_in.in_layer": (d, 256),
              "time_in.out_layer": (d, d), "vector_in.in_layer": (d, 768), "vector_in.out_layer": (d, d),
              "guidance_in.in_layer": (d, 256), "guidance_in.out_layer": (d, d),
              "final_layer.linear": (64, d), "final_layer.adaLN_modulation.1": (2 * d, d)}
    for i in range(nd):
        for s in ("img", "txt"):
            q = f"double_blocks.{i}.{s}_"
            shapes.update({q + "mod.lin": (6 * d, d), q + "attn.qkv": (3 * d, d), q + "attn.proj": (d, d),
                           q + "mlp.0": (mlp, d), q + "mlp.2": (d, mlp)})
            shapes[q + "attn.norm.query_norm.scale"] = (128,)
            shapes[q + "attn.norm.key_norm.scale"] = (128,)
    for i in range(ns):
        q = f"single_blocks.{i}."
        shapes.update({q + "linear1": (3 * d + mlp, d), q + "linear2": (d, d + mlp),
                       q + "modulation.lin": (3 * d, d), q + "norm.query_norm.scale": (128,),
                       q + "norm.key_norm.scale": (128,)})
    names, ck = [], {}
    for base, shp in shapes.items():
        kinds = [("", shp)] if base.endswith(".scale") else [(".weight", shp), (".bias", shp[:1])]
        for suf, s in kinds:
            tid = len(names)
            names.append(base + suf)
            lab = torch.arange(s[0], dtype=torch.float64) + tid * 2.0 ** 20
            ck[base + suf] = lab if len(s) == 1 else lab[:, None]  # one column: rows are what moves
    conv = convert_flux_transformer_checkpoint_to_diffusers(dict(ck))
    if not same_tensors(to_bfl(conv), ck, "to_bfl vs diffusers' converter at FLUX.1 width"):
        sys.exit(1)
    rows = []
    for dn, t in sorted(conv.items()):
        lab = (t if t.dim() == 1 else t[:, 0]).long().tolist()
        r0 = 0
        while r0 < len(lab):  # runs of consecutive rows of one BFL tensor
            tid, br = divmod(lab[r0], 1 << 20)
            r1 = r0 + 1
            while r1 < len(lab) and lab[r1] == lab[r1 - 1] + 1 and lab[r1] >> 20 == tid:
                r1 += 1
            rows.append(f"{dn}\t{r0}\t{names[tid]}\t{br}\t{r1 - r0}")
            r0 = r1
    return "\n".join(rows) + "\n"


def write_all(outdir):
    os.makedirs(outdir, exist_ok=True)
    stored = {}
    for name, cfg in CONFIGS.items():
        stored[name] = write_config(outdir, name, cfg)
    write_kontext(outdir, stored["dev"])
    write_bfl(outdir, stored["schnell"])
    with open(os.path.join(outdir, "map_flux1.tsv"), "w") as f:
        f.write(flux1_map())


def close(a, b, tol):
    den = max(b.abs().max().item(), 1e-30)
    return (a - b).abs().max().item() / den <= tol


def check(refdir):
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        write_all(tmp)
        for name in list(CONFIGS) + ["kontext"]:
            a = load_file(os.path.join(tmp, name, "golden.safetensors"))
            b = load_file(os.path.join(refdir, name, "golden.safetensors"))
            for k in sorted(set(a) | set(b)):
                if k not in a or k not in b or a[k].shape != b[k].shape or not close(a[k], b[k], 1e-5):
                    print(f"{name}: {k} differs from the committed golden")
                    ok = False
        for f in ("map_flux1.tsv",):
            if open(os.path.join(tmp, f)).read() != open(os.path.join(refdir, f)).read():
                print(f"{f} differs from the committed one")
                ok = False
        ok &= same_tensors(load_file(os.path.join(tmp, "bfl.safetensors")),
                           load_file(os.path.join(refdir, "bfl.safetensors")), "bfl.safetensors")
    print("flux goldens: " + ("same as committed" if ok else "DIFFER"))
    return ok


def roundtrip(saved, ref):
    a = FluxTransformer2DModel.from_pretrained(saved)
    b = FluxTransformer2DModel.from_pretrained(os.path.join(ref, "transformer"))
    skip = ("_diffusers_version", "_name_or_path")
    ca = {k: v for k, v in a.config.items() if k not in skip}
    cb = {k: v for k, v in b.config.items() if k not in skip}
    ok = ca == cb
    if not ok:
        print(f"config differs: {ca} vs {cb}")
    ok &= same_tensors(a.state_dict(), b.state_dict(), "from_pretrained tensors")
    gold = load_file(os.path.join(ref, "golden.safetensors"))
    inp = {k: v for k, v in gold.items() if not k.startswith("grad.") and k != "out"}
    out, _ = run(a.float(), inp)
    if not close(out.float(), gold["out"], 1e-6):
        print("output of the loaded model differs from the golden")
        ok = False
    print(f"{saved}: " + ("loads in diffusers with identical tensors and output" if ok else "MISMATCH"))
    return ok


def bfl_roundtrip(path, ref):
    b = FluxTransformer2DModel.from_pretrained(os.path.join(ref, "transformer"))
    want = to_bfl({k: v.float() for k, v in b.state_dict().items()})
    ok = same_tensors(load_file(path), want, "ctuner's BFL file vs the inverse of diffusers' converter")
    print(f"{path}: " + ("identical to the diffusers model under BFL names" if ok else "MISMATCH"))
    return ok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/data/flux")
    ap.add_argument("--check")
    ap.add_argument("--roundtrip")
    ap.add_argument("--bfl-roundtrip")
    ap.add_argument("--ref")
    ap.add_argument("--seed", type=int, default=0, help="0: the committed set; others: fresh weights and inputs")
    a = ap.parse_args()
    global SEED
    SEED = a.seed
    torch.use_deterministic_algorithms(True)
    dlogging.set_verbosity_error()
    dlogging.disable_progress_bar()
    if a.check:
        sys.exit(0 if check(a.check) else 1)
    if a.roundtrip:
        sys.exit(0 if roundtrip(a.roundtrip, a.ref) else 1)
    if a.bfl_roundtrip:
        sys.exit(0 if bfl_roundtrip(a.bfl_roundtrip, a.ref) else 1)
    write_all(a.out)


if __name__ == "__main__":
    main()
