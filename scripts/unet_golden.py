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

Usage: $(scripts/py_deps.sh diffusers) scripts/unet_golden.py --out tests/data/unet [--seed 0]
"""
import argparse
import os

import torch
from diffusers import UNet2DConditionModel
from safetensors.torch import save_file

POOLED, TIME_DIM = 16, 8


def build(seed):
    torch.manual_seed(seed)
    unet = UNet2DConditionModel(
        sample_size=8,
        in_channels=4,
        out_channels=4,
        block_out_channels=(8, 16),
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        layers_per_block=2,
        transformer_layers_per_block=(1, 2),
        attention_head_dim=(2, 4),  # diffusers reads these as the numbers of heads
        cross_attention_dim=16,
        norm_num_groups=4,
        use_linear_projection=True,
        addition_embed_type="text_time",
        addition_time_embed_dim=TIME_DIM,
        projection_class_embeddings_input_dim=POOLED + 6 * TIME_DIM,
    )
    # the norms away from 1 and 0 (their gains stay within [0.5, 2])
    with torch.no_grad():
        for name, p in unet.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    return unet.float().eval()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    unet = build(a.seed)
    os.makedirs(a.out, exist_ok=True)
    unet.save_pretrained(a.out, safe_serialization=True)
    g = torch.Generator().manual_seed(a.seed + 1)
    B, H, W, Lk = 2, 8, 8, 5
    sample = torch.randn(B, 4, H, W, generator=g).requires_grad_()
    timesteps = torch.tensor([37.0, 901.0])
    enc = torch.randn(B, Lk, 16, generator=g).requires_grad_()
    text_embeds = torch.randn(B, POOLED, generator=g)
    time_ids = torch.tensor([[1024.0, 768.0, 0.0, 16.0, 1024.0, 1024.0],
                             [512.0, 512.0, 8.0, 0.0, 768.0, 1024.0]])
    out = unet(sample, timesteps, enc,
               added_cond_kwargs={"text_embeds": text_embeds, "time_ids": time_ids}).sample
    r = torch.randn(out.shape, generator=g)
    (out * r).sum().backward()
    t = {
        "in.sample": sample.detach(), "in.timesteps": timesteps, "in.encoder_hidden_states": enc.detach(),
        "in.text_embeds": text_embeds, "in.time_ids": time_ids, "in.r": r,
        "out.sample": out.detach(), "grad.in.sample": sample.grad,
        "grad.in.encoder_hidden_states": enc.grad,
    }
    for name, p in unet.named_parameters():
        t["grad." + name] = p.grad
    save_file({k: v.contiguous().float() for k, v in t.items()}, os.path.join(a.out, "golden.safetensors"))
    n = sum(p.numel() for p in unet.parameters())
    print(f"wrote {a.out}: {n} parameters, out {tuple(out.shape)}")


if __name__ == "__main__":
    main()
