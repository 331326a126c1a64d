#!/usr/bin/env bash
# Installs the CUDA toolchain ctuner's CUDA backend compiles with: NVIDIA's
# PyPI wheels pinned to CUDA 13.0 (the GPU machine's nvcc and driver 580), in
# one virtual environment, and prints the toolkit root on stdout (everything
# else goes to stderr). `make test` calls it so that every CI run compiles the
# CUDA code; no GPU is needed to compile (docs/cuda.md).
#   scripts/cuda_deps.sh          install what is missing, print the root
#   scripts/cuda_deps.sh --check  print the root if complete; exit 1 otherwise
# The venv: $CT_CUDA_VENV, default ~/.cache/ctuner/cuda-venv. All six wheels
# are pinned: unpinned, nvcc 13.0 pulls nvvm/crt 13.5, whose PTX a 13.0
# driver cannot load. The wheels lack the unversioned library names a linker
# looks for (libcudart.so, libcublasLt.so, libcublas.so) and the lib64 directory
# nvcc.profile links from: made here as links.
set -euo pipefail

venv="${CT_CUDA_VENV:-$HOME/.cache/ctuner/cuda-venv}"
PINS=(nvidia-cuda-nvcc==13.0.88 nvidia-cuda-runtime==13.0.96 nvidia-cublas==13.0.2.14
      nvidia-cuda-cccl==13.0.85 nvidia-nvvm==13.0.88 nvidia-cuda-crt==13.0.88)

root_of() { "$venv/bin/python" -c 'import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], "cu13"))' 2>/dev/null; }

complete() {
  local root
  root=$(root_of) || return 1
  [ -x "$root/bin/nvcc" ] && [ -f "$root/lib/libcudart.so" ] && [ -f "$root/lib/libcublasLt.so" ] &&
    [ -f "$root/include/cuda_runtime.h" ] && [ -f "$root/nvvm/bin/cicc" ] && [ -e "$root/lib64" ] ||
    return 1
  local p name want have
  for p in "${PINS[@]}"; do
    name="${p%%==*}" want="${p##*==}"
    have=$("$venv/bin/python" -c "import importlib.metadata as m; print(m.version('$name'))" 2>/dev/null || true)
    [ "$have" = "$want" ] || return 1
  done
  echo "$root"
}

if root=$(complete); then
  echo "$root"
  exit 0
fi
if [ "${1:-}" = "--check" ]; then
  echo "cuda_deps: the CUDA 13.0 wheels are not installed in $venv (run scripts/cuda_deps.sh)" >&2
  exit 1
fi
if [ ! -x "$venv/bin/python" ]; then
  echo "cuda_deps: creating $venv" >&2
  python3 -m venv "$venv" >&2
fi
echo "cuda_deps: installing ${PINS[*]} into $venv (about 0.9 GB)" >&2
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps "${PINS[@]}" >&2
root=$(root_of)
for l in cudart cublasLt cublas; do
  so=$(ls "$root/lib/lib$l.so."[0-9]* 2>/dev/null | sort | head -1)
  [ -n "$so" ] || { echo "cuda_deps: lib$l.so.* missing under $root/lib" >&2; exit 1; }
  ln -sf "$(basename "$so")" "$root/lib/lib$l.so"
done
# nvcc.profile links from $(TOP)/lib64 (a toolkit's layout); the wheels have lib/
[ -e "$root/lib64" ] || ln -s lib "$root/lib64"
complete >/dev/null || { echo "cuda_deps: the toolkit under $root is incomplete after installing" >&2; exit 1; }
echo "$root"
