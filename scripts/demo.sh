#!/usr/bin/env bash
# `make demo` until the trainer lands: the parity check against the PyTorch
# peer's golden files and the step benchmark against the peer.
set -euo pipefail
CT=${1:-build/ctuner}
cd "$(dirname "$0")/.."
echo "== parity with the PyTorch peer (tests/data golden files)"
for g in tests/data/golden_tiny.safetensors tests/data/golden_odd.safetensors; do
  "$CT" model check --golden "$g"
done
echo
echo "== one training step of the bench preset: ctuner vs PyTorch"
scripts/bench.sh "$CT"
