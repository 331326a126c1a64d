#!/usr/bin/env python3
"""One SDXL training step of ctuner against diffusers (docs/sdxl.md, "Training").

ctuner's sdxl task writes a micro-batch's inputs and outputs when
CTUNER_SDXL_DUMP=FILE is set: the latents, the noise (and the noise added to
the latents, which input_perturbation perturbs), the timesteps, the text
states, the pooled embeds, time_ids, its target, its model_pred and its loss.
This script recomputes from the same inputs what SimpleTuner computes with
diffusers' UNet2DConditionModel (the pipeline's unet/) and DDPMScheduler (its
scheduler/ config): noisy_latents = add_noise(latents, noise_in, t), the
target (noise, or get_velocity(latents, noise, t) for v_prediction), the
U-net's prediction with added_cond_kwargs {text_embeds, time_ids}, and the
loss as SimpleTuner's (models/common.py: mse per sample x min-SNR weights
min(snr, gamma) / snr, / (snr + 1) for v_prediction, then the mean).

  python sdxl_train_golden.py check DUMP PIPE        # exit 1 past the tolerance
  python sdxl_train_golden.py golden DUMP PIPE OUT   # DUMP + diffusers' ref_* tensors

The python is scripts/py_deps.sh diffusers (torch 2, diffusers 0.42.1).
"""
import json
import sys

import torch
from diffusers import DDPMScheduler, UNet2DConditionModel
from diffusers.training_utils import compute_snr
from safetensors import safe_open
from safetensors.torch import save_file


def load(path):
    with safe_open(path, "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, f.metadata() or {}


def reference(d, meta, pipe):
    torch.manual_seed(0)
    unet = UNet2DConditionModel.from_pretrained(pipe, subfolder="unet").float().eval()
    sched = DDPMScheduler.from_pretrained(pipe, subfolder="scheduler")
    pred_type = meta.get("prediction_type", "epsilon")
    gamma = float(meta.get("snr_gamma", "0"))
    t = d["timesteps"].long()
    noisy = sched.add_noise(d["latents"], d["noise_in"], t)
    target = d["noise"] if pred_type == "epsilon" else sched.get_velocity(d["latents"], d["noise"], t)
    with torch.no_grad():
        pred = unet(noisy, t, encoder_hidden_states=d["encoder_hidden_states"],
                    added_cond_kwargs={"text_embeds": d["text_embeds"],
                                       "time_ids": d["time_ids"]}).sample
    if gamma > 0:
        snr = compute_snr(sched, t)
        w = torch.stack([snr, gamma * torch.ones_like(t, dtype=snr.dtype)], dim=1).min(dim=1)[0]
        w = w / snr if pred_type == "epsilon" else w / (snr + 1)
        loss = torch.nn.functional.mse_loss(pred.float(), target.float(), reduction="none")
        loss = (loss.mean(dim=list(range(1, loss.ndim))) * w).mean()
    else:
        loss = torch.nn.functional.mse_loss(pred.float(), target.float(), reduction="mean")
    return {"ref_noisy_latents": noisy.float().clone(), "ref_target": target.float().clone(),
            "ref_model_pred": pred.float().clone(), "ref_loss": loss.reshape(1).float().clone()}


def rel(a, b):
    return float((a - b).abs().max() / max(float(b.abs().max()), 1e-12))


def main():
    mode, dump, pipe = sys.argv[1], sys.argv[2], sys.argv[3]
    d, meta = load(dump)
    ref = reference(d, meta, pipe)
    errs = {"noisy_latents": rel(d["noisy_latents"], ref["ref_noisy_latents"]),
            "target": rel(d["target"], ref["ref_target"]),
            "model_pred": rel(d["model_pred"], ref["ref_model_pred"]),
            "loss": rel(d["loss"], ref["ref_loss"])}
    print(json.dumps({"prediction_type": meta.get("prediction_type"), "errors": errs,
                      "loss": float(d["loss"][0]), "ref_loss": float(ref["ref_loss"][0])}))
    if mode == "golden":
        out = {k: v.contiguous() for k, v in d.items()}
        out.update(ref)
        save_file(out, sys.argv[4], metadata=meta)
    if any(e > 1e-4 for e in errs.values()):
        sys.exit(1)


if __name__ == "__main__":
    main()
