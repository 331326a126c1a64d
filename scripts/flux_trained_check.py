#!/usr/bin/env python3
"""diffusers loads what ctuner trained from a FluxPipeline (make interop).

Run with the venv of `scripts/py_deps.sh diffusers`:

    $(scripts/py_deps.sh diffusers) scripts/flux_trained_check.py OUTPUT_DIR

OUTPUT_DIR is a `ctuner train --pretrained_model_name_or_path=...` run. Checks:
  - every checkpoint-N/transformer loads with FluxTransformer2DModel.from_pretrained
    with no missing, unexpected or mismatched keys, and its parameters equal the
    tensors ctuner wrote (bit for bit, as stored);
  - OUTPUT_DIR/pipeline loads with FluxPipeline.from_pretrained, its transformer
    equals the last checkpoint's, and a 2-step 32x32 generation is finite.
Exit 1 on the first failure.
"""
import glob
import os
import sys

import numpy as np
import torch
from diffusers import FluxPipeline, FluxTransformer2DModel
from safetensors.torch import load_file


def stored(d):
    t = {}
    for f in sorted(glob.glob(os.path.join(d, "*.safetensors"))):
        t.update(load_file(f))
    return t


def check_transformer(d):
    m, info = FluxTransformer2DModel.from_pretrained(d, output_loading_info=True,
                                                     low_cpu_mem_usage=False)
    bad = {k: v for k, v in info.items() if v}
    if bad:
        sys.exit(f"{d}: from_pretrained reports {bad}")
    want = stored(d)
    sd = m.state_dict()
    if set(sd) != set(want):
        sys.exit(f"{d}: keys differ: {sorted(set(sd) ^ set(want))[:5]}")
    for k, v in want.items():
        if not torch.equal(sd[k].to(v.dtype), v):
            sys.exit(f"{d}: {k} differs from the stored tensor")
    print(f"{d}: FluxTransformer2DModel.from_pretrained: {len(want)} tensors, identical")
    return m


def main():
    out = sys.argv[1]
    ckpts = sorted(glob.glob(os.path.join(out, "checkpoint-*/transformer")),
                   key=lambda p: int(p.split("checkpoint-")[1].split("/")[0]))
    if not ckpts:
        sys.exit(f"{out}: no checkpoint-N/transformer")
    last = None
    for d in ckpts:
        last = check_transformer(d)
    pipe = FluxPipeline.from_pretrained(os.path.join(out, "pipeline"), dtype=torch.float32,
                                        local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    for k, v in last.state_dict().items():
        if not torch.equal(pipe.transformer.state_dict()[k].float(), v.float()):
            sys.exit(f"pipeline/transformer: {k} differs from the last checkpoint's")
    img = pipe("a red circle", height=32, width=32, num_inference_steps=2, guidance_scale=3.5,
               max_sequence_length=64, output_type="np",
               generator=torch.Generator().manual_seed(0)).images
    if not np.isfinite(img).all():
        sys.exit("pipeline: the generated image is not finite")
    print(f"{out}/pipeline: FluxPipeline.from_pretrained loads it; a 2-step image {img.shape}")


if __name__ == "__main__":
    main()
