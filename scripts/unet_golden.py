#!/usr/bin/env python3
"""Golden files for ctuner's U-net (docs/unet.md): diffusers'
UNet2DConditionModel shaped as SDXL's (DownBlock2D + CrossAttnDownBlock2D,
text_time added conditioning, linear projections, GEGLU) but tiny, with random
weights; its forward on a random batch and the gradients of
loss = sum(out * R) (fixed R) for the latents, the text states and every
parameter.

Writes OUT/config.json and OUT/diffusion_pytorch_model.safetensors
(save_pretrained), and OUT/golden.safetensors: in.sample, in.timesteps,
in.encoder_hidden_states, in.text_embeds, in.time_ids, in.r, out.sample,
grad.in.sample, grad.in.encoder_hidden_states and grad.<parameter> for every
parameter.

Two variants: --variant sdxl (the default; tests/data/unet) and --variant sd
(SD 1.x's layout: cross-attention in the first block, 1x1-conv projections, no
added conditioning; tests/data/unet/sd).

Usage: $(scripts/py_deps.sh diffusers) scripts/unet_golden.py --out tests/data/unet [--seed 0] [--variant sd]
       ... scripts/unet_golden.py --check tests/data/unet   (the goldens reproduce)
"""
import argparse
import os

import torch
from diffusers import UNet2DConditionModel
from safetensors.torch import save_file

POOLED, TIME_DIM = 16, 8


VARIANTS = {
    # SDXL's layout: DownBlock2D then cross-attention blocks, text_time, linear projections
    "sdxl": dict(
        block_out_channels=(8, 16),
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        layers_per_block=2,
        transformer_layers_per_block=(1, 2),
        attention_head_dim=(2, 4),  # diffusers reads these as the numbers of heads
        cross_attention_dim=16,
        use_linear_projection=True,
        addition_embed_type="text_time",
        addition_time_embed_dim=TIME_DIM,
        projection_class_embeddings_input_dim=POOLED + 6 * TIME_DIM,
    ),
    # SD 1.x/2.x's: cross-attention first, 1x1-conv projections, no added conditioning
    "sd": dict(
        block_out_channels=(8, 16),
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        layers_per_block=1,
        attention_head_dim=2,
        cross_attention_dim=12,
        use_linear_projection=False,
    ),
}


def build(seed, variant):
    torch.manual_seed(seed)
    unet = UNet2DConditionModel(sample_size=8, in_channels=4, out_channels=4, norm_num_groups=4,
                                **VARIANTS[variant])
    # the norms away from 1 and 0 (their gains stay within [0.5, 2])
    with torch.no_grad():
        for name, p in unet.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    return unet.float().eval()


def run(unet, t):
    """forward and backward of loss = sum(out * in.r) on the inputs in t; adds out.* and grad.*"""
    unet.zero_grad()
    sample = t["in.sample"].clone().requires_grad_()
    enc = t["in.encoder_hidden_states"].clone().requires_grad_()
    added = {"text_embeds": t["in.text_embeds"], "time_ids": t["in.time_ids"]} if "in.time_ids" in t else None
    out = unet(sample, t["in.timesteps"], enc, added_cond_kwargs=added).sample
    (out * t["in.r"]).sum().backward()
    t = dict(t)
    t.update({"out.sample": out.detach(), "grad.in.sample": sample.grad,
              "grad.in.encoder_hidden_states": enc.grad})
    for name, p in unet.named_parameters():
        t["grad." + name] = p.grad
    return t


def check(d):
    """the committed goldens under this diffusers: same output and gradients"""
    from safetensors.torch import load_file
    unet = UNet2DConditionModel.from_pretrained(d).float().eval()
    want = load_file(os.path.join(d, "golden.safetensors"))
    got = run(unet, {k: v for k, v in want.items() if k.startswith("in.")})
    worst = 0.0
    for k, v in want.items():
        e = ((got[k].float() - v).abs().max() / v.abs().max().clamp_min(1e-12)).item()
        worst = max(worst, e) if k.startswith("out.") or k.startswith("grad.in") else worst
        if k.startswith("grad.") and not k.startswith("grad.in"):
            e = ((got[k].float() - v).abs().max() / max(v.abs().max().item(), 1e-6)).item()
            worst = max(worst, e)
    print(f"{d}: goldens reproduce within {worst:.3g} relative")
    if not worst < 1e-5:
        raise SystemExit(f"{d}: the goldens do not reproduce under this diffusers ({worst:.3g})")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--check", help="a golden directory to re-run under this diffusers")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--variant", choices=sorted(VARIANTS), default="sdxl")
    a = ap.parse_args()
    if a.check:
        return check(a.check)
    if not a.out:
        ap.error("--out or --check")
    unet = build(a.seed, a.variant)
    os.makedirs(a.out, exist_ok=True)
    unet.save_pretrained(a.out, safe_serialization=True)
    g = torch.Generator().manual_seed(a.seed + 1)
    B, H, W, Lk = 2, 8, 8, 5
    t = {
        "in.sample": torch.randn(B, 4, H, W, generator=g),
        "in.timesteps": torch.tensor([37.0, 901.0]),
        "in.encoder_hidden_states": torch.randn(B, Lk, unet.config.cross_attention_dim, generator=g),
        "in.r": torch.randn(B, 4, H, W, generator=g),
    }
    if unet.config.addition_embed_type == "text_time":
        t["in.text_embeds"] = torch.randn(B, POOLED, generator=g)
        t["in.time_ids"] = torch.tensor([[1024.0, 768.0, 0.0, 16.0, 1024.0, 1024.0],
                                         [512.0, 512.0, 8.0, 0.0, 768.0, 1024.0]])
    t = run(unet, t)
    save_file({k: v.contiguous().float() for k, v in t.items()}, os.path.join(a.out, "golden.safetensors"))
    n = sum(p.numel() for p in unet.parameters())
    print(f"wrote {a.out}: {n} parameters, out {tuple(t['out.sample'].shape)}")


if __name__ == "__main__":
    main()
