#!/usr/bin/env bash
# The step benchmark of the `bench` preset, ours and the PyTorch peer's, in one
# run on the same machine and thread count, with peak RSS of each; then the
# cores' FMA peak with each SGEMM path against it (`ctuner bench peak`) and the
# step's per-op-family profile (`ctuner bench step --profile`, all threads and
# one thread). docs/performance.md, docs/gemm.md.
#   scripts/bench.sh path/to/ctuner [threads]
# Also run with OPENBLAS_CORETYPE unset to see the AVX-512 kernels:
#   env -u OPENBLAS_CORETYPE scripts/bench.sh build/ctuner
set -euo pipefail
CT=${1:-build/ctuner}
THREADS=${2:-$(nproc)}
PEER=$(dirname "$0")/mmdit_torch.py
echo "OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-<unset>} threads=$THREADS"
rss() { /usr/bin/time -f '%M' -o "$1" "${@:2}"; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
rss "$tmp/ours.rss" "$CT" bench step --preset bench --steps 10 --warmup 3 --threads "$THREADS" | tee "$tmp/ours.json"
if /usr/bin/python3 -c "import torch" 2>/dev/null && [ -f "$PEER" ]; then
  rss "$tmp/peer.rss" /usr/bin/python3 "$PEER" bench --preset bench --threads "$THREADS" | tee "$tmp/peer.json"
  /usr/bin/python3 - "$tmp" <<'PY'
import json, sys
d = sys.argv[1]
o = json.load(open(d + "/ours.json")); p = json.load(open(d + "/peer.json"))
ro = int(open(d + "/ours.rss").read().split()[-1]) / 1024; rp = int(open(d + "/peer.rss").read().split()[-1]) / 1024
print(json.dumps({"ours_ms": o["ms_per_step_median"], "peer_ms": p["ms_per_step_median"],
                  "time_ratio_ours_over_peer": round(o["ms_per_step_median"] / p["ms_per_step_median"], 3),
                  "mfu_vs_sgemm": o["mfu_vs_sgemm"], "ours_peak_rss_mb": round(ro, 1), "peer_peak_rss_mb": round(rp, 1)}))
PY
else
  echo "python3-torch not installed: peer not run (scripts/deps.sh installs it)"
fi
echo "== FMA peak and SGEMM paths (ctuner bench peak)"
"$CT" bench peak --threads "$THREADS"
echo "== per-op profile, $THREADS threads (ctuner bench step --profile)"
"$CT" bench step --preset bench --steps 10 --warmup 3 --threads "$THREADS" --profile
echo "== per-op profile, 1 thread"
"$CT" bench step --preset bench --steps 5 --warmup 2 --threads 1 --profile
