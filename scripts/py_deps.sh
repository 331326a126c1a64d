#!/usr/bin/env bash
# Installs the PyPI packages that the interoperability checks (make interop)
# and the golden-file scripts compare ctuner against, into a virtualenv that
# sees Debian's python3-torch and numpy (--system-site-packages; PyPI torch is
# never installed). Each group of packages is a function; name the groups to
# install, or none for all:
#   scripts/py_deps.sh [GROUP...]      groups: t5
#   scripts/py_deps.sh --print-python  the venv's python (after an install)
# Environment: CT_PY_VENV (default .venv-py at the repository root).
# Idempotent: a group whose pinned packages import is skipped. Versions are
# pinned: transformers releases after 4.46 need torch >= 2, Debian has 1.13.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
VENV=${CT_PY_VENV:-$ROOT/.venv-py}
PY=$VENV/bin/python

venv() {
  if [ ! -x "$PY" ]; then
    /usr/bin/python3 -m venv --system-site-packages "$VENV"
  fi
}

# pip install PKG==VER... unless every one is already at that version.
pip_pinned() {
  local need=0 spec name ver
  for spec in "$@"; do
    name=${spec%%==*}
    ver=${spec##*==}
    if [ "$("$PY" -m pip show "$name" 2>/dev/null | sed -n 's/^Version: //p')" != "$ver" ]; then
      need=1
    fi
  done
  if [ $need -eq 1 ]; then
    "$PY" -m pip install --disable-pip-version-check -q "$@"
  fi
}

# T5 encoder and tokenizer peers: transformers' T5EncoderModel and
# T5TokenizerFast, tokenizers (Rust), sentencepiece (Google's C++), protobuf
# (transformers reads spiece.model through it when converting).
group_t5() {
  pip_pinned transformers==4.46.3 tokenizers==0.20.3 sentencepiece==0.2.0 protobuf==4.25.5
}

case "${1:-}" in
  --print-python)
    echo "$PY"
    exit 0
    ;;
esac

venv
groups=("$@")
[ ${#groups[@]} -eq 0 ] && groups=(t5)
for g in "${groups[@]}"; do
  if ! declare -F "group_$g" >/dev/null; then
    echo "py_deps: unknown group '$g' (have: t5)" >&2
    exit 2
  fi
  "group_$g"
done
echo "py_deps: ${groups[*]} ready in $VENV"
