#!/usr/bin/env python3
"""The BFL (flux1-dev.safetensors) tensor names diffusers' single-file loader
reads, for `ctuner model convert --layout bfl` (docs/flux.md), with diffusers
0.42.1 (scripts/py_deps.sh diffusers).

FluxTransformer2DModel.from_single_file runs
convert_flux_transformer_checkpoint_to_diffusers, which pops every BFL tensor
it needs (a missing one: KeyError) and hard-codes FLUX.1's width (inner_dim
3072: linear1 is split at [3072, 3072, 3072, 12288]), so it cannot run on a
tiny model's weights. Here it runs on row-labelled one-column tensors at
FLUX.1's width (no memory), for the tiny config's depth, with a checkpoint
that records what the converter takes; the converted names are checked
against FluxTransformer2DModel's own state dict (built on the meta device,
same depth): nothing missing, nothing unexpected.

  --out FILE       write the names the converter reads for tests/data/flux/dev's
                   depth (2 double, 1 single, guidance), one per line
                   (tests/data/flux/bfl_keys_dev.txt; tests/cli_model.sh compares
                   `ctuner model convert --layout bfl`'s file with it)
  --check FILE     recompute and compare with FILE
  --file BFL       live: a BFL file ctuner wrote: its names are exactly what the
                   converter reads (none missing, none left over), and the
                   conversion gives every FluxTransformer2DModel tensor

Usage: py=$(scripts/py_deps.sh diffusers)
  $py scripts/bfl_keys_golden.py --out tests/data/flux/bfl_keys_dev.txt
"""
import argparse
import json
import struct
import sys

import torch
from diffusers import FluxTransformer2DModel
from diffusers.loaders.single_file_utils import convert_flux_transformer_checkpoint_to_diffusers

D, MLP = 3072, 4 * 3072
DEPTH = (2, 1, True)  # tests/data/flux/dev: num_layers, num_single_layers, guidance_embeds


def rows(key):
    """Rows of a BFL tensor at FLUX.1's width (what the converter's splits need)."""
    base = key.rsplit(".", 1)[0]
    if key.endswith(".scale"):
        return 128
    table = {"img_in": D, "txt_in": D, "time_in.in_layer": D, "time_in.out_layer": D,
             "vector_in.in_layer": D, "vector_in.out_layer": D, "guidance_in.in_layer": D,
             "guidance_in.out_layer": D, "final_layer.linear": 64, "final_layer.adaLN_modulation.1": 2 * D}
    if base in table:
        return table[base]
    tail = base.split(".", 2)[2]
    if base.startswith("double_blocks."):
        return {"img_mod.lin": 6 * D, "txt_mod.lin": 6 * D, "img_attn.qkv": 3 * D, "txt_attn.qkv": 3 * D,
                "img_attn.proj": D, "txt_attn.proj": D, "img_mlp.0": MLP, "img_mlp.2": D,
                "txt_mlp.0": MLP, "txt_mlp.2": D}[tail]
    if base.startswith("single_blocks."):
        return {"linear1": 3 * D + MLP, "linear2": D, "modulation.lin": 3 * D}[tail]
    raise KeyError(f"not a FLUX.1 BFL tensor: {key}")


class Recording(dict):
    """A checkpoint that notes which tensors the converter takes."""
    def __init__(self, *a):
        super().__init__(*a)
        self.taken = []

    def pop(self, k, *d):
        if k in self:
            self.taken.append(k)
        return super().pop(k, *d)


def convert(keys):
    """(names taken, names left, converted names) for a checkpoint of these names."""
    ck = Recording({k: torch.zeros(rows(k), 1) if not k.endswith(".scale") else torch.zeros(128)
                    for k in keys})
    out = convert_flux_transformer_checkpoint_to_diffusers(ck)
    return set(ck.taken), set(ck), set(out)


def model_keys(nd, ns, guidance):
    with torch.device("meta"):
        m = FluxTransformer2DModel(num_layers=nd, num_single_layers=ns, guidance_embeds=guidance)
    return set(m.state_dict())


def expected(nd, ns, guidance):
    """Every name the converter reads for this depth: grown from KeyErrors."""
    keys = {"guidance_in.in_layer.weight"} if guidance else set()  # optional: "guidance" in a name
    while True:
        try:
            taken, left, out = convert(keys | {f"double_blocks.{nd - 1}.img_mod.lin.weight",
                                               f"single_blocks.{ns - 1}.linear1.weight"})
            return taken, out
        except KeyError as e:
            k = e.args[0]
            if k in keys or "blocks." in k and int(k.split(".")[1]) >= max(nd, ns):
                raise
            keys.add(k)
            if not guidance and k.startswith("guidance_in"):
                raise


def write(path):
    nd, ns, g = DEPTH
    taken, out = expected(nd, ns, g)
    want = model_keys(nd, ns, g)
    if out != want:
        sys.exit(f"converted names vs FluxTransformer2DModel: missing {sorted(want - out)[:5]}, "
                 f"unexpected {sorted(out - want)[:5]}")
    text = "".join(k + "\n" for k in sorted(taken))
    if path:
        open(path, "w").write(text)
    print(f"{len(taken)} BFL names -> {len(out)} diffusers tensors (= the model's)")
    return text


def file_keys(path):
    b = open(path, "rb").read(8)
    n = struct.unpack("<Q", b)[0]
    with open(path, "rb") as f:
        f.seek(8)
        h = json.loads(f.read(n))
    h.pop("__metadata__", None)
    return {k[len("model.diffusion_model."):] if k.startswith("model.diffusion_model.") else k: v
            for k, v in h.items()}


def check_file(path):
    h = file_keys(path)
    nd = 1 + max(int(k.split(".")[1]) for k in h if k.startswith("double_blocks."))
    ns = 1 + max(int(k.split(".")[1]) for k in h if k.startswith("single_blocks."))
    g = any(k.startswith("guidance_in.") for k in h)
    try:
        taken, left, out = convert(set(h))
    except KeyError as e:
        print(f"{path}: diffusers' converter needs {e.args[0]}, which the file lacks")
        return False
    want = model_keys(nd, ns, g)
    ok = not left and out == want
    if left:
        print(f"{path}: tensors the converter does not read: {sorted(left)[:6]}")
    if out != want:
        print(f"{path}: converted vs the model: missing {sorted(want - out)[:5]}, "
              f"unexpected {sorted(out - want)[:5]}")
    print(f"{path}: {len(h)} tensors, every one read by from_single_file's converter, "
          f"{len(out)} diffusers tensors = FluxTransformer2DModel({nd}, {ns}, guidance {g})'s"
          if ok else f"{path}: MISMATCH")
    return ok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--check")
    ap.add_argument("--file")
    a = ap.parse_args()
    if a.file:
        sys.exit(0 if check_file(a.file) else 1)
    if a.check:
        same = write(None) == open(a.check).read()
        print("BFL names: " + ("same as committed" if same else "DIFFER from " + a.check))
        sys.exit(0 if same else 1)
    write(a.out)


if __name__ == "__main__":
    main()
