#!/usr/bin/env python3
"""Goldens for ctuner's DDPM objective and SDXL samplers (src/train/ddpm.c,
sdxl_sched.c, sdxl_sample.c; include/ctuner/diffusion.h) from diffusers
itself (0.42.1, torch 2: scripts/py_deps.sh diffusers):

- DDPMScheduler with SDXL's schedule (scaled_linear 0.00085..0.012, 1000
  steps) and a linear one: alphas_cumprod, add_noise, get_velocity;
  diffusers.training_utils.compute_snr; SimpleTuner's min-SNR weights
  (min(snr, gamma) / snr, or / (snr + 1) for v_prediction) and its loss
  (mean of weight * (pred - target)^2).
- EulerDiscreteScheduler, DDIMScheduler and DPMSolverMultistepScheduler
  (DPM++ 2M) built from SDXL 1.0 base's scheduler_config.json (with the
  prediction type and spacing of each case), driven as
  StableDiffusionXLPipeline.__call__ drives them (pipeline_stable_diffusion_xl.py:
  latents * init_noise_sigma; cat([latents] * 2); scale_model_input; the
  denoiser; uncond + g (text - uncond); rescale_noise_cfg; step) over a
  stand-in denoiser that ctuner's test computes the same way:

      out = 0.7 * x / (1 + |x|) + 0.3 * pooled[b, c] + (0.0005 * t) * text[b, 0, c]

  The latents after every step are recorded.

Writes OUT (default tests/data/sdxl_sched_golden.json).

Usage: $(scripts/py_deps.sh diffusers) scripts/sdxl_sched_golden.py [--out F] [--seed N]
"""
import argparse
import json
import os
import warnings

warnings.filterwarnings("ignore")

import torch  # noqa: E402
from diffusers import (  # noqa: E402
    DDIMScheduler,
    DDPMScheduler,
    DPMSolverMultistepScheduler,
    EulerDiscreteScheduler,
)
from diffusers.pipelines.stable_diffusion_xl.pipeline_stable_diffusion_xl import (  # noqa: E402
    rescale_noise_cfg,
)
from diffusers.training_utils import compute_snr  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
# stabilityai/stable-diffusion-xl-base-1.0 scheduler/scheduler_config.json
SDXL = {"_class_name": "EulerDiscreteScheduler", "_diffusers_version": "0.19.0.dev0",
        "beta_end": 0.012, "beta_schedule": "scaled_linear", "beta_start": 0.00085,
        "clip_sample": False, "interpolation_type": "linear", "num_train_timesteps": 1000,
        "prediction_type": "epsilon", "sample_max_value": 1.0, "set_alpha_to_one": False,
        "skip_prk_steps": True, "steps_offset": 1, "timestep_spacing": "leading",
        "trained_betas": None, "use_karras_sigmas": False}
CLASSES = {"EulerDiscreteScheduler": EulerDiscreteScheduler, "DDIMScheduler": DDIMScheduler,
           "DPMSolverMultistepScheduler": DPMSolverMultistepScheduler}
C, H, W, TT, DT, DP = 4, 3, 5, 2, 4, 4


def fl(t):
    return [float(v) for v in t.reshape(-1).tolist()]


def denoise(x, t, text, pooled):
    s = x / (1 + x.abs())
    return 0.7 * s + 0.3 * pooled[:, :, None, None] + (0.0005 * float(t)) * text[:, 0, :, None, None]


def ddpm_part(g):
    out = []
    for sched in ("scaled_linear", "linear"):
        cfg = dict(SDXL, _class_name="DDPMScheduler", beta_schedule=sched)
        if sched == "linear":
            cfg.update(beta_start=0.0001, beta_end=0.02)
        s = DDPMScheduler.from_config(cfg)
        t = torch.tensor([0, 1, 37, 499, 998, 999])
        x0 = torch.randn(len(t), 2, 2, 2, generator=g)
        noise = torch.randn(len(t), 2, 2, 2, generator=g)
        pred = torch.randn(len(t), 2, 2, 2, generator=g)
        snr = compute_snr(s, t)
        case = {"config": cfg, "alphas_cumprod": fl(s.alphas_cumprod), "t": t.tolist(),
                "x0": fl(x0), "noise": fl(noise), "pred": fl(pred),
                "add_noise": fl(s.add_noise(x0, noise, t)),
                "velocity": fl(s.get_velocity(x0, noise, t)), "snr": fl(snr), "losses": []}
        for pt in ("epsilon", "v_prediction"):
            target = noise if pt == "epsilon" else s.get_velocity(x0, noise, t)
            for gamma in (0.0, 1.0, 5.0):
                if gamma == 0:  # snr_weight (1) x MSE
                    w = torch.ones_like(snr)
                else:  # SimpleTuner: stack([snr, gamma]).min(dim=1)[0] / snr_divisor
                    div = snr + 1 if pt == "v_prediction" else snr
                    w = torch.stack([snr, gamma * torch.ones_like(t)], dim=1).min(dim=1)[0] / div
                loss = torch.nn.functional.mse_loss(pred.float(), target.float(), reduction="none")
                loss = (loss * w.view(-1, 1, 1, 1)).mean()
                case["losses"].append({"prediction_type": pt, "snr_gamma": gamma,
                                       "weights": fl(w), "loss": float(loss)})
        out.append(case)
    return out


def sample_case(g, cls, pt, spacing, steps, guidance, rescale):
    cfg = dict(SDXL, _class_name=cls, prediction_type=pt, timestep_spacing=spacing)
    s = CLASSES[cls].from_config(cfg)
    s.set_timesteps(steps)
    noise = torch.randn(1, C, H, W, generator=g)
    text = torch.randn(2, TT, DT, generator=g)  # [negative, prompt]
    pooled = torch.randn(2, DP, generator=g)
    latents = noise * s.init_noise_sigma
    cfg_on = guidance > 1
    traj = []
    for t in s.timesteps:
        inp = torch.cat([latents] * 2) if cfg_on else latents
        inp = s.scale_model_input(inp, t)
        eps = denoise(inp, t, text if cfg_on else text[1:], pooled if cfg_on else pooled[1:])
        if cfg_on:
            unc, txt = eps.chunk(2)
            eps = unc + guidance * (txt - unc)
            if rescale > 0:
                eps = rescale_noise_cfg(eps, txt, guidance_rescale=rescale)
        latents = s.step(eps, t, latents, return_dict=False)[0]
        traj.append(fl(latents))
    sig = fl(s.sigmas) if hasattr(s, "sigmas") and cls != "DDIMScheduler" else []
    return {"config": cfg, "steps": steps, "guidance_scale": guidance,
            "guidance_rescale": rescale, "noise": fl(noise), "text": fl(text),
            "pooled": fl(pooled), "timesteps": fl(s.timesteps.float()), "sigmas": sig,
            "init_noise_sigma": float(s.init_noise_sigma), "latents": traj}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(HERE, "..", "tests", "data", "sdxl_sched_golden.json"))
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    g = torch.Generator().manual_seed(a.seed)
    cases = []
    for cls in CLASSES:
        for pt in ("epsilon", "v_prediction"):
            cases.append(sample_case(g, cls, pt, "leading", 6, 5.0, 0.0))
        cases.append(sample_case(g, cls, "epsilon", "trailing", 5, 7.5, 0.7))
        cases.append(sample_case(g, cls, "epsilon", "linspace", 4, 1.0, 0.0))
        cases.append(sample_case(g, cls, "v_prediction", "leading", 20, 3.0, 0.3))
    with open(a.out, "w") as f:
        json.dump({"ddpm": ddpm_part(g), "sample": cases, "shape": [C, H, W, TT, DT, DP]}, f)
        f.write("\n")
    print(f"wrote {a.out}: {len(cases)} sampling cases")


if __name__ == "__main__":
    main()
