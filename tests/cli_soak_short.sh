#!/usr/bin/env bash
# The short soak inside make test (scripts/soak.sh, docs/reliability.md):
# 3 kill -9 of a small run at seeded random moments (one inside a checkpoint
# write), each resumed, the final weights bit-identical to an uninterrupted
# run; ENOSPC while writing a checkpoint on a small tmpfs (skipped with a
# message where no mount namespace can be made); corrupt, truncated and empty
# cache entries rebuilt and damaged checkpoints refused naming the file.
# The full campaign (50 kills, ranks under ZeRO-3, S3) is `make soak`.
# Usage: tests/cli_soak_short.sh path/to/ctuner
set -u
CT=${1:?usage: $0 path/to/ctuner}
root="$(cd "$(dirname "$0")/.." && pwd)"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
SOAK_DIR="$out" "$root/scripts/soak.sh" --kills 3 --cases kill,enospc,corrupt --seed "${SOAK_SEED:-21}" "$CT"
