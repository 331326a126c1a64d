#!/usr/bin/env bash
# Regenerate tests/data/bpe/cases.json: expected CLIP BPE ids from Hugging
# Face's tokenizers.js (npm, test-only; installed into build/npm-tools).
#   scripts/bpe_golden.sh          (needs node + npm: scripts/deps.sh --golden)
set -euo pipefail
cd "$(dirname "$0")/.."
tools=build/npm-tools
mkdir -p "$tools"
[ -f "$tools/node_modules/@huggingface/tokenizers/package.json" ] ||
  npm install --prefix "$tools" --no-audit --no-fund --silent @huggingface/tokenizers@0.2.0
mkdir -p "$tools/scripts"
cp scripts/bpe_golden.mjs "$tools/scripts/"
node "$tools/scripts/bpe_golden.mjs" tests/data/bpe > tests/data/bpe/cases.json
echo "wrote tests/data/bpe/cases.json ($(wc -c < tests/data/bpe/cases.json) bytes)"
