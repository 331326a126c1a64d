#!/usr/bin/env bash
# Installs the PyPI packages the live interop checks compare ctuner with into
# one virtual environment, and prints its python on stdout (everything else
# goes to stderr). Not used by `make test` (which stays offline on committed
# goldens); `make interop` and the golden scripts call it.
#   scripts/py_deps.sh [GROUP...]   install the groups (default: all but diffusers), print the python
# Groups, one function each (add yours as group_NAME and list it in ALL):
#   tensorboard  tensorboard 2.21.0 (EventAccumulator, `tensorboard --logdir`)
#   t5   transformers 4.46.3 (T5EncoderModel, T5TokenizerFast; the last release
#        line that runs on Debian's torch 1.13), tokenizers, sentencepiece,
#        protobuf (transformers reads spiece.model through it; 6.31.1 also
#        satisfies tensorboard)
#   diffusers  torch 2.x + diffusers 0.42.1 + peft 0.21.2 (LoRA) + lycoris-lora 4.1.3
#        (LyCORIS: scripts/lycoris_golden.py) + optimum-quanto 0.2.7 + torchao 0.18.0
#        (int8 bases: scripts/quant_golden.py; FluxTransformer2DModel needs
#        F.scaled_dot_product_attention, i.e. torch >= 2), safetensors. Lives in
#        its OWN venv, $CT_PY_VENV_TORCH2 (default ~/.cache/ctuner/py-venv-torch2),
#        made WITHOUT Debian's system packages so its torch never shadows the
#        1.13 the other groups pin against; ask for it alone:
#        `scripts/py_deps.sh diffusers`. torch comes from the CPU index
#        (download.pytorch.org/whl/cpu) when it answers, else from PyPI (the
#        CUDA build and its nvidia-* wheels: several GB; see docs/flux.md);
#        transformers 5.24.0 (4.46.3 needs huggingface-hub < 1, diffusers 0.42.1 needs
#        >= 1.32), sentencepiece, protobuf for FluxPipeline.
# The venv: $CT_PY_VENV, default ~/.cache/ctuner/py-venv, made from Debian's
# /usr/bin/python3 with its system packages visible (numpy and torch stay
# Debian's: PyPI torch is never installed). Idempotent: pinned packages
# already at their version are skipped.
set -euo pipefail

venv="${CT_PY_VENV:-$HOME/.cache/ctuner/py-venv}"
ALL=(tensorboard t5)

# pip install the given NAME==VERSION pins that are not at that version.
pinned() {
  local missing=() p name want have
  for p in "$@"; do
    name="${p%%==*}" want="${p##*==}"
    have=$("$venv/bin/python" -c "import importlib.metadata as m; print(m.version('$name'))" 2>/dev/null || true)
    [ "$have" = "$want" ] || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "py_deps: installing ${missing[*]} into $venv" >&2
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "${missing[@]}" >&2
  fi
}

group_tensorboard() {
  pinned tensorboard==2.21.0 protobuf==6.31.1
}

group_t5() {
  pinned transformers==5.24.0 sentencepiece==0.2.0 protobuf==6.31.1
}

group_diffusers() {
  local have
  have=$("$venv/bin/python" -c "import torch; print(torch.__version__)" 2>/dev/null || true)
  case "$have" in
  2.*) ;;
  *)
    echo "py_deps: installing torch 2 into $venv" >&2
    if curl -s -m 10 -o /dev/null https://download.pytorch.org/whl/cpu/torch/; then
      "$venv/bin/python" -m pip install --quiet --disable-pip-version-check torch \
        --index-url https://download.pytorch.org/whl/cpu >&2
    else
      echo "py_deps: download.pytorch.org unreachable; torch from PyPI (CUDA build, large)" >&2
      "$venv/bin/python" -m pip install --quiet --disable-pip-version-check torch==2.15.0 >&2
    fi
    ;;
  esac
  pinned diffusers==0.42.1 safetensors==0.8.0 peft==0.21.2
  pinned lycoris-lora==4.1.3 # LyCORIS adapters (scripts/lycoris_golden.py)
  # FluxPipeline itself (scripts/flux_tiny_pipeline.py): its text encoders and tokenizers
  pinned transformers==5.24.0 sentencepiece==0.2.0 protobuf==6.31.1
  # the int8 weight quantisers base_model_precision names (scripts/quant_golden.py)
  pinned optimum-quanto==0.2.7 torchao==0.18.0
}

groups=("$@")
[ ${#groups[@]} -eq 0 ] && groups=("${ALL[@]}")
sys_site=--system-site-packages
if [[ " ${groups[*]} " == *" diffusers "* ]]; then
  if [ ${#groups[@]} -ne 1 ]; then
    echo "py_deps: group 'diffusers' has its own venv; ask for it alone" >&2
    exit 2
  fi
  venv="${CT_PY_VENV_TORCH2:-$HOME/.cache/ctuner/py-venv-torch2}"
  sys_site=
fi
if [ ! -x "$venv/bin/python" ]; then
  mkdir -p "$(dirname "$venv")"
  /usr/bin/python3 -m venv $sys_site "$venv" >&2
fi
for g in "${groups[@]}"; do
  if ! declare -F "group_$g" >/dev/null; then
    echo "py_deps: unknown group '$g' (groups: ${ALL[*]} diffusers)" >&2
    exit 2
  fi
  "group_$g"
done
echo "$venv/bin/python"
