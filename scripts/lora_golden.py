#!/usr/bin/env python3
"""Golden files for ctuner's standard LoRA (docs/lora.md), written by peft on
diffusers' FluxTransformer2DModel (scripts/py_deps.sh diffusers: torch 2 +
diffusers 0.42.1 + peft 0.21.2, their own venv).

For each of SimpleTuner's flux_lora_target presets (its
Flux.get_lora_target_layers, lora_type standard), peft's LoraConfig(r=RANK,
lora_alpha=ALPHA, target_modules=the preset's list) is put on a random tiny
transformer; A and B are then set to random values (B nonzero, so the test can
fail), the adapter is saved with FluxPipeline.save_lora_weights (names
transformer.<module>.lora_A/B.weight, the LoraConfig as lora_adapter_metadata),
and the loss mean((out - target)^2) and every adapter gradient are computed in float64.

Writes into OUT (default tests/data/lora):
  MODEL/transformer/   save_pretrained of the base (BF16), MODEL = m3 (2 double +
                       2 single blocks) or m21 (1 double + 21 single blocks: the
                       tiny and nano presets name single blocks 7 and 20)
  MODEL/inputs.safetensors  diffusers' forward inputs (as tests/data/flux) and target
  PRESET/pytorch_lora_weights.safetensors   the adapter (peft/diffusers file)
  PRESET/golden.safetensors  loss (1), grad.<tensor name in the file> per tensor
Preset directories are named with '+' as '_'.

Usage: py=$(scripts/py_deps.sh diffusers)
  $py scripts/lora_golden.py [--out DIR] [--seed N]  write the goldens (N != 0: fresh
        weights, adapters and inputs, same shapes)
  $py scripts/lora_golden.py --check DIR        recompute and compare (exit 1 on a difference)
  $py scripts/lora_golden.py --load FILE --ref DIR/PRESET
        FILE (an adapter ctuner wrote) loads with the transformer's
        load_lora_adapter: no missing or unexpected keys, and the output on the
        golden inputs equals the one with DIR/PRESET's adapter swapped for FILE's
        tensors (ctuner's values, peft's graph)
"""
import argparse
import json
import os
import sys

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from diffusers import FluxPipeline, FluxTransformer2DModel
from peft import LoraConfig, get_peft_model_state_dict, set_peft_model_state_dict

RANK, ALPHA = 2, 3.0  # scale alpha / rank = 1.5, so a wrong scale shows

# SimpleTuner's lists (simpletuner/helpers/models/flux/model.py); "mmdit" is not a
# case there and falls through to DEFAULT_LORA_TARGET.
PRESETS = {
    "mmdit": ["to_k", "to_q", "to_v", "to_out.0", "to_qkv"],
    "context": ["add_k_proj", "add_q_proj", "add_v_proj", "to_add_out"],
    "context+ffs": ["add_k_proj", "add_q_proj", "add_v_proj", "to_add_out",
                    "ff_context.net.0.proj", "ff_context.net.2"],
    "all": ["to_k", "to_q", "to_v", "add_k_proj", "add_q_proj", "add_v_proj", "to_out.0",
            "to_add_out"],
    "all+ffs": ["to_k", "to_q", "to_v", "add_k_proj", "add_q_proj", "add_v_proj", "to_out.0",
                "to_add_out", "ff.net.0.proj", "ff.net.2", "ff_context.net.0.proj",
                "ff_context.net.2", "proj_mlp", "proj_out"],
    "ai-toolkit": ["to_q", "to_k", "to_v", "add_q_proj", "add_k_proj", "add_v_proj", "to_out.0",
                   "to_add_out", "ff.net.0.proj", "ff.net.2", "ff_context.net.0.proj",
                   "ff_context.net.2", "norm.linear", "norm1.linear", "norm1_context.linear",
                   "proj_mlp", "proj_out"],
    "tiny": ["single_transformer_blocks.7.proj_out", "single_transformer_blocks.20.proj_out"],
    "nano": ["single_transformer_blocks.7.proj_out"],
    "all+ffs+embedder": ["x_embedder", "to_k", "to_q", "to_v", "to_out.0", "add_k_proj",
                         "add_q_proj", "add_v_proj", "to_add_out", "ff.net.0.proj", "ff.net.2",
                         "ff_context.net.0.proj", "ff_context.net.2", "proj_mlp", "proj_out"],
}
# not a preset: norm_out.linear, whose halves BFL keeps swapped (shift;scale), and the
# modulations (tests/test_lora.c lists the same targets)
PRESETS["norm_out"] = ["norm_out.linear", "norm1.linear", "norm1_context.linear", "norm.linear"]
# not a preset: peft's DoRA (use_dora=True) on fused q/k/v, a single block's
# linear1 split (to_q + proj_mlp), norm_out.linear's swapped halves and a feed-forward
PRESETS["dora"] = ["to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "proj_mlp", "proj_out",
                   "norm_out.linear", "ff.net.0.proj"]
DORA = {"dora"}
MODELS = {"m3": dict(num_layers=2, num_single_layers=2, seed=11),
          "m21": dict(num_layers=1, num_single_layers=21, seed=12)}
COMMON = dict(patch_size=1, in_channels=16, attention_head_dim=8, num_attention_heads=2,
              joint_attention_dim=16, pooled_projection_dim=8, axes_dims_rope=[2, 2, 4],
              guidance_embeds=True)
B, H, W, T = 2, 4, 4, 3
SEED = 0  # --seed: added to every seed (0: the committed set)


def model_of(preset):
    return "m21" if preset in ("tiny", "nano") else "m3"


def dirname(preset):
    return preset.replace("+", "_")


def build(name):
    cfg = MODELS[name]
    torch.manual_seed(cfg["seed"] + 1000 * SEED)
    m = FluxTransformer2DModel(**COMMON, num_layers=cfg["num_layers"],
                               num_single_layers=cfg["num_single_layers"])
    with torch.no_grad():  # modulations and the final layer nonzero: every path counts
        for n, p in m.named_parameters():
            if "norm_q" in n or "norm_k" in n or "norm_added" in n:
                p.copy_(1 + 0.2 * torch.randn_like(p))
            elif n.endswith(".bias"):
                p.copy_(0.05 * torch.randn_like(p))
            else:
                p.copy_(0.12 * torch.randn_like(p))
    return m


def pack(x):
    b, c, h, w = x.shape
    return x.view(b, c, h // 2, 2, w // 2, 2).permute(0, 2, 4, 1, 3, 5).reshape(b, h * w // 4, c * 4)


def inputs(seed):
    g = torch.Generator().manual_seed(seed + 1000 * SEED)
    C = COMMON["in_channels"] // 4
    ids = torch.zeros(H // 2, W // 2, 3)
    ids[..., 1] += torch.arange(H // 2)[:, None]
    ids[..., 2] += torch.arange(W // 2)[None, :]
    d = {"hidden_states": pack(torch.randn(B, C, H, W, generator=g)),
         "encoder_hidden_states": torch.randn(B, T, COMMON["joint_attention_dim"], generator=g),
         "pooled_projections": torch.randn(B, COMMON["pooled_projection_dim"], generator=g),
         "timestep": torch.rand(B, generator=g),
         "img_ids": ids.reshape(-1, 3), "txt_ids": torch.zeros(T, 3),
         "guidance": torch.tensor([3.5, 1.25])}
    d["target"] = torch.randn(d["hidden_states"].shape, generator=g)
    return d


def with_adapter(base_dir, preset, seed):
    m = FluxTransformer2DModel.from_pretrained(base_dir).to(torch.float32)
    m.add_adapter(LoraConfig(r=RANK, lora_alpha=ALPHA, target_modules=PRESETS[preset],
                             init_lora_weights=True, use_dora=preset in DORA))
    g = torch.Generator().manual_seed(seed + 1000 * SEED)
    with torch.no_grad():
        for n, p in m.named_parameters():
            if "lora_A" in n or "lora_B" in n:  # B nonzero: the test can fail
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
            elif "lora_magnitude_vector" in n:  # DoRA: off its initial ||W||
                p.mul_(1 + 0.2 * torch.randn(p.shape, generator=g))
    return m


def run(m, inp):
    """loss mean((out - target)^2) (the flow-matching loss's form) and the adapter
    gradients, float64."""
    m = m.to(torch.float64)
    for n, p in m.named_parameters():
        p.requires_grad_("lora_" in n)
    args = {k: v.to(torch.float64) for k, v in inp.items() if k != "target"}
    out = m(**args, return_dict=False)[0]
    loss = ((out - inp["target"].to(torch.float64)) ** 2).mean()
    loss.backward()
    sd = get_peft_model_state_dict(m)  # the names save_lora_weights writes, without "transformer."
    grads = {}
    for n, p in m.named_parameters():
        if p.grad is not None:
            key = n.replace(".default", "")
            if key not in sd and key.endswith(".weight") and key[:-7] in sd:
                key = key[:-7]  # DoRA's lora_magnitude_vector is saved without ".weight"
            assert key in sd, key
            grads["transformer." + key] = p.grad.detach().float().contiguous()
    return loss.detach(), out.detach(), grads


def write(out):
    for name in MODELS:
        tdir = os.path.join(out, name, "transformer")
        build(name).to(torch.bfloat16).save_pretrained(tdir)
        inp = inputs(21 + len(name))
        save_file({k: v.float().contiguous() for k, v in inp.items()},
                  os.path.join(out, name, "inputs.safetensors"))
    for i, preset in enumerate(PRESETS):
        name = model_of(preset)
        base = os.path.join(out, name, "transformer")
        m = with_adapter(base, preset, 500 + i)
        pdir = os.path.join(out, dirname(preset))
        os.makedirs(pdir, exist_ok=True)
        cfg = m.peft_config["default"].to_dict()
        FluxPipeline.save_lora_weights(pdir, transformer_lora_layers=get_peft_model_state_dict(m),
                                       transformer_lora_adapter_metadata=cfg)
        inp = load_file(os.path.join(out, name, "inputs.safetensors"))
        loss, _, grads = run(m, inp)
        gold = {"loss": loss.reshape(1).float()}
        gold.update({"grad." + k: v for k, v in grads.items()})
        save_file(gold, os.path.join(pdir, "golden.safetensors"))
        print(f"{preset}: {len(grads)} adapter tensors, loss {loss.item():.6g}")


def load_file_as_pipeline(m, path, name):
    """As FluxPipeline.load_lora_weights: the state dict and its lora_adapter_metadata."""
    sd, meta = FluxPipeline.lora_state_dict(path, return_lora_metadata=True)
    m.load_lora_adapter(sd, prefix="transformer", adapter_name=name, metadata=meta)


def check(out):
    bad = 0
    for preset in PRESETS:
        name = model_of(preset)
        pdir = os.path.join(out, dirname(preset))
        m = FluxTransformer2DModel.from_pretrained(os.path.join(out, name, "transformer")).float()
        load_file_as_pipeline(m, os.path.join(pdir, "pytorch_lora_weights.safetensors"), "default")
        inp = load_file(os.path.join(out, name, "inputs.safetensors"))
        loss, _, grads = run(m, inp)
        gold = load_file(os.path.join(pdir, "golden.safetensors"))
        e = abs(loss.item() - gold["loss"].item()) / abs(gold["loss"].item())
        worst = max((g - gold["grad." + k]).abs().max().item() /
                    gold["grad." + k].abs().max().clamp_min(1e-30).item() for k, g in grads.items())
        missing = set(k[5:] for k in gold if k.startswith("grad.")) ^ set(grads)
        ok = e < 1e-5 and worst < 1e-5 and not missing
        bad += not ok
        print(f"{preset}: loss {e:.2e}, worst gradient {worst:.2e}, "
              f"{len(missing)} names differ: {'ok' if ok else 'DIFFERS'}")
    return bad


def load_check(path, ref):
    """FILE loads into peft with no missing/unexpected keys; outputs equal."""
    preset = os.path.basename(ref.rstrip("/")).replace("_", "+")
    root = os.path.dirname(ref.rstrip("/"))
    name = model_of(preset)
    inp = load_file(os.path.join(root, name, "inputs.safetensors"))
    args = {k: v.to(torch.float64) for k, v in inp.items() if k != "target"}
    m = FluxTransformer2DModel.from_pretrained(os.path.join(root, name, "transformer")).float()
    load_file_as_pipeline(m, path, "ct")
    with safe_open(path, "pt") as f:
        meta = json.loads(f.metadata()["lora_adapter_metadata"])
    cfg = m.peft_config["ct"]
    problems = []
    if cfg.r != meta["transformer.r"] or cfg.lora_alpha != meta["transformer.lora_alpha"]:
        problems.append(f"config r {cfg.r} alpha {cfg.lora_alpha} vs metadata {meta}")
    sd = {("transformer." + k.replace(".ct", "")): v for k, v in
          get_peft_model_state_dict(m, adapter_name="ct").items()}
    mine = load_file(path)
    if set(sd) != set(mine):
        problems.append(f"keys differ: {sorted(set(sd) ^ set(mine))[:8]}")
    for k in set(sd) & set(mine):
        if not torch.equal(sd[k].float(), mine[k].float()):
            problems.append(f"{k} loaded other values")
    out = m.to(torch.float64)(**args, return_dict=False)[0]
    # the same numbers by hand: the base plus peft's formula on ctuner's tensors, via a fresh
    # peft adapter on the golden preset list with the file's tensors
    m2 = FluxTransformer2DModel.from_pretrained(os.path.join(root, name, "transformer")).float()
    m2.add_adapter(LoraConfig(r=meta["transformer.r"], lora_alpha=meta["transformer.lora_alpha"],
                              target_modules=PRESETS[preset],
                              use_dora=meta.get("transformer.use_dora", False)))
    set_peft_model_state_dict(m2, {k[len("transformer."):]: v for k, v in mine.items()})
    out2 = m2.to(torch.float64)(**args, return_dict=False)[0]
    e = ((out - out2).abs().max() / out2.abs().max()).item()
    if e > 1e-12:
        problems.append(f"outputs differ by {e:.2e}")
    print(f"{path}: {len(mine)} tensors, r {cfg.r}, alpha {cfg.lora_alpha}, output difference "
          f"{e:.1e}: {'ok' if not problems else problems}")
    return 1 if problems else 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/data/lora")
    ap.add_argument("--check")
    ap.add_argument("--load")
    ap.add_argument("--ref")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    global SEED
    SEED = a.seed
    torch.set_num_threads(1)
    if a.load:
        sys.exit(load_check(a.load, a.ref))
    if a.check:
        sys.exit(1 if check(a.check) else 0)
    write(a.out)


if __name__ == "__main__":
    main()
