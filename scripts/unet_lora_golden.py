#!/usr/bin/env python3
"""Golden files for ctuner's U-net LoRA (docs/lora.md, "SDXL"): peft's LoRA
on the tiny SDXL-shaped U-net of scripts/unet_golden.py (its committed
weights and inputs, tests/data/unet), with random A and nonzero B; the
output and the gradients of loss = sum(out * in.r) for the latents, the text
states and every lora_A / lora_B; and the adapter as
StableDiffusionXLPipeline.save_lora_weights writes it.

Writes OUT/pytorch_lora_weights.safetensors (save_lora_weights, with the
LoraConfig as metadata), OUT/kohya.safetensors (the same adapter in
sd-scripts' SDXL names: lora_unet_<SGM module>, lora_down/lora_up/alpha) and OUT/golden.safetensors (in.* copied from
BASE/golden.safetensors, out.sample, grad.in.sample,
grad.in.encoder_hidden_states, grad.unet.<module>.lora_A.weight / lora_B.weight).

Usage: $(scripts/py_deps.sh diffusers) scripts/unet_lora_golden.py --base tests/data/unet --out tests/data/unet/lora
       ... --base tests/data/unet --check tests/data/unet/lora [--file F]
   (--check: F, default the committed adapter and its kohya copy, loads with load_lora_weights'
   code path with no missing or unexpected keys and reproduces the goldens)
"""
import argparse
import logging
import os
import re

import torch
from diffusers import StableDiffusionXLPipeline, UNet2DConditionModel
from peft import LoraConfig, get_peft_model_state_dict
from safetensors.torch import load_file, save_file

RANK, ALPHA = 4, 8.0
# SimpleTuner's SDXL default (to_k, to_q, to_v, to_out.0) plus two Linear
# layers outside attention, so both of ctuner's Linear paths are covered
TARGETS = ["to_k", "to_q", "to_v", "to_out.0", "proj_in", "ff.net.2"]
WEIGHTS = "pytorch_lora_weights.safetensors"
KOHYA, KOHYA_ALPHA = "kohya.safetensors", 2.0


def sgm(module, layers_per_block=2):
    """diffusers' module name in SGM's layout (kohya's SDXL names)"""
    per = layers_per_block + 1
    m = re.match(r"(down|up)_blocks\.(\d+)\.attentions\.(\d+)\.(.*)", module)
    if m:
        i, j = int(m.group(2)), int(m.group(3))
        n, what = (1 + i * per + j, "input") if m.group(1) == "down" else (i * per + j, "output")
        return f"{what}_blocks.{n}.1.{m.group(4)}"
    if module.startswith("mid_block.attentions.0."):
        return "middle_block.1." + module[len("mid_block.attentions.0."):]
    return module


def kohya(sd):
    """the adapter as sd-scripts writes SDXL LoRA: lora_unet_<SGM module, dots as _>,
    lora_down = A, lora_up = B scaled so that up * alpha / r = B * lora_alpha / r"""
    out = {}
    for k, v in sd.items():
        mod, which = re.match(r"unet\.(.*)\.lora_([AB])\.weight$", k).groups()
        base = "lora_unet_" + sgm(mod).replace(".", "_")
        if which == "A":
            out[base + ".lora_down.weight"] = v.clone()
            out[base + ".alpha"] = torch.tensor(KOHYA_ALPHA)
        else:
            out[base + ".lora_up.weight"] = v * (ALPHA / KOHYA_ALPHA)
    return out


def inputs(base):
    return {k: v for k, v in load_file(os.path.join(base, "golden.safetensors")).items()
            if k.startswith("in.")}


def run(unet, t):
    unet.zero_grad()
    sample = t["in.sample"].clone().requires_grad_()
    enc = t["in.encoder_hidden_states"].clone().requires_grad_()
    added = {"text_embeds": t["in.text_embeds"], "time_ids": t["in.time_ids"]}
    out = unet(sample, t["in.timesteps"], enc, added_cond_kwargs=added).sample
    (out * t["in.r"]).sum().backward()
    t = dict(t)
    t.update({"out.sample": out.detach(), "grad.in.sample": sample.grad,
              "grad.in.encoder_hidden_states": enc.grad})
    for name, p in unet.named_parameters():
        if "lora_" in name:  # peft's module.lora_A.<adapter>.weight -> diffusers' file name
            t["grad.unet." + re.sub(r"\.lora_([AB])\.[^.]+\.weight$", r".lora_\1.weight", name)] = p.grad
    return t


def load_live(base, path):
    """the adapter file into the base U-net as load_lora_weights does; any
    missing or unexpected key is an error"""
    unet = UNet2DConditionModel.from_pretrained(base).float().eval()
    # as load_lora_weights calls it: unet_config lets it map SGM's block names (kohya's)
    sd, alphas, meta = StableDiffusionXLPipeline.lora_state_dict(path, unet_config=unet.config,
                                                                 return_lora_metadata=True)
    msgs = []

    class H(logging.Handler):
        def emit(self, r):
            msgs.append(r.getMessage())

    h = H(level=logging.WARNING)
    lg = logging.getLogger("diffusers")
    lg.addHandler(h)
    try:
        StableDiffusionXLPipeline.load_lora_into_unet(sd, alphas, unet, metadata=meta)
    finally:
        lg.removeHandler(h)
    bad = [m for m in msgs if "unexpected" in m.lower() or "missing" in m.lower()]
    if bad:
        raise SystemExit(f"{path}: load_lora_weights complains: {bad}")
    for p in unet.parameters():
        p.requires_grad_(True)
    return unet


def check(a):
    want = load_file(os.path.join(a.check, "golden.safetensors"))
    for path in [a.file] if a.file else [os.path.join(a.check, WEIGHTS), os.path.join(a.check, KOHYA)]:
        check_one(a, want, path)


def check_one(a, want, path):
    got = run(load_live(a.base, path), {k: v for k, v in want.items() if k.startswith("in.")})
    worst = 0.0
    for k, v in want.items():
        # kohya's up is B scaled by lora_alpha / alpha: its gradient is another parametrisation's
        if k.startswith("in.") or (k.startswith("grad.unet.") and path.endswith(KOHYA)):
            continue
        if k not in got:
            raise SystemExit(f"{path}: no {k} after loading")
        e = ((got[k].float() - v).abs().max() / v.abs().max().clamp_min(1e-6)).item()
        worst = max(worst, e)
    print(f"{path}: loads with load_lora_weights (no missing/unexpected keys); goldens within "
          f"{worst:.3g} relative")
    if not worst < 1e-5:
        raise SystemExit(f"{path}: the goldens do not reproduce ({worst:.3g})")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True)
    ap.add_argument("--out")
    ap.add_argument("--check")
    ap.add_argument("--file")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    if a.check:
        return check(a)
    if not a.out:
        ap.error("--out or --check")
    unet = UNet2DConditionModel.from_pretrained(a.base).float().eval()
    unet.add_adapter(LoraConfig(r=RANK, lora_alpha=ALPHA, target_modules=TARGETS,
                                init_lora_weights="gaussian"))
    torch.manual_seed(a.seed)
    with torch.no_grad():  # B nonzero (peft starts it at zero), A on the same scale
        for name, p in unet.named_parameters():
            if "lora_B" in name:
                p.copy_(0.2 * torch.randn_like(p))
            elif "lora_A" in name:
                p.copy_(0.3 * torch.randn_like(p))
    os.makedirs(a.out, exist_ok=True)
    cfg = unet.peft_config["default"].to_dict()
    StableDiffusionXLPipeline.save_lora_weights(a.out, unet_lora_layers=get_peft_model_state_dict(unet),
                                                weight_name=WEIGHTS, unet_lora_adapter_metadata=cfg)
    save_file(kohya(load_file(os.path.join(a.out, WEIGHTS))), os.path.join(a.out, KOHYA))
    t = run(unet, inputs(a.base))
    save_file({k: v.contiguous().float() for k, v in t.items()}, os.path.join(a.out, "golden.safetensors"))
    for f in ("golden.safetensors", WEIGHTS, KOHYA):
        os.chmod(os.path.join(a.out, f), 0o644)
    n = sum(p.numel() for n_, p in unet.named_parameters() if "lora_" in n_)
    print(f"wrote {a.out}: {n} LoRA parameters on {len(TARGETS)} targets")


if __name__ == "__main__":
    main()
