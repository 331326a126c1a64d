#!/usr/bin/env bash
# Regenerates the committed golden files under tests/data/ from the PyTorch peer.
# Needs Debian's python3-torch (scripts/deps.sh installs it); run from anywhere.
set -euo pipefail
cd "$(dirname "$0")/.."
PEER=${CT_PEER:-$(dirname "$0")/mmdit_torch.py}
PY=/usr/bin/python3
# tiny preset as it is
$PY "$PEER" golden --preset tiny --seed 0 --out tests/data/golden_tiny.safetensors
# non-square latent with an odd token grid (3x5), another width/head count, two
# double blocks, odd text length and batch
$PY "$PEER" golden --preset tiny --seed 1 --set hw=6,10 --set hidden=48 --set heads=2 --set axes=4,10,10 \
  --set nd=2 --set ns=1 --set T=7 --set B=3 --set ctx=24 --set vec=40 --set lat=3 \
  --out tests/data/golden_odd.safetensors
# frozen CLIP text encoder (plain torch reference, no transformers package)
$PY scripts/textenc_golden.py --seed 0 --out tests/data/textenc_golden.safetensors
# AutoencoderKL (plain torch implementation of diffusers' architecture, small random config)
$PY scripts/vae_golden.py --seed 0 --out tests/data/vae_golden.safetensors
