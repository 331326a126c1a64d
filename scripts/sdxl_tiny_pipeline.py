#!/usr/bin/env python3
"""A tiny random SDXL pipeline, saved by diffusers itself, and its text and
VAE goldens.

Run with the venv of `scripts/py_deps.sh diffusers` (PyPI torch 2, diffusers
0.42.1, transformers 5.24.0):

    $(scripts/py_deps.sh diffusers) scripts/sdxl_tiny_pipeline.py --out tests/data/sdxl_pipe

Writes, offline (no hub access), one StableDiffusionXLPipeline directory with
`save_pretrained`, laid out as stabilityai/stable-diffusion-xl-base-1.0 is:

  text_encoder/    CLIPTextModel (CLIP-L-shaped: quick_gelu, eos_token_id 2),
                   hidden 32, 2 layers
  text_encoder_2/  CLIPTextModelWithProjection (OpenCLIP bigG-shaped: gelu,
                   a text_projection), hidden 48, 3 layers, projection_dim 40
  tokenizer/       vocab.json + merges.txt of tests/data/bpe, pad <|endoftext|>
  tokenizer_2/     the same vocabulary, pad "!" (id 0), as SDXL's tokenizer_2
  unet/            UNet2DConditionModel, diffusers' tiny SDXL test shape
                   (text_time addition, cross_attention_dim 32 + 48 = 80,
                   projection_class_embeddings_input_dim 6 x 8 + 40 = 88)
  vae/             AutoencoderKL, 4 latent channels, scaling_factor 0.13025,
                   no shift factor (SDXL's VAE config)
  scheduler/       EulerDiscreteScheduler with SDXL 1.0 base's config

golden.safetensors (F32 / I32; metadata: the prompts):
  text.ids1, text.ids2            the two tokenizers' ids (padding max_length 77)
  text.prompt_embeds (n, 77, 80)  StableDiffusionXLPipeline.encode_prompt:
  text.pooled (n, 40)             hidden_states[-2] of both, concatenated;
                                  text_embeds of text_encoder_2
  text.neg_embeds, text.neg_pooled  the same for NEGATIVE (a negative prompt
                                  given, so no zeros)
  text.hidden1_l{k}, text.hidden2_l{k}  every hidden_states[k] of each encoder
                                  for prompt 0
  vae.image, vae.latents          an image in [-1, 1] and latent_dist.mean x 0.13025
"""
import argparse
import json
import os
import shutil

import torch
from diffusers import AutoencoderKL, EulerDiscreteScheduler, StableDiffusionXLPipeline, UNet2DConditionModel
from safetensors.torch import save_file
from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection, CLIPTokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROMPTS = [
    "a large red circle in the center on a white background",
    "",
    "Ünïcode café — a tiny blue square at the top left, then a very long tail of words "
    "that goes on and on past what the CLIP tokenizer keeps: one two three four five six "
    "seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen seventeen "
    "eighteen nineteen twenty twenty-one twenty-two twenty-three twenty-four twenty-five",
]
NEGATIVE = ["blurry, low quality", "", "a green triangle"]
SDXL_SCHED = {"beta_end": 0.012, "beta_schedule": "scaled_linear", "beta_start": 0.00085,
              "clip_sample": False, "interpolation_type": "linear", "num_train_timesteps": 1000,
              "prediction_type": "epsilon", "sample_max_value": 1.0, "set_alpha_to_one": False,
              "skip_prk_steps": True, "steps_offset": 1, "timestep_spacing": "leading",
              "trained_betas": None, "use_karras_sigmas": False}
TOK_CONFIG = {"add_prefix_space": False, "bos_token": "<|startoftext|>",
              "clean_up_tokenization_spaces": True, "do_lower_case": True,
              "eos_token": "<|endoftext|>", "errors": "replace", "model_max_length": 77,
              "pad_token": "<|endoftext|>", "tokenizer_class": "CLIPTokenizer",
              "unk_token": "<|endoftext|>"}


def jitter(model, seed, scale=0.02):
    """Nudge every parameter off its init value (zeros would hide a wrong name)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g, dtype=torch.float32).to(p.dtype))


def tokenizer(pad):
    bpe = os.path.join(ROOT, "tests/data/bpe")
    return CLIPTokenizer(os.path.join(bpe, "vocab.json"), os.path.join(bpe, "merges.txt"),
                         model_max_length=77, pad_token=pad)


def build(seed):
    torch.manual_seed(seed)
    tok, tok2 = tokenizer("<|endoftext|>"), tokenizer("!")
    c1 = CLIPTextConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                        num_hidden_layers=2, num_attention_heads=2, max_position_embeddings=77,
                        hidden_act="quick_gelu", layer_norm_eps=1e-5, bos_token_id=0,
                        eos_token_id=2, pad_token_id=1, projection_dim=768)
    c2 = CLIPTextConfig(vocab_size=len(tok), hidden_size=48, intermediate_size=96,
                        num_hidden_layers=3, num_attention_heads=4, max_position_embeddings=77,
                        hidden_act="gelu", layer_norm_eps=1e-5, bos_token_id=0, eos_token_id=2,
                        pad_token_id=1, projection_dim=40)
    te1 = CLIPTextModel(c1).eval()
    te2 = CLIPTextModelWithProjection(c2).eval()
    jitter(te1, seed + 1)
    jitter(te2, seed + 2)
    torch.manual_seed(seed + 3)
    unet = UNet2DConditionModel(block_out_channels=(4, 8), layers_per_block=1, sample_size=16,
                                in_channels=4, out_channels=4,
                                down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
                                up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
                                attention_head_dim=(2, 4), use_linear_projection=True,
                                addition_embed_type="text_time", addition_time_embed_dim=8,
                                transformer_layers_per_block=(1, 2),
                                projection_class_embeddings_input_dim=88, cross_attention_dim=80,
                                norm_num_groups=1).eval()
    jitter(unet, seed + 4)
    torch.manual_seed(seed + 5)
    vae = AutoencoderKL(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 2,
                        up_block_types=("UpDecoderBlock2D",) * 2, block_out_channels=(16, 32),
                        layers_per_block=1, latent_channels=4, norm_num_groups=8, sample_size=32,
                        scaling_factor=0.13025, force_upcast=True).eval()
    jitter(vae, seed + 6)
    sched = EulerDiscreteScheduler.from_config(SDXL_SCHED)  # as the hub file, extra fields kept
    return StableDiffusionXLPipeline(vae=vae, text_encoder=te1, text_encoder_2=te2, tokenizer=tok,
                                     tokenizer_2=tok2, unet=unet, scheduler=sched)


def real_layout(d):
    """tokenizer/ and tokenizer_2/ as the SDXL repository holds them:
    vocab.json + merges.txt, tokenizer_config.json, special_tokens_map.json."""
    for sub, pad in (("tokenizer", "<|endoftext|>"), ("tokenizer_2", "!")):
        t = os.path.join(d, sub)
        shutil.rmtree(t)
        os.makedirs(t)
        for f in ("vocab.json", "merges.txt"):
            shutil.copy(os.path.join(ROOT, "tests/data/bpe", f), t)
        cfg = dict(TOK_CONFIG, pad_token=pad)
        with open(os.path.join(t, "tokenizer_config.json"), "w") as f:
            json.dump(cfg, f, indent=2)
        with open(os.path.join(t, "special_tokens_map.json"), "w") as f:
            json.dump({k: cfg[k] for k in ("bos_token", "eos_token", "pad_token", "unk_token")}, f,
                      indent=2)


@torch.no_grad()
def goldens(pipe):
    t = {}
    for i, (tk, te) in enumerate(((pipe.tokenizer, pipe.text_encoder),
                                  (pipe.tokenizer_2, pipe.text_encoder_2)), 1):
        ids = tk(PROMPTS, padding="max_length", max_length=tk.model_max_length, truncation=True,
                 return_tensors="pt").input_ids
        t[f"text.ids{i}"] = ids.to(torch.int32)
        out = te(ids[:1], output_hidden_states=True)
        for k, h in enumerate(out.hidden_states):
            t[f"text.hidden{i}_l{k}"] = h[0].float()
    pe, ne, pp, npool = pipe.encode_prompt(prompt=PROMPTS, device="cpu", num_images_per_prompt=1,
                                           do_classifier_free_guidance=True,
                                           negative_prompt=NEGATIVE)
    t["text.prompt_embeds"], t["text.pooled"] = pe.float(), pp.float()
    t["text.neg_embeds"], t["text.neg_pooled"] = ne.float(), npool.float()
    g = torch.Generator().manual_seed(7)
    img = torch.rand(1, 3, 32, 32, generator=g) * 2 - 1
    t["vae.image"] = img
    t["vae.latents"] = pipe.vae.encode(img).latent_dist.mean * pipe.vae.config.scaling_factor
    return {k: v.contiguous() for k, v in t.items()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(ROOT, "tests/data/sdxl_pipe"))
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    pipe = build(a.seed)
    if os.path.isdir(a.out):
        shutil.rmtree(a.out)
    pipe.save_pretrained(a.out, safe_serialization=True)
    real_layout(a.out)
    meta = {"prompts": json.dumps(PROMPTS), "negative": json.dumps(NEGATIVE)}
    save_file(goldens(pipe), os.path.join(a.out, "golden.safetensors"), metadata=meta)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
