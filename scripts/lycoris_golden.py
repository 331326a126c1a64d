#!/usr/bin/env python3
"""Golden files for ctuner's LyCORIS adapters (lora_type lycoris, docs/lora.md),
written by LyCORIS (lycoris-lora from PyPI) on diffusers' FluxTransformer2DModel
(scripts/py_deps.sh diffusers: the torch 2 venv).

The base transformer and its inputs are scripts/lora_golden.py's "m3" model
(tests/data/lora/m3: 2 double + 2 single blocks). For each config in CONFIGS
(a lycoris_config JSON as SimpleTuner passes it: LycorisNetwork.apply_preset of
its apply_preset, then create_lycoris(transformer, multiplier, linear_dim,
linear_alpha, **rest)), every LyCORIS tensor is set to random nonzero values
(so the test can fail), the network is saved as SimpleTuner saves it
(save_weights: pytorch_lora_weights.safetensors, lycoris_<module>.<key> and
.alpha, the config as "lycoris_config" metadata), and the loss
mean((out - target)^2) and every adapter gradient are computed in float64.
The output is also recomputed after loading the saved file with
create_lycoris_from_weights (the route a user's inference takes).

Writes into OUT (default tests/data/lycoris), per config NAME:
  NAME/config.json                          the lycoris_config
  NAME/pytorch_lora_weights.safetensors     LyCORIS's file
  NAME/golden.safetensors   loss (1), out (the output through
                            create_lycoris_from_weights), grad.<tensor name>
  tables.json               for the TABLES configs: each module LyCORIS creates, its
                            tensors' shapes, alpha and scale (no weights)
  tables/T.json             those configs

Usage: py=$(scripts/py_deps.sh diffusers)
  $py scripts/lycoris_golden.py [--out DIR] [--seed N]   write the goldens (N != 0: other
        random adapter weights, same configs)
  $py scripts/lycoris_golden.py --check DIR   recompute and compare (exit 1 on a difference)
  $py scripts/lycoris_golden.py --load FILE --ref DIR/NAME
        FILE (a LyCORIS file ctuner wrote) loads with create_lycoris_from_weights
        into the transformer (every tensor used, none left over) and its output on
        the golden inputs equals DIR/NAME's golden output
"""
import argparse
import json
import os
import sys

import torch
from safetensors.torch import load_file, save_file
from diffusers import FluxTransformer2DModel
from lycoris import LycorisNetwork, create_lycoris, create_lycoris_from_weights

BASE = "tests/data/lora/m3"
CONFIGS = {
    # lora/locon on names only (re.match patterns; no target classes), one excluded,
    # multiplier 2
    "locon": {"algo": "locon", "multiplier": 2, "linear_dim": 2, "linear_alpha": 3,
              "apply_preset": {"target_module": [], "target_name": ["transformer_blocks\\.0\\.attn\\.to_",
                                               "norm_out\\.linear", "x_embedder"],
                               "exclude_name": ["transformer_blocks.0.attn.to_v"]}},
    # LoHa on every Linear (no apply_preset: LyCORIS's default targets), embedders included
    "loha": {"algo": "loha", "multiplier": 1, "linear_dim": 2, "linear_alpha": 4},
    # LoKr with factor 4 in the blocks, FeedForward as LoHa (module_algo_map), the
    # final proj_out by name with decompose_both and norm_out.linear (whose halves
    # BFL swaps) by pattern (name_algo_map)
    "lokr": {"algo": "lokr", "multiplier": 1, "linear_dim": 2, "linear_alpha": 3, "factor": 4,
             "apply_preset": {
                 "target_module": ["FluxTransformerBlock", "FluxSingleTransformerBlock"],
                 "module_algo_map": {"FeedForward": {"algo": "loha", "dim": 3, "alpha": 2}},
                 "name_algo_map": {"proj_out": {"factor": 8, "dim": 1,
                                                "decompose_both": True},
                                   "norm_out\\.linear": {"factor": -1}}}},
    # SimpleTuner's LoKr recipe: full_matrix, a huge linear_dim (both halves whole, scale 1)
    "lokr_full": {"algo": "lokr", "multiplier": 1, "linear_dim": 10000, "linear_alpha": 1,
                  "factor": 4, "full_matrix": True,
                  "apply_preset": {"target_module": ["FluxAttention", "FeedForward"]}},
    # decompose_both with the most balanced split (factor -1), the single blocks only,
    # their modulation as LoCon through module_algo_map
    "lokr_both": {"algo": "lokr", "multiplier": 1, "linear_dim": 1, "linear_alpha": 2,
                  "factor": -1, "decompose_both": True,
                  "apply_preset": {"target_module": ["FluxSingleTransformerBlock"],
                                   "module_algo_map": {"AdaLayerNormZeroSingle":
                                                       {"algo": "locon", "dim": 2}}}},
}
# Module tables only (no weights): which modules get which algorithm, tensor
# shapes, alpha and scale, for configs that exercise LyCORIS's walk
# (tests/data/lycoris/tables.json).
TABLES = {
    # unbalanced factorization + decompose_both, an exclusion, a nested class map
    "t_unbalanced": {"algo": "lokr", "multiplier": 1, "linear_dim": 4, "linear_alpha": 2,
                     "factor": 8, "unbalanced_factorization": True, "decompose_both": True,
                     "apply_preset": {
                         "target_module": ["FluxSingleTransformerBlock", "AdaLayerNormContinuous"],
                         "exclude_name": ["single_transformer_blocks.1.attn.to_k"],
                         "module_algo_map": {"FluxAttention": {"algo": "loha", "dim": 2}}}},
    # fnmatch names only, alpha 0 (= dim)
    "t_fnmatch": {"algo": "locon", "multiplier": 1, "linear_dim": 3, "linear_alpha": 0,
                  "apply_preset": {"target_module": [], "use_fnmatch": True,
                                   "target_name": ["*.ff*.net.2", "time_text_embed.*"]}},
    # nested maps: the block as LoKr, FeedForward inherits it, every Linear its own alpha
    "t_nested": {"algo": "loha", "multiplier": 1, "linear_dim": 2, "linear_alpha": 1,
                 "apply_preset": {"target_module": ["FluxTransformerBlock"],
                                  "module_algo_map": {
                                      "FluxTransformerBlock": {"algo": "lokr", "factor": 4},
                                      "FeedForward": {"dim": 3},
                                      "Linear": {"alpha": 5}}}},
    # a name pattern on a block (a prefix match of its Linears), an exact name
    "t_names": {"algo": "lokr", "multiplier": 1, "linear_dim": 2, "linear_alpha": 2,
                "factor": -1,
                "apply_preset": {"target_module": ["FluxSingleTransformerBlock"],
                                 "name_algo_map": {
                                     "single_transformer_blocks.0": {"algo": "locon"},
                                     "transformer_blocks.1.attn.to_q": {"algo": "loha",
                                                                        "dim": 1}}}},
    # another prefix, full matrices on the modulations
    "t_prefix": {"algo": "lokr", "multiplier": 1, "linear_dim": 10000, "linear_alpha": 1,
                 "full_matrix": True, "factor": 2,
                 "apply_preset": {"target_module": ["AdaLayerNormZero"], "lora_prefix": "lyco"}},
}
DEFAULTS = {k: getattr(LycorisNetwork, k) for k in (
    "ENABLE_CONV", "TARGET_REPLACE_MODULE", "TARGET_REPLACE_NAME", "LORA_PREFIX",
    "MODULE_ALGO_MAP", "NAME_ALGO_MAP", "USE_FNMATCH", "TARGET_EXCLUDE_NAME")}


def reset():
    for k, v in DEFAULTS.items():
        setattr(LycorisNetwork, k, v)


def transformer():
    return FluxTransformer2DModel.from_pretrained(os.path.join(BASE, "transformer")).float()


def apply(m, cfg):
    """SimpleTuner's route: int()s of the three positional keys, apply_preset, create_lycoris."""
    reset()
    rest = dict(cfg)
    mult, dim, alpha = (int(rest.pop(k)) for k in ("multiplier", "linear_dim", "linear_alpha"))
    preset = rest.get("apply_preset")
    if preset:
        LycorisNetwork.apply_preset(preset)
    net = create_lycoris(m, mult, dim, alpha, **rest)
    net.apply_to()
    return net


def inputs():
    d = load_file(os.path.join(BASE, "inputs.safetensors"))
    return {k: v.to(torch.float64) for k, v in d.items()}


def forward(m, inp):
    args = {k: v for k, v in inp.items() if k != "target"}
    return m(**args, return_dict=False)[0]


def write_one(out, name, cfg, seed):
    m = transformer()
    for p in m.parameters():
        p.requires_grad_(False)
    net = apply(m, cfg)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in net.named_parameters():
            p.copy_(0.3 * torch.randn(p.shape, generator=g))
    d = os.path.join(out, name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    path = os.path.join(d, "pytorch_lora_weights.safetensors")
    net.save_weights(path, torch.float32, {"lycoris_config": json.dumps(cfg)})
    m.to(torch.float64)
    net.to(torch.float64)
    inp = inputs()
    o = forward(m, inp)
    loss = ((o - inp["target"]) ** 2).mean()
    loss.backward()
    gold = {"loss": loss.detach().reshape(1).float()}
    for n, p in net.named_parameters():
        gold["grad." + n] = p.grad.detach().float().contiguous()
    gold["out"] = loaded_output(path, inp, cfg["multiplier"]).float().contiguous()
    e = ((gold["out"].double() - o.detach()).abs().max() / o.abs().max()).item()
    save_file(gold, os.path.join(d, "golden.safetensors"))
    print(f"{name}: {len(net.loras)} modules {net.algo_table if hasattr(net, 'algo_table') else ''}"
          f", {sum(p.numel() for p in net.parameters())} parameters, loss {loss.item():.6g}, "
          f"reloaded output vs trained {e:.1e}")


def loaded_output(path, inp, mult, check_keys=False):
    """The output with FILE loaded by create_lycoris_from_weights (float64), at the
    config's multiplier (the file does not hold it)."""
    reset()
    m = transformer()
    net, sd = create_lycoris_from_weights(float(int(mult)), path, m)
    net.apply_to()
    used = set()
    for lora in net.loras:
        used.update(lora.lora_name + "." + k for k in lora.state_dict())
    left = sorted(set(sd) - used)
    m.to(torch.float64)
    net.to(torch.float64)
    with torch.no_grad():
        o = forward(m, inp)
    if check_keys:
        return o, left, len(net.loras)
    return o


def check(out):
    bad = 0
    for i, (name, cfg) in enumerate(CONFIGS.items()):
        d = os.path.join(out, name)
        m = transformer()
        for p in m.parameters():
            p.requires_grad_(False)
        net = apply(m, json.load(open(os.path.join(d, "config.json"))))
        sd = load_file(os.path.join(d, "pytorch_lora_weights.safetensors"))
        missing, unexpected = net.load_state_dict(sd, strict=False)
        m.to(torch.float64)
        net.to(torch.float64)
        inp = inputs()
        loss = ((forward(m, inp) - inp["target"]) ** 2).mean()
        loss.backward()
        gold = load_file(os.path.join(d, "golden.safetensors"))
        e = abs(loss.item() - gold["loss"].item()) / abs(gold["loss"].item())
        worst = 0.0
        for n, p in net.named_parameters():
            gg = gold["grad." + n]
            worst = max(worst, (p.grad.float() - gg).abs().max().item() /
                        gg.abs().max().clamp_min(1e-30).item())
        ok = e < 1e-5 and worst < 1e-5 and not missing and not unexpected
        bad += not ok
        print(f"{name}: loss {e:.2e}, worst gradient {worst:.2e}, {len(missing)} missing, "
              f"{len(unexpected)} unexpected: {'ok' if ok else 'DIFFERS'}")
    same = tables() == json.load(open(os.path.join(out, "tables.json")))
    print(f"tables.json: {'ok' if same else 'DIFFERS'}")
    return bad + (not same)


def load_check(path, ref):
    inp = inputs()
    cfg = json.load(open(os.path.join(ref, "config.json")))
    o, left, n = loaded_output(path, inp, cfg["multiplier"], check_keys=True)
    gold = load_file(os.path.join(ref, "golden.safetensors"))["out"].double()
    e = ((o - gold).abs().max() / gold.abs().max()).item()
    mine, theirs = load_file(path), load_file(os.path.join(ref, "pytorch_lora_weights.safetensors"))
    problems = []
    if set(mine) != set(theirs):
        problems.append(f"names differ from LyCORIS's file: {sorted(set(mine) ^ set(theirs))[:6]}")
    if left:
        problems.append(f"tensors create_lycoris_from_weights left unused: {left[:6]}")
    if e > 1e-5:
        problems.append(f"output differs by {e:.2e}")
    print(f"{path}: {len(mine)} tensors, {n} modules loaded, output vs golden {e:.1e}: "
          f"{'ok' if not problems else problems}")
    return 1 if problems else 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/data/lycoris")
    ap.add_argument("--check")
    ap.add_argument("--load")
    ap.add_argument("--ref")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    torch.set_num_threads(1)
    if a.load:
        sys.exit(load_check(a.load, a.ref))
    if a.check:
        sys.exit(1 if check(a.check) else 0)
    for i, (name, cfg) in enumerate(CONFIGS.items()):
        write_one(a.out, name, cfg, 700 + i + 1000 * a.seed)
    write_tables(a.out)


def tables():
    out = {}
    for name, cfg in TABLES.items():
        net = apply(transformer(), cfg)
        mods = {}
        for lora in net.loras:
            sd = lora.state_dict()
            mods[lora.lora_name] = {"shapes": {k: list(v.shape) for k, v in sd.items()
                                               if k != "alpha"},
                                    "alpha": float(sd["alpha"]), "scale": float(lora.scale)}
        out[name] = {"config": cfg, "modules": mods}
        print(f"{name}: {len(mods)} modules")
    return out


def write_tables(out):
    with open(os.path.join(out, "tables.json"), "w") as f:
        json.dump(tables(), f, indent=0, sort_keys=True)
    os.makedirs(os.path.join(out, "tables"), exist_ok=True)
    for name, cfg in TABLES.items():
        with open(os.path.join(out, "tables", name + ".json"), "w") as f:
            json.dump(cfg, f, indent=1)


if __name__ == "__main__":
    main()
