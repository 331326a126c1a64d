#!/usr/bin/env python3
"""StableDiffusionXLPipeline's images on the tiny SDXL pipeline, the golden of
ctuner's SDXL sampling (tests/test_sdxl_sample.c, docs/sdxl.md).

Run with the venv of `scripts/py_deps.sh diffusers` (PyPI torch 2, diffusers
0.42.1, transformers 5):

    $(scripts/py_deps.sh diffusers) scripts/sdxl_sample_golden.py --pipe tests/data/sdxl_pipe

Writes PIPE/sample_golden.safetensors, per case k (metadata "cases", a JSON
list of {scheduler, prompt, negative (null: none), guidance_scale,
guidance_rescale}; "width", "height", "steps"):

  case{k}.latents_in  (4, h, w)  the initial latents, torch.randn(seed + k),
                                 passed as the pipeline's `latents`
  case{k}.latents_out (4, h, w)  output_type="latent"
  case{k}.image       (H, W, 3)  output_type="np" (float in [0, 1])

The scheduler is the pipeline's (Euler) or `<Class>.from_config(the
pipeline's config)`, as SimpleTuner swaps validation schedulers.
"""
import argparse
import json
import os

import torch
from diffusers import (
    DDIMScheduler,
    DPMSolverMultistepScheduler,
    EulerDiscreteScheduler,
    StableDiffusionXLPipeline,
)
from safetensors.torch import save_file

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WIDTH, HEIGHT, STEPS = 32, 24, 4  # not square: catches a swapped height/width
CASES = [  # scheduler, prompt, negative, guidance_scale, guidance_rescale
    ("euler", "a red square on a blue field", None, 5.0, 0.0),
    ("ddim", "a green circle", "blurry", 4.0, 0.7),
    ("dpm++2m", "two yellow triangles", "", 3.0, 0.0),
    ("euler", "a small blue square", "red", 6.0, 0.5),
]
CLASSES = {
    "euler": EulerDiscreteScheduler,
    "ddim": DDIMScheduler,
    "dpm++2m": DPMSolverMultistepScheduler,
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pipe", default=os.path.join(ROOT, "tests/data/sdxl_pipe"))
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    torch.set_grad_enabled(False)
    pipe = StableDiffusionXLPipeline.from_pretrained(
        a.pipe, torch_dtype=torch.float32, add_watermarker=False
    )
    pipe.set_progress_bar_config(disable=True)
    base = dict(pipe.scheduler.config)
    vf = pipe.vae_scale_factor
    out, meta = {}, []
    for k, (name, prompt, neg, g, r) in enumerate(CASES):
        pipe.scheduler = CLASSES[name].from_config(base)
        gen = torch.Generator().manual_seed(a.seed + k)
        lat = torch.randn((1, 4, HEIGHT // vf, WIDTH // vf), generator=gen)
        kw = dict(
            prompt=prompt,
            negative_prompt=neg,
            height=HEIGHT,
            width=WIDTH,
            num_inference_steps=STEPS,
            guidance_scale=g,
            guidance_rescale=r,
        )
        lout = pipe(**kw, latents=lat.clone(), output_type="latent").images
        img = pipe(**kw, latents=lat.clone(), output_type="np").images
        out[f"case{k}.latents_in"] = lat[0].contiguous()
        out[f"case{k}.latents_out"] = lout[0].float().contiguous()
        out[f"case{k}.image"] = torch.from_numpy(img[0]).float().contiguous()
        meta.append(
            dict(scheduler=name, prompt=prompt, negative=neg, guidance_scale=g, guidance_rescale=r)
        )
    save_file(
        out,
        os.path.join(a.pipe, "sample_golden.safetensors"),
        metadata={
            "cases": json.dumps(meta),
            "width": str(WIDTH),
            "height": str(HEIGHT),
            "steps": str(STEPS),
        },
    )


if __name__ == "__main__":
    main()
