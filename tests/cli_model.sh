#!/usr/bin/env bash
# End-to-end: the real ctuner binary on golden files (committed ones and fresh
# ones from the PyTorch peer with other configs), model info, bench step, and
# usage errors. Usage: tests/cli_model.sh path/to/ctuner
. "$(dirname "$0")/lib/common.sh"
PEER=$(dirname "$0")/../scripts/mmdit_torch.py

for g in tests/data/golden_tiny.safetensors tests/data/golden_odd.safetensors; do
  if out=$("$CT" model check --golden "$g"); then ok "model check $g"; else bad "model check $g: $out"; fi
  echo "$out" | grep -q '"pass": true' || bad "no pass:true in $out"
done

# A too-tight tolerance must fail (the check can fail).
if "$CT" model check --golden tests/data/golden_tiny.safetensors --tol 1e-12 >/dev/null 2>&1; then
  bad "tol 1e-12 passed"; else ok "tol 1e-12 fails"; fi

# Fresh golden files from the peer with configs not committed.
if /usr/bin/python3 -c "import torch" 2>/dev/null && [ -f "$PEER" ]; then
  i=0
  while read -r sets; do
    i=$((i+1))
    args=()
    for s in $sets; do args+=(--set "$s"); done
    /usr/bin/python3 "$PEER" golden --preset tiny --seed $((40+i)) "${args[@]}" --out "$tmp/g$i.safetensors" >/dev/null \
      || { bad "peer golden $sets"; continue; }
    if out=$("$CT" model check --golden "$tmp/g$i.safetensors"); then ok "fresh golden [$sets]"; else bad "fresh golden [$sets]: $out"; fi
  done <<'CFG'
hw=2,2 B=1 T=1
hw=10,4 hidden=72 heads=3 axes=4,10,10 T=9 B=4 nd=0 ns=2
hw=8,14 hidden=32 heads=1 axes=8,12,12 nd=2 ns=0 ctx=16 vec=8 T=3 lat=2
hw=6,6 hidden=128 heads=4 axes=8,12,12 T=11 B=2 nd=1 ns=3 lat=16
CFG
  # a too-tight tolerance fails on a fresh golden too
  if "$CT" model check --golden "$tmp/g1.safetensors" --tol 1e-12 >/dev/null 2>&1; then
    bad "fresh golden: tol 1e-12 passed"; else ok "fresh golden: tol 1e-12 fails"; fi
else
  skip "python3-torch not installed: fresh golden files from the peer not generated or checked"
fi

# model info on the shape-only flux-dev preset
out=$("$CT" model info --preset flux-dev) && echo "$out" | grep -q '"params": 11901408320' \
  && ok "model info flux-dev" || bad "model info flux-dev: $out"

# bench step runs and prints its fields
out=$("$CT" bench step --preset tiny --steps 2 --warmup 1 --threads 2 --sgemm_size 128) || bad "bench step tiny"
for k in preset threads params ms_per_step_median gflops sgemm_gflops mfu_vs_sgemm ct_sgemm_gflops \
         mfu_vs_ct_sgemm ct_sgemm_path; do
  echo "$out" | grep -q "\"$k\"" || bad "bench output lacks $k: $out"
done
ok "bench step tiny"

# --profile: a table of op families, then the JSON line with the same under "profile";
# the families' CPU times and the untimed rest add up to the step's
out=$("$CT" bench step --preset tiny --steps 2 --warmup 1 --threads 1 --profile --sgemm_size 128) || bad "bench step --profile"
for f in gemm attention norm rope modulation activation optimizer untimed step; do
  echo "$out" | grep -q "^$f " || bad "profile table lacks $f: $out"
done
echo "$out" | tail -1 | /usr/bin/python3 -c '
import json, sys
p = json.load(sys.stdin)["profile"]
fam = [v for k, v in p.items() if isinstance(v, dict)]
assert len(fam) >= 7 and all(v["calls_per_step"] > 0 for v in fam), p
total = sum(v["cpu_ms"] for v in fam) + p["untimed_cpu_ms"]
assert abs(total - p["step_cpu_ms"]) < 1e-3 * max(1, p["step_cpu_ms"]) + 0.01, (total, p)
assert p["gemm"]["forward_ms"] > 0 and p["gemm"]["backward_ms"] > 0, p
' && ok "bench step --profile" || bad "bench step --profile JSON: $out"

# bench peak: one line per ISA this CPU has and one per SGEMM path
out=$("$CT" bench peak --size 128 --threads 1 --loop_iters 200000) || bad "bench peak"
echo "$out" | grep -q '"peak_gflops_core"' && echo "$out" | grep -q '"path": "blas"' &&
  echo "$out" | grep -q '"path": "bf16"' &&
  ok "bench peak" || bad "bench peak output: $out"

# usage errors exit 2 with a message naming the problem
"$CT" bench step --preset nope >/dev/null 2>"$tmp/err"; rc=$?
[ $rc -eq 2 ] && grep -q "unknown preset 'nope'" "$tmp/err" && ok "unknown preset" || bad "unknown preset rc=$rc $(cat "$tmp/err")"
"$CT" model check --golden "$tmp/missing.safetensors" >/dev/null 2>"$tmp/err"; rc=$?
[ $rc -eq 1 ] && grep -q "missing.safetensors" "$tmp/err" && ok "missing golden" || bad "missing golden rc=$rc"
printf 'not a safetensors file' > "$tmp/junk.safetensors"
"$CT" model check --golden "$tmp/junk.safetensors" >/dev/null 2>"$tmp/err"; rc=$?
[ $rc -eq 1 ] && ok "junk golden: $(cat "$tmp/err")" || bad "junk golden rc=$rc"
"$CT" --help | grep -q "bench step" && ok "--help" || bad "--help"
"$CT" bench --help | grep -q "mfu_vs_sgemm" && ok "bench --help" || bad "bench --help"
"$CT" frobnicate >/dev/null 2>&1; [ $? -eq 2 ] && ok "unknown command" || bad "unknown command"
finish
