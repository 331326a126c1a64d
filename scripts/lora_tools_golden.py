#!/usr/bin/env python3
"""Goldens and live checks for ctuner's LoRA tools (docs/lora.md): an adapter
ctuner trained on the tiny FLUX.1-dev pipeline (tests/data/flux_pipe/dev) as
diffusers 0.42.1 + peft 0.21.2 read it (scripts/py_deps.sh diffusers).

  ADAPTER  pytorch_lora_weights.safetensors written by `ctuner train`
           (model_type lora, flux_lora_target all+ffs)
  KOHYA    its `ctuner lora export --format comfyui` (kohya's Flux keys)
  MERGED   its `ctuner lora merge` (a diffusers FluxTransformer2DModel directory)

Checks (exit 1 on any failure):
  * FluxPipeline.load_lora_weights(ADAPTER): no missing or unexpected keys
    (diffusers' warnings captured, and peft's state dict of the loaded adapter
    equals the file), r and lora_alpha from its metadata;
  * the pipeline's images with it from the flux_pipe golden's latents at
    joint_attention_kwargs {"scale": 1} and {"scale": 0.5} (written to the
    golden, compared with ctuner by tests/test_lora_tools.c at >= 40 dB);
  * v_pred on the flux_pipe golden's training inputs with the adapter
    (unfused; fuse_lora gives the same within 1e-5), and MERGED's v_pred equals
    it within 1e-5 relative;
  * FluxPipeline.load_lora_weights(KOHYA) converts it (diffusers' kohya path)
    and gives the same transformer output as ADAPTER within 1e-5 relative —
    without single_blocks_N_linear1, whose split diffusers hard-codes to
    FLUX.1's widths (3072 x 3 + 12288): those are checked as weights instead,
    alpha / rank * up @ down == cat(peft's delta weights of to_q, to_k, to_v,
    proj_mlp).

Usage: py=$(scripts/py_deps.sh diffusers)
  $py scripts/lora_tools_golden.py --adapter A --kohya K --merged M [--out GOLDEN]
      (--out: write the golden, else only check)
  $py scripts/lora_tools_golden.py ... --check GOLDEN   also compare with a committed golden
"""
import argparse
import json
import logging
import os
import sys

import torch
from diffusers import FluxPipeline, FluxTransformer2DModel
from peft.utils import get_peft_model_state_dict
from safetensors import safe_open
from safetensors.torch import load_file, save_file

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PIPE = os.path.join(ROOT, "tests/data/flux_pipe/dev")
SCALES = (1.0, 0.5)


class Catch(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.msgs = []

    def emit(self, record):
        self.msgs.append(record.getMessage())


def rel(a, b):
    return ((a.double() - b.double()).abs().max() / b.double().abs().max().clamp_min(1e-30)).item()


def pipeline():
    pipe = FluxPipeline.from_pretrained(PIPE, torch_dtype=torch.float32, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def v_pred(tr, g):
    """The transformer on the flux_pipe golden's training step."""
    h = 16
    img_ids = FluxPipeline._prepare_latent_image_ids(1, h // 2, h // 2, "cpu", torch.float32)
    T = int(g["meta"]["max_sequence_length"])
    with torch.no_grad():
        return tr(hidden_states=g["train.xt"], timestep=g["train.sigma"],
                  guidance=g["train.guidance"], pooled_projections=g["text.pooled"][:1],
                  encoder_hidden_states=g["text.prompt_embeds"][:1], txt_ids=torch.zeros(T, 3),
                  img_ids=img_ids, return_dict=False)[0]


def load_golden():
    path = os.path.join(PIPE, "golden.safetensors")
    g = load_file(path)
    with safe_open(path, "pt") as f:
        g["meta"] = f.metadata()
    return g


def load_checked(pipe, path, name, problems):
    """load_lora_weights with diffusers' warnings caught."""
    catch = Catch()
    lg = logging.getLogger("diffusers")
    lg.addHandler(catch)
    try:
        pipe.load_lora_weights(path, adapter_name=name)
    finally:
        lg.removeHandler(catch)
    bad = [m for m in catch.msgs if "unexpected keys" in m.lower() or "missing keys" in m.lower()
           or "incompatible" in m.lower()]
    if bad:
        problems.append(f"{os.path.basename(path)}: {bad[0][:300]}")


def images(pipe, g, scale):
    prompts = json.loads(g["meta"]["prompts"])[:2]
    kw = dict(prompt=prompts, height=32, width=32, num_inference_steps=4, guidance_scale=3.5,
              max_sequence_length=int(g["meta"]["max_sequence_length"]),
              latents=g["sample.latents_in"].clone(), output_type="np",
              joint_attention_kwargs={"scale": scale})
    with torch.no_grad():
        return torch.from_numpy(pipe(**kw).images.copy())


def psnr(a, b):
    mse = ((a.double() - b.double()) ** 2).mean().item()
    return 200.0 if mse == 0 else 10 * torch.log10(torch.tensor(1.0 / mse)).item()


def check_adapter(pipe, adapter, g, out, problems):
    load_checked(pipe, adapter, "ct", problems)
    mine = load_file(adapter)
    sd = {"transformer." + k: v for k, v in
          get_peft_model_state_dict(pipe.transformer, adapter_name="ct").items()}
    if set(sd) != set(mine):
        problems.append(f"adapter keys differ: {sorted(set(sd) ^ set(mine))[:6]}")
    with safe_open(adapter, "pt") as f:
        meta = json.loads(f.metadata()["lora_adapter_metadata"])
    cfg = pipe.transformer.peft_config["ct"]
    if cfg.r != meta["transformer.r"] or cfg.lora_alpha != meta["transformer.lora_alpha"]:
        problems.append(f"r/alpha {cfg.r}/{cfg.lora_alpha} vs metadata {meta}")
    for s in SCALES:
        out[f"image.scale{s:g}"] = images(pipe, g, s)
    base = g["sample.image"]
    print(f"adapter: {len(mine)} tensors, r {cfg.r}, alpha {cfg.lora_alpha}; image vs the base's "
          f"{psnr(out['image.scale1'], base):.1f} dB (the adapter changes it)")
    out["v_pred"] = v_pred(pipe.transformer, g)


def check_merged(pipe, merged, g, out, problems):
    vm = v_pred(FluxTransformer2DModel.from_pretrained(merged, torch_dtype=torch.float32), g)
    e = rel(vm, out["v_pred"])
    pipe.fuse_lora(lora_scale=1.0, adapter_names=["ct"])
    ef = rel(v_pred(pipe.transformer, g), out["v_pred"])
    pipe.unfuse_lora()
    vb = v_pred(FluxTransformer2DModel.from_pretrained(os.path.join(PIPE, "transformer"),
                                                       torch_dtype=torch.float32), g)
    print(f"merged: v_pred vs the adapter's {e:.2e} (fuse_lora {ef:.2e}); the base differs by "
          f"{rel(vb, out['v_pred']):.2e}")
    if e > 1e-5 or ef > 1e-5:
        problems.append(f"merged v_pred differs by {e:.2e} (fuse_lora {ef:.2e})")


NON_BLOCK = ("lora_unet_final_layer", "lora_unet_img_in", "lora_unet_txt_in", "lora_unet_time_in",
             "lora_unet_vector_in", "lora_unet_guidance_in")
PEFT_NON_BLOCK = ("transformer.proj_out.", "transformer.norm_out.", "transformer.x_embedder.",
                  "transformer.context_embedder.", "transformer.time_text_embed.")
LINEAR1 = (".attn.to_q.", ".attn.to_k.", ".attn.to_v.", ".proj_mlp.")


def kohya_as_weights(pipe, kohya, problems):
    """ComfyUI's reading (W_bfl += alpha / rank * up @ down per lora_unet_<W>) against the
    adapter fused by diffusers (fuse_lora), both under BFL names through flux_golden.py's
    to_bfl (checked there to invert diffusers' own BFL converter)."""
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    from flux_golden import to_bfl
    base = to_bfl({k: v.double() for k, v in FluxTransformer2DModel.from_pretrained(
        os.path.join(PIPE, "transformer"), torch_dtype=torch.float32).state_dict().items()})
    pipe.fuse_lora(lora_scale=1.0, adapter_names=["ct"])
    sd = {k.replace(".base_layer", ""): v for k, v in pipe.transformer.state_dict().items()
          if "lora_" not in k}
    fused = to_bfl({k: v.double() for k, v in sd.items()})
    pipe.unfuse_lora()
    k = load_file(kohya)
    by_kohya = {"lora_unet_" + n[:-len(".weight")].replace(".", "_"): n
                for n in base if n.endswith(".weight")}
    worst, seen = 0.0, set()
    for key in sorted(x[:-len(".lora_down.weight")] for x in k if x.endswith(".lora_down.weight")):
        n = by_kohya.get(key)
        if n is None:
            problems.append(f"kohya {key}: names no weight of the model")
            continue
        down, up = k[key + ".lora_down.weight"].double(), k[key + ".lora_up.weight"].double()
        w = base[n] + k[key + ".alpha"].double() / down.shape[0] * up @ down
        worst = max(worst, rel(w - base[n], fused[n] - base[n]))
        seen.add(n)
    moved = [n for n in base if n not in seen and not torch.equal(base[n], fused[n])]
    print(f"kohya as ComfyUI reads it: {len(seen)} BFL weights, worst {worst:.2e} vs diffusers' "
          f"fuse_lora; {len(moved)} fused weights it lacks")
    if worst > 1e-5 or moved:
        problems.append(f"kohya weights differ by {worst:.2e}; missing {moved[:4]}")


def check_kohya(pipe, adapter, kohya, g, out, problems):
    kohya_as_weights(pipe, kohya, problems)
    pipe.unload_lora_weights()
    # diffusers' converter splits linear1 at FLUX.1's widths and drops the non-block
    # modules (no "transformer." prefix): compare the rest with the peft file's rest
    rest = {x: v for x, v in load_file(kohya).items()
            if "_linear1." not in x and not x.startswith(NON_BLOCK)}
    mine = {x: v for x, v in load_file(adapter).items()
            if not x.startswith(PEFT_NON_BLOCK) and not (
                x.startswith("transformer.single_transformer_blocks.") and
                any(p in x for p in LINEAR1))}
    with safe_open(adapter, "pt") as f:
        meta = f.metadata()
    d = os.path.dirname(os.path.abspath(kohya))
    tmp, tmpk = os.path.join(d, "_ref_part.safetensors"), os.path.join(d, "_kohya_part.safetensors")
    save_file(mine, tmp, metadata=meta)
    save_file(rest, tmpk)
    load_checked(pipe, tmp, "ref", problems)
    vr = v_pred(pipe.transformer, g)
    pipe.unload_lora_weights()
    load_checked(pipe, tmpk, "kohya", problems)
    vk = v_pred(pipe.transformer, g)
    pipe.unload_lora_weights()
    os.remove(tmp)
    os.remove(tmpk)
    e = rel(vk, vr)
    out["v_pred.kohya_part"] = vk
    print(f"kohya through load_lora_weights: {len(rest)} tensors (blocks but linear1), v_pred vs "
          f"the peft file's same modules {e:.2e}")
    if e > 1e-5:
        problems.append(f"kohya v_pred differs by {e:.2e}")


def compare(out, ref_path, problems):
    ref = load_file(ref_path)
    for k in sorted(set(out) | set(ref)):
        if k not in out or k not in ref or out[k].shape != ref[k].shape:
            problems.append(f"golden {k}: missing or shape differs")
            continue
        e = rel(out[k], ref[k])
        if e > 1e-4:
            problems.append(f"golden {k}: {e:.2e}")
    print(f"golden {ref_path}: {len(ref)} tensors compared")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--adapter", required=True)
    ap.add_argument("--kohya", required=True)
    ap.add_argument("--merged", required=True)
    ap.add_argument("--out")
    ap.add_argument("--check")
    a = ap.parse_args()
    torch.set_num_threads(1)
    import diffusers.utils.logging as dlog
    import transformers.utils.logging as tlog
    tlog.set_verbosity_error()
    dlog.set_verbosity_warning()
    dlog.disable_progress_bar()
    g = load_golden()
    problems, out = [], {}
    pipe = pipeline()
    check_adapter(pipe, a.adapter, g, out, problems)
    check_merged(pipe, a.merged, g, out, problems)
    check_kohya(pipe, a.adapter, a.kohya, g, out, problems)
    out = {k: v.float().contiguous() for k, v in out.items()}
    if a.check:
        compare(out, a.check, problems)
    if a.out:
        save_file(out, a.out, metadata={"scales": json.dumps(SCALES),
                                        "pipeline": "tests/data/flux_pipe/dev"})
    for p in problems:
        print("FAIL:", p, file=sys.stderr)
    print("lora_tools check: " + ("OK" if not problems else f"{len(problems)} problems"))
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
