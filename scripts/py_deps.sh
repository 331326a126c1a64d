#!/usr/bin/env bash
# Installs the PyPI packages the live interop checks read ctuner's output with
# into one virtual environment, and prints its python. Not used by `make test`
# (which stays offline on committed goldens); `make interop` calls it.
#   scripts/py_deps.sh            create/update the venv, print its python path
# The venv: $CT_PY_VENV, default ~/.cache/ctuner/py-venv, made from Debian's
# /usr/bin/python3 with its system packages visible (numpy, torch stay Debian's).
# Packages, pinned: tensorboard (EventAccumulator, `tensorboard --logdir`).
set -euo pipefail

venv="${CT_PY_VENV:-$HOME/.cache/ctuner/py-venv}"
pkgs=(tensorboard==2.21.0)

if [ ! -x "$venv/bin/python" ]; then
  mkdir -p "$(dirname "$venv")"
  /usr/bin/python3 -m venv --system-site-packages "$venv" >&2
fi
missing=()
for p in "${pkgs[@]}"; do
  name="${p%%==*}" want="${p##*==}"
  have=$("$venv/bin/python" -c "import importlib.metadata as m; print(m.version('$name'))" 2>/dev/null || true)
  [ "$have" = "$want" ] || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "py_deps: installing ${missing[*]} into $venv" >&2
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "${missing[@]}" >&2
fi
echo "$venv/bin/python"
