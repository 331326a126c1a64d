#!/usr/bin/env python3
"""Tiny random FLUX.1 pipelines, saved by diffusers itself, and their goldens.

Run with the venv of `scripts/py_deps.sh diffusers` (PyPI torch 2, diffusers
0.42.1, transformers 5.24.0):

    $(scripts/py_deps.sh diffusers) scripts/flux_tiny_pipeline.py --out tests/data/flux_pipe
    $(scripts/py_deps.sh diffusers) scripts/flux_tiny_pipeline.py --check tests/data/flux_pipe

Writes, offline (no hub access), two FluxPipeline directories with
`save_pretrained`, laid out as the FLUX.1 repositories are:

  dev/      guidance_embeds, 2 double + 2 single blocks; every model BF16 as
            FLUX.1-dev ships them, the transformer and T5 in shards with their
            index.json; the scheduler with dynamic shifting (FLUX.1-dev's
            scheduler_config); tokenizer/ as vocab.json + merges.txt and
            tokenizer_2/ as spiece.model + tokenizer.json, as in the repository
  schnell/  no guidance, 1 + 1 blocks, one F32 transformer file, the scheduler
            with shift 1 and no dynamic shifting (FLUX.1-schnell's); its
            text_encoder, text_encoder_2, tokenizer, tokenizer_2 and vae are
            relative symlinks to dev's (they are identical in the real
            repositories too, and a Hugging Face cache snapshot is symlinks)

Components: a CLIPTextModel (quick_gelu, eos_token_id 2 as CLIP-L's config,
so transformers pools at the argmax id) over the CLIP-format vocabulary in
tests/data/bpe; the tiny T5EncoderModel and its SentencePiece tokenizer of
tests/data/t5; a 16-channel AutoencoderKL (factor 2, no quant convs, FLUX's
scaling 0.3611 and shift 0.1159); FluxTransformer2DModel (heads 2 x 16, axes
4,6,6, joint_attention_dim 64 = T5's d_model, pooled 32 = CLIP's width).

golden.safetensors in each (F32, computed in float32 from the stored
weights; metadata gives the settings and the prompts):
  text.t5_ids / text.clip_ids (I32), text.prompt_embeds, text.pooled
      FluxPipeline.encode_prompt for PROMPTS at max_sequence_length 64
  vae.image, vae.latents       an image in [-1, 1] and (mean - shift) * scale
  train.*                      one flow-matching step as SimpleTuner computes
      it: packed x0, noise, sigma, guidance, the model input, v_pred and the
      loss mean((v - (noise - x0))^2)
  sample.latents_in, sample.latents_out (packed), sample.image
      FluxPipeline(prompts[:2], 32x32, 4 steps, guidance 3.5 (dev) / 0
      (schnell), latents given, output_type "np") — the image in [0, 1]
  sched.sigmas, sched.timesteps  the scheduler's after set_timesteps as the
      pipeline called it
"""
import argparse
import json
import os
import shutil
import sys
import tempfile

import numpy as np
import torch
from diffusers import (AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxPipeline,
                       FluxTransformer2DModel)
from diffusers.pipelines.flux.pipeline_flux import calculate_shift, retrieve_timesteps
from safetensors.torch import load_file, save_file
from transformers import (CLIPTextConfig, CLIPTextModel, CLIPTokenizer, T5EncoderModel,
                          T5TokenizerFast)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROMPTS = [
    "a large red circle in the center on a white background",
    "",
    "Ünïcode café — a tiny blue square at the top left, then a very long tail of words "
    "that goes on and on past what the CLIP tokenizer keeps: one two three four five six "
    "seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen seventeen "
    "eighteen nineteen twenty twenty-one twenty-two twenty-three twenty-four twenty-five",
]
MAX_SEQ = 64
SIZE = 32
SHARED = ["text_encoder", "text_encoder_2", "tokenizer", "tokenizer_2", "vae"]


def jitter(model, seed, scale=0.02):
    """Nudge every parameter so that no tensor is left at an exact init value
    (zeros would hide a wrong name map or a missing tensor)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g, dtype=torch.float32).to(p.dtype))


def text_encoders(seed):
    torch.manual_seed(seed)
    bpe = os.path.join(ROOT, "tests/data/bpe")
    tok = CLIPTokenizer(os.path.join(bpe, "vocab.json"), os.path.join(bpe, "merges.txt"),
                        model_max_length=77)
    ccfg = CLIPTextConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                          num_hidden_layers=2, num_attention_heads=2, max_position_embeddings=77,
                          hidden_act="quick_gelu", layer_norm_eps=1e-5, bos_token_id=0,
                          eos_token_id=2, pad_token_id=1, projection_dim=32)
    clip = CLIPTextModel(ccfg).eval()
    jitter(clip, seed + 1)
    t5dir = os.path.join(ROOT, "tests/data/t5")
    t5 = T5EncoderModel.from_pretrained(os.path.join(t5dir, "text_encoder_2")).eval()
    tok2 = T5TokenizerFast.from_pretrained(os.path.join(t5dir, "tokenizer_2"))
    return clip, tok, t5, tok2


def build(flavour, seed, clip, tok, t5, tok2):
    dev = flavour == "dev"
    torch.manual_seed(seed)
    tr = FluxTransformer2DModel(patch_size=1, in_channels=64, num_layers=2 if dev else 1,
                                num_single_layers=2 if dev else 1, attention_head_dim=16,
                                num_attention_heads=2, joint_attention_dim=64,
                                pooled_projection_dim=32, guidance_embeds=dev,
                                axes_dims_rope=(4, 6, 6)).eval()
    jitter(tr, seed + 2)
    torch.manual_seed(seed + 3)
    vae = AutoencoderKL(in_channels=3, out_channels=3,
                        down_block_types=("DownEncoderBlock2D",) * 2,
                        up_block_types=("UpDecoderBlock2D",) * 2, block_out_channels=(16, 32),
                        layers_per_block=1, latent_channels=16, norm_num_groups=8,
                        sample_size=SIZE, scaling_factor=0.3611, shift_factor=0.1159,
                        use_quant_conv=False, use_post_quant_conv=False).eval()
    jitter(vae, seed + 4)
    if dev:
        sched = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=3.0,
                                                use_dynamic_shifting=True, base_shift=0.5,
                                                max_shift=1.15, base_image_seq_len=256,
                                                max_image_seq_len=4096)
    else:
        sched = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=1.0,
                                                use_dynamic_shifting=False)
    return FluxPipeline(scheduler=sched, vae=vae, text_encoder=clip, tokenizer=tok,
                        text_encoder_2=t5, tokenizer_2=tok2, transformer=tr)


CLIP_TOKENIZER_CONFIG = {  # as openai/clip-vit-large-patch14 (FLUX.1's tokenizer/) has it
    "add_prefix_space": False, "bos_token": "<|startoftext|>",
    "clean_up_tokenization_spaces": True, "do_lower_case": True, "eos_token": "<|endoftext|>",
    "errors": "replace", "model_max_length": 77, "pad_token": "<|endoftext|>",
    "tokenizer_class": "CLIPTokenizer", "unk_token": "<|endoftext|>"}


def real_layout(d):
    """The files the FLUX.1 repositories hold, where transformers 5 writes others:
    tokenizer/ as vocab.json + merges.txt (no tokenizer.json), tokenizer_2/ as
    transformers 4 wrote it (spiece.model and tokenizer.json), class names as
    in FLUX.1-dev's model_index.json."""
    tok = os.path.join(d, "tokenizer")
    shutil.rmtree(tok)
    os.makedirs(tok)
    for f in ("vocab.json", "merges.txt"):
        shutil.copy(os.path.join(ROOT, "tests/data/bpe", f), tok)
    with open(os.path.join(tok, "tokenizer_config.json"), "w") as f:
        json.dump(CLIP_TOKENIZER_CONFIG, f, indent=2)
    with open(os.path.join(tok, "special_tokens_map.json"), "w") as f:
        json.dump({k: CLIP_TOKENIZER_CONFIG[k]
                   for k in ("bos_token", "eos_token", "pad_token", "unk_token")}, f, indent=2)
    tok2 = os.path.join(d, "tokenizer_2")
    shutil.rmtree(tok2)
    shutil.copytree(os.path.join(ROOT, "tests/data/t5/tokenizer_2"), tok2)
    mi = os.path.join(d, "model_index.json")
    with open(mi) as f:
        idx = json.load(f)
    idx["tokenizer_2"] = ["transformers", "T5TokenizerFast"]
    with open(mi, "w") as f:
        json.dump(idx, f, indent=2, sort_keys=True)
        f.write("\n")


def save(pipe, flavour, out):
    d = os.path.join(out, flavour)
    if os.path.exists(d):
        shutil.rmtree(d)
    if flavour == "dev":  # FLUX.1-dev ships bf16, its transformer and T5 sharded
        for m in (pipe.transformer, pipe.vae, pipe.text_encoder, pipe.text_encoder_2):
            m.to(torch.bfloat16)
        pipe.save_pretrained(d, safe_serialization=True)
        for name in ("transformer", "text_encoder_2"):
            shutil.rmtree(os.path.join(d, name))
            getattr(pipe, name).save_pretrained(os.path.join(d, name), safe_serialization=True,
                                                max_shard_size="150KB")
        for m in (pipe.transformer, pipe.vae, pipe.text_encoder, pipe.text_encoder_2):
            m.to(torch.float32)
        real_layout(d)
    else:
        pipe.save_pretrained(d, safe_serialization=True)
        real_layout(d)
        for c in SHARED:  # identical to dev's: relative symlinks
            shutil.rmtree(os.path.join(d, c))
            os.symlink(os.path.join("..", "dev", c), os.path.join(d, c))
    return d


def reload_f32(d):
    """The pipeline as stored, computed in float32 (ctuner reads BF16 into F32)."""
    pipe = FluxPipeline.from_pretrained(d, torch_dtype=torch.float32, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def goldens(pipe, flavour, seed):
    dev = flavour == "dev"
    g = torch.Generator().manual_seed(seed + 10)
    t = {}
    with torch.no_grad():
        pe, pooled, _ = pipe.encode_prompt(prompt=PROMPTS, prompt_2=PROMPTS,
                                            max_sequence_length=MAX_SEQ)
        t["text.prompt_embeds"] = pe
        t["text.pooled"] = pooled
        t["text.t5_ids"] = pipe.tokenizer_2(PROMPTS, padding="max_length", max_length=MAX_SEQ,
                                            truncation=True, return_tensors="pt").input_ids
        t["text.clip_ids"] = pipe.tokenizer(PROMPTS, padding="max_length",
                                            max_length=pipe.tokenizer_max_length,
                                            truncation=True, return_tensors="pt").input_ids
        # VAE: an image in [-1, 1] -> (mean - shift) * scale, as SimpleTuner caches it
        img = torch.rand(1, 3, SIZE, SIZE, generator=g) * 2 - 1
        mean = pipe.vae.encode(img).latent_dist.mean
        x0 = (mean - pipe.vae.config.shift_factor) * pipe.vae.config.scaling_factor
        t["vae.image"], t["vae.latents"] = img, x0
        # one training step as SimpleTuner's flow matching does it
        h = SIZE // pipe.vae_scale_factor
        noise = torch.randn(x0.shape, generator=g)
        sigma = torch.tensor([0.6])
        xt = (1 - sigma) * x0 + sigma * noise
        pack = lambda z: FluxPipeline._pack_latents(z, 1, 16, h, h)
        img_ids = FluxPipeline._prepare_latent_image_ids(1, h // 2, h // 2, "cpu", torch.float32)
        txt_ids = torch.zeros(MAX_SEQ, 3)
        guid = torch.tensor([1.0]) if dev else None
        v = pipe.transformer(hidden_states=pack(xt), timestep=sigma,
                             guidance=guid, pooled_projections=pooled[:1],
                             encoder_hidden_states=pe[:1], txt_ids=txt_ids, img_ids=img_ids,
                             return_dict=False)[0]
        target = pack(noise) - pack(x0)
        t["train.x0"], t["train.noise"], t["train.sigma"] = pack(x0), pack(noise), sigma
        t["train.xt"], t["train.v_pred"] = pack(xt), v
        t["train.loss"] = ((v.double() - target.double()) ** 2).mean().float().reshape(1)
        if dev:
            t["train.guidance"] = guid
        # sampling: the pipeline from given (packed) latents
        lat = torch.randn(2, (h // 2) * (h // 2), 64, generator=g)
        steps, gs = 4, (3.5 if dev else 0.0)
        kw = dict(prompt=PROMPTS[:2], height=SIZE, width=SIZE, num_inference_steps=steps,
                  guidance_scale=gs, max_sequence_length=MAX_SEQ, latents=lat.clone())
        out_lat = pipe(output_type="latent", **kw).images
        image = pipe(output_type="np", **kw).images
        t["sample.latents_in"], t["sample.latents_out"] = lat, out_lat
        t["sample.image"] = torch.from_numpy(np.ascontiguousarray(image))
        # the scheduler as the pipeline set it
        seq = lat.shape[1]
        sc = pipe.scheduler.config
        mu = calculate_shift(seq, sc.get("base_image_seq_len", 256),
                             sc.get("max_image_seq_len", 4096), sc.get("base_shift", 0.5),
                             sc.get("max_shift", 1.15))
        sigmas = np.linspace(1.0, 1 / steps, steps)
        ts, _ = retrieve_timesteps(pipe.scheduler, steps, "cpu", sigmas=sigmas, mu=mu)
        t["sched.timesteps"], t["sched.sigmas"] = ts, pipe.scheduler.sigmas
    meta = {"flavour": flavour, "max_sequence_length": str(MAX_SEQ), "size": str(SIZE),
            "steps": "4", "guidance_scale": str(3.5 if dev else 0.0), "sigma": "0.6",
            "prompts": json.dumps(PROMPTS), "mu": repr(float(mu))}
    out = {}
    for k, x in t.items():
        x = x.detach().contiguous()
        out[k] = x.to(torch.int32) if k.endswith("_ids") else x.to(torch.float32)
    return out, meta


def make(out, seed):
    clip, tok, t5, tok2 = text_encoders(seed)
    for flavour in ("dev", "schnell"):
        pipe = build(flavour, seed + (0 if flavour == "dev" else 100), clip, tok, t5, tok2)
        d = save(pipe, flavour, out)
        gold, meta = goldens(reload_f32(d), flavour, seed)
        save_file(gold, os.path.join(d, "golden.safetensors"), metadata=meta)
        print(f"{d}: {len(gold)} golden tensors, loss {gold['train.loss'].item():.6f}",
              file=sys.stderr)


def check(ref, seed):
    """Rebuild in a temporary directory and compare with the committed set."""
    bad = 0
    with tempfile.TemporaryDirectory() as tmp:
        make(tmp, seed)
        for flavour in ("dev", "schnell"):
            a = load_file(os.path.join(ref, flavour, "golden.safetensors"))
            b = load_file(os.path.join(tmp, flavour, "golden.safetensors"))
            for k in sorted(set(a) | set(b)):
                if k not in a or k not in b or a[k].shape != b[k].shape:
                    print(f"{flavour} {k}: missing or shape differs", file=sys.stderr)
                    bad += 1
                    continue
                x, y = a[k].double(), b[k].double()
                e = ((x - y).abs().max() / y.abs().max().clamp(min=1e-30)).item()
                if e > 1e-4:
                    print(f"{flavour} {k}: relative error {e:.3g}", file=sys.stderr)
                    bad += 1
    print("flux_tiny_pipeline check: " + ("OK" if not bad else f"{bad} differences"),
          file=sys.stderr)
    return 1 if bad else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", help="write the pipelines and goldens here")
    ap.add_argument("--check", help="recompute and compare with this committed set")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    torch.set_num_threads(1)
    import diffusers.utils.logging as dlog
    import transformers.utils.logging as tlog
    tlog.set_verbosity_error()  # FluxPipeline's truncation notices on the long prompt
    dlog.set_verbosity_error()
    dlog.disable_progress_bar()
    if a.check:
        sys.exit(check(a.check, a.seed))
    if not a.out:
        ap.error("--out or --check")
    os.makedirs(a.out, exist_ok=True)
    make(a.out, a.seed)


if __name__ == "__main__":
    main()
