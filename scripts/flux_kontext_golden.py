#!/usr/bin/env python3
"""Golden of FLUX.1 Kontext sampling (docs/kontext.md), written by diffusers'
FluxKontextPipeline itself on the tiny FLUX.1 dev pipeline of
scripts/flux_tiny_pipeline.py (its components, unchanged; the pipeline class
only differs).

Writes into OUT (default tests/data/flux_kontext):
  ref.png              a random RGB reference image, 24 wide x 32 high
  golden.safetensors   sample.latents_in (packed, given to the pipeline),
                       sample.latents_out (output_type "latent"), sample.image
                       (output_type "np", [0, 1]); metadata: prompts, steps,
                       guidance_scale, max_area, width, height, max_sequence_length
  FluxKontextPipeline(prompts[:2], image=ref.png (PIL), 32x32, max_area 32*32,
  _auto_resize False, 4 steps, guidance 3.5, latents given).

Usage: py=$(scripts/py_deps.sh diffusers)
  $py scripts/flux_kontext_golden.py [--pipe tests/data/flux_pipe/dev] [--out DIR] [--seed N]
  $py scripts/flux_kontext_golden.py --check DIR    recompute, compare (exit 1 on a difference)
"""
import argparse
import json
import os
import sys
import tempfile

import numpy as np
import torch
from PIL import Image
from safetensors.torch import load_file, save_file
from diffusers import FluxKontextPipeline, FluxPipeline
from diffusers.utils import logging as dlogging

PROMPTS = ["make the square blue", "a red circle on grey"]
W, H, RW, RH, STEPS, GS, MAX_SEQ = 32, 32, 24, 32, 4, 3.5, 64


def make(pipe_dir, out, seed):
    os.makedirs(out, exist_ok=True)
    base = FluxPipeline.from_pretrained(pipe_dir, torch_dtype=torch.float32)
    pipe = FluxKontextPipeline(**base.components)
    pipe.set_progress_bar_config(disable=True)
    g = torch.Generator().manual_seed(500 + seed)
    px = (torch.rand(RH, RW, 3, generator=g) * 255).round().to(torch.uint8).numpy()
    Image.fromarray(px).save(os.path.join(out, "ref.png"))
    ref = Image.open(os.path.join(out, "ref.png")).convert("RGB")
    f = pipe.vae_scale_factor
    lat = torch.randn(2, (H // f // 2) * (W // f // 2), 64, generator=g)
    kw = dict(image=ref, prompt=PROMPTS, height=H, width=W, num_inference_steps=STEPS,
              guidance_scale=GS, max_sequence_length=MAX_SEQ, max_area=W * H, _auto_resize=False)
    with torch.no_grad():
        out_lat = pipe(output_type="latent", latents=lat.clone(), **kw).images
        image = pipe(output_type="np", latents=lat.clone(), **kw).images
    t = {"sample.latents_in": lat, "sample.latents_out": out_lat,
         "sample.image": torch.from_numpy(np.ascontiguousarray(image))}
    meta = {"prompts": json.dumps(PROMPTS), "steps": str(STEPS), "guidance_scale": str(GS),
            "max_area": str(W * H), "width": str(W), "height": str(H),
            "max_sequence_length": str(MAX_SEQ)}
    save_file({k: v.float().contiguous() for k, v in t.items()},
              os.path.join(out, "golden.safetensors"), metadata=meta)


def check(pipe_dir, ref, seed):
    bad = 0
    with tempfile.TemporaryDirectory() as tmp:
        make(pipe_dir, tmp, seed)
        a, b = load_file(os.path.join(ref, "golden.safetensors")), load_file(os.path.join(tmp, "golden.safetensors"))
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b or a[k].shape != b[k].shape:
                print(f"{k}: missing or shape differs")
                bad += 1
                continue
            e = ((a[k].double() - b[k].double()).abs().max() / b[k].abs().max().clamp(min=1e-30)).item()
            if e > 1e-4:
                print(f"{k}: relative error {e:.3g}")
                bad += 1
        if open(os.path.join(ref, "ref.png"), "rb").read() != open(os.path.join(tmp, "ref.png"), "rb").read():
            print("ref.png differs")
            bad += 1
    print("flux_kontext_golden check: " + ("OK" if not bad else f"{bad} differences"))
    return 1 if bad else 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pipe", default="tests/data/flux_pipe/dev")
    ap.add_argument("--out", default="tests/data/flux_kontext")
    ap.add_argument("--check")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    torch.use_deterministic_algorithms(True)
    dlogging.set_verbosity_error()
    dlogging.disable_progress_bar()
    if a.check:
        sys.exit(check(a.pipe, a.check, a.seed))
    make(a.pipe, a.out, a.seed)


if __name__ == "__main__":
    main()
