#!/usr/bin/env python3
"""A FluxPipeline's tokenizers as transformers 5 / diffusers 0.42 save them, and
their token ids (scripts/py_deps.sh diffusers: transformers 5.24.0).

transformers 5 has one tokenizer class per model, backed by `tokenizers`: a
FluxPipeline it saves records tokenizer_2 as "T5Tokenizer" (no T5TokenizerFast)
and writes each tokenizer as tokenizer.json + tokenizer_config.json only — no
vocab.json / merges.txt for CLIP, no spiece.model for T5. This script loads
tests/data/flux_pipe/dev with FluxPipeline.from_pretrained, save_pretrained's
it, and keeps what differs from the dev pipeline:

  OUT/model_index.json     diffusers' (tokenizer_2: ["transformers", "T5Tokenizer"]),
                           without its _name_or_path (the source's path here)
  OUT/tokenizer/           tokenizer.json, tokenizer_config.json (CLIPTokenizer)
  OUT/tokenizer_2/         tokenizer.json, tokenizer_config.json (T5Tokenizer)
  OUT/golden.safetensors   clip_ids [N, 77], t5_ids [N, 64] (I32) of the pipeline's
                           own tokenizers (padding max_length, truncation) for the
                           captions in its metadata ("captions", JSON)

tests/test_tokenizer_tf5.c checks ctuner's ids against them and opens a
pipeline made of dev's models with these files.

Usage: py=$(scripts/py_deps.sh diffusers)
  $py scripts/tokenizer_tf5_golden.py [--out DIR]    (default tests/data/flux_pipe_tf5)
  $py scripts/tokenizer_tf5_golden.py --check DIR    recompute, compare (exit 1 on a difference)
"""
import argparse
import json
import os
import shutil
import sys
import tempfile

import torch
from diffusers import FluxPipeline
from safetensors.torch import load_file, save_file

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CAPTIONS = [
    "a large red circle in the center on a white background",
    "",
    "A Photo of TWO   dogs,\tplaying\nin the   snow!!",
    "Ünïcode café — naïve résumé, ß and ﬁ ligature; Ελληνικά; Кириллица",
    "日本語のテキストと English mixed 123,456.78",
    "emoji 🙂👍🏽 and symbols ©®™ <|endoftext|> inside",
    "control\x07chars\u200band zero-width\u00adsoft hyphen",
    "it's they're we've I'm you'll he'd — apostrophes' edge's",
    "a very long caption " + " ".join(f"word{i}" for i in range(120)),
]
CLIP_T, T5_T = 77, 64


def write(out):
    with tempfile.TemporaryDirectory() as tmp:
        pipe = FluxPipeline.from_pretrained(os.path.join(ROOT, "tests/data/flux_pipe/dev"))
        pipe.save_pretrained(tmp)
        os.makedirs(out, exist_ok=True)
        idx = json.load(open(os.path.join(tmp, "model_index.json")))
        idx.pop("_name_or_path", None)  # this machine's path to the source pipeline
        with open(os.path.join(out, "model_index.json"), "w") as f:
            json.dump(idx, f, indent=2, sort_keys=True)
            f.write("\n")
        for d in ("tokenizer", "tokenizer_2"):
            if os.path.exists(os.path.join(out, d)):
                shutil.rmtree(os.path.join(out, d))
            shutil.copytree(os.path.join(tmp, d), os.path.join(out, d))
        with torch.no_grad():
            clip = pipe.tokenizer(CAPTIONS, padding="max_length", max_length=CLIP_T,
                                  truncation=True, return_tensors="pt").input_ids
            t5 = pipe.tokenizer_2(CAPTIONS, padding="max_length", max_length=T5_T,
                                  truncation=True, return_tensors="pt").input_ids
    idx = json.load(open(os.path.join(out, "model_index.json")))
    files = {d: sorted(os.listdir(os.path.join(out, d))) for d in ("tokenizer", "tokenizer_2")}
    print(f"model_index tokenizer {idx['tokenizer']}, tokenizer_2 {idx['tokenizer_2']}; files {files}")
    save_file({"clip_ids": clip.to(torch.int32).contiguous(), "t5_ids": t5.to(torch.int32).contiguous()},
              os.path.join(out, "golden.safetensors"), metadata={"captions": json.dumps(CAPTIONS)})


def check(ref):
    with tempfile.TemporaryDirectory() as tmp:
        write(tmp)
        a, b = load_file(os.path.join(tmp, "golden.safetensors")), load_file(os.path.join(ref, "golden.safetensors"))
        ok = set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)
        for f in ("model_index.json", "tokenizer/tokenizer_config.json", "tokenizer_2/tokenizer_config.json"):
            ja, jb = (json.load(open(os.path.join(d, f))) for d in (tmp, ref))
            if ja != jb:
                print(f"{f} differs from the committed one")
                ok = False
    print("tokenizer_tf5 goldens: " + ("same as committed" if ok else "DIFFER"))
    return ok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(ROOT, "tests/data/flux_pipe_tf5"))
    ap.add_argument("--check")
    a = ap.parse_args()
    if a.check:
        sys.exit(0 if check(a.check) else 1)
    write(a.out)


if __name__ == "__main__":
    main()
