#!/usr/bin/env bash
# The step benchmark of the `bench` preset: ctuner and every PyTorch peer in
# one run, on the same machine, shape and thread count, with the peak RSS of
# each (docs/performance.md); then the cores' FMA peak with each SGEMM path
# against it (`ctuner bench peak`) and the step's per-op-family profile
# (`ctuner bench step --profile`, all threads and one thread; docs/gemm.md).
#   scripts/bench.sh path/to/ctuner [threads]
# Peers (same shape: batch 16, 16x16 latent, 16 text tokens, 39.9 M parameters;
# one flow-matching step = forward, MSE, backward, AdamW; warm-up, then the
# median of BENCH_STEPS):
#   torch1.13   scripts/mmdit_torch.py under Debian's python3-torch (eager fp32,
#               bf16 autocast), skipped if /usr/bin/python3 has no torch
#   torch2      scripts/flux_torch_bench.py: diffusers' FluxTransformer2DModel on
#               PyPI torch 2 (eager fp32, bf16 autocast, torch.compile fp32 and
#               bf16) from the venv of `scripts/py_deps.sh diffusers`, which this
#               script installs when it is missing (saying so on stderr)
# Interleaved: ctuner runs before the first peer and after every peer, in
# float32 and then with --mixed_precision bf16 (bf16 products, docs/gemm.md),
# and each ratio ours/peer uses the mean of the two ctuner runs of that
# precision around that peer, so drift of a shared machine hits both sides
# alike; the summary also gives ours-bf16 over the fastest torch bf16 step.
# Environment: BENCH_STEPS (10), BENCH_WARMUP (3), BENCH_PEERS (all: "torch1.13
# torch2"), BENCH_MODES (torch2 modes, default all four), BENCH_BF16 (1; 0
# skips ctuner's bf16 runs).
# OPENBLAS_CORETYPE is left as found (ctuner's GEMMs are its own; Debian's
# torch links OpenBLAS and follows it; PyPI torch uses MKL and ignores it). For
# the Debian peer's best figure: env -u OPENBLAS_CORETYPE scripts/bench.sh build/ctuner
set -euo pipefail
CT=${1:-build/ctuner}
THREADS=${2:-$(nproc)}
STEPS=${BENCH_STEPS:-10}
WARMUP=${BENCH_WARMUP:-3}
PEERS=${BENCH_PEERS:-torch1.13 torch2}
MODES=${BENCH_MODES:-eager-fp32 eager-bf16 compile-fp32 compile-bf16}
HERE=$(cd "$(dirname "$0")" && pwd)
VENV2=${CT_PY_VENV_TORCH2:-$HOME/.cache/ctuner/py-venv-torch2}
echo "OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-<unset>} threads=$THREADS steps=$STEPS warmup=$WARMUP"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
k=0
# run NAME CMD...: one JSON line into $tmp/NAME.json (tee'd), peak RSS into $tmp/NAME.rss
run() {
  local name=$1
  shift
  echo "== $name" >&2
  /usr/bin/time -f '%M' -o "$tmp/$name.rss" "$@" >"$tmp/$name.json" 2>"$tmp/$name.err" || true
  tail -n 1 "$tmp/$name.json"
  [ -s "$tmp/$name.json" ] || tail -n 5 "$tmp/$name.err" >&2
}
ours() {
  run "ours.$k" "$CT" bench step --preset bench --steps "$STEPS" --warmup "$WARMUP" --threads "$THREADS"
  echo "ours.$k" >>"$tmp/order"
  if [ "${BENCH_BF16:-1}" != 0 ]; then
    run "ours-bf16.$k" "$CT" bench step --preset bench --steps "$STEPS" --warmup "$WARMUP" \
      --threads "$THREADS" --mixed_precision bf16
    echo "ours-bf16.$k" >>"$tmp/order"
  fi
  k=$((k + 1))
}
peer() { # peer NAME CMD...
  run "peer.$1" "${@:2}"
  echo "peer.$1" >>"$tmp/order"
}

ours
for p in $PEERS; do
  case "$p" in
  torch1.13)
    if ! /usr/bin/python3 -c "import torch" 2>/dev/null; then
      echo "bench: /usr/bin/python3 has no torch (scripts/deps.sh installs python3-torch): torch1.13 not run" >&2
      continue
    fi
    peer torch1.13-eager-fp32 /usr/bin/python3 "$HERE/mmdit_torch.py" bench --preset bench \
      --threads "$THREADS" --steps "$STEPS" --warmup "$WARMUP"
    ours
    peer torch1.13-eager-bf16 /usr/bin/python3 "$HERE/mmdit_torch.py" bench --preset bench \
      --threads "$THREADS" --steps "$STEPS" --warmup "$WARMUP" --bf16
    ours
    ;;
  torch2)
    if ! "$VENV2/bin/python" -c "import diffusers, torch" 2>/dev/null; then
      echo "bench: $VENV2 has no torch 2 + diffusers: installing it with scripts/py_deps.sh diffusers" \
        "(PyPI torch + diffusers 0.42.1, ~1.5 min and 5.5 GB on a fast link)" >&2
      if ! "$HERE/py_deps.sh" diffusers >/dev/null; then
        echo "bench: scripts/py_deps.sh diffusers failed: torch2 not run" >&2
        continue
      fi
    fi
    for m in $MODES; do
      peer "torch2-$m" "$VENV2/bin/python" "$HERE/flux_torch_bench.py" --mode "$m" \
        --threads "$THREADS" --steps "$STEPS" --warmup "$WARMUP"
      ours
    done
    ;;
  *) echo "bench: unknown peer '$p' (torch1.13, torch2)" >&2 ;;
  esac
done

/usr/bin/python3 - "$tmp" <<'PY'
import json, os, sys
d = sys.argv[1]
order = open(os.path.join(d, "order")).read().split()
def load(n):
    try:
        j = json.loads(open(os.path.join(d, n + ".json")).read().strip().splitlines()[-1])
    except Exception:
        j = {"error": "no output: " + " | ".join(open(os.path.join(d, n + ".err")).read().strip().splitlines()[-2:])}
    try:
        j["rss_mb"] = round(int(open(os.path.join(d, n + ".rss")).read().split()[-1]) / 1024, 1)
    except Exception:
        j["rss_mb"] = None
    return j
runs = {n: load(n) for n in order}
ours = [runs[n] for n in order if n.startswith("ours.")]
oms = [o["ms_per_step_median"] for o in ours if "ms_per_step_median" in o]
obf = [runs[n]["ms_per_step_median"] for n in order if n.startswith("ours-bf16.") and "ms_per_step_median" in runs[n]]
print(f"{'run':<28} {'ms/step':>10} {'ours ms':>10} {'ours/peer':>10} {'peak RSS MB':>12} {'ours-bf16 ms':>13} {'bf16/peer':>10}")
for n in order:
    r = runs[n]
    if n.startswith("ours"):
        print(f"{n:<28} {r.get('ms_per_step_median', 'failed'):>10} {'':>10} {'':>10} {r['rss_mb']!s:>12}")
summary = {"ours_ms_median_of_runs": sorted(oms)[len(oms) // 2] if oms else None,
           "ours_bf16_ms_median_of_runs": sorted(obf)[len(obf) // 2] if obf else None,
           "ours_peak_rss_mb": max((o["rss_mb"] or 0) for o in ours), "peers": {}}
def around(i, prefix):  # ms of the nearest run of prefix before and after position i
    b = [m for m in order[:i] if m.startswith(prefix)][-1:]
    a = [m for m in order[i + 1:] if m.startswith(prefix)][:1]
    return [runs[m]["ms_per_step_median"] for m in b + a if "ms_per_step_median" in runs[m]]
best_bf16 = None
for i, n in enumerate(order):
    if not n.startswith("peer."):
        continue
    r = runs[n]
    o, ob = around(i, "ours."), around(i, "ours-bf16.")
    obm = sum(ob) / len(ob) if ob else None
    name = n[5:]
    if "ms_per_step_median" not in r:
        print(f"{name:<28} {'not run':>10}   {r.get('error', '')}")
        summary["peers"][name] = {"error": r.get("error"), "where": r.get("where")}
        continue
    om = sum(o) / len(o) if o else None
    ratio = round(om / r["ms_per_step_median"], 3) if om else None
    rbf = round(obm / r["ms_per_step_median"], 3) if obm else None
    print(f"{name:<28} {r['ms_per_step_median']:>10} {round(om, 1) if om else '-':>10} {ratio!s:>10} {r['rss_mb']!s:>12}"
          f" {round(obm, 1) if obm else '-':>13} {rbf!s:>10}")
    summary["peers"][name] = {"ms": r["ms_per_step_median"], "ours_ms_around": round(om, 2) if om else None,
                              "time_ratio_ours_over_peer": ratio, "peer_peak_rss_mb": r["rss_mb"],
                              "ours_bf16_ms_around": round(obm, 2) if obm else None,
                              "time_ratio_ours_bf16_over_peer": rbf,
                              "version": r.get("torch", r.get("version"))}
    if "bf16" in name and obm and (best_bf16 is None or r["ms_per_step_median"] < best_bf16[1]):
        best_bf16 = (name, r["ms_per_step_median"], obm)
if best_bf16:  # issue 20's target: ours-bf16 <= 0.4x the fastest torch bf16 step
    summary["fastest_torch_bf16"] = {"peer": best_bf16[0], "ms": best_bf16[1],
                                     "time_ratio_ours_bf16_over_it": round(best_bf16[2] / best_bf16[1], 3)}
print(json.dumps(summary))
PY
echo "== FMA peak and SGEMM paths (ctuner bench peak)"
"$CT" bench peak --threads "$THREADS"
echo "== per-op profile, $THREADS threads (ctuner bench step --profile)"
"$CT" bench step --preset bench --steps 10 --warmup 3 --threads "$THREADS" --profile
echo "== per-op profile, 1 thread"
"$CT" bench step --preset bench --steps 5 --warmup 2 --threads 1 --profile
