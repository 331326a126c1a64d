#!/usr/bin/env bash
# mixed_precision bf16 computes the linear layers' matrix products with bf16
# operands and float32 sums (the cpu-bf16 backend, docs/gemm.md). On one short
# run of the tiny preset:
#  - deterministic: 1 and 2 threads give the same losses, gradient norms and
#    final weights; so does a run killed during its last checkpoint and resumed;
#  - CPU-independent: the fallback of CPUs without AVX512-BF16 (CT_GEMM=nobf16:
#    rounded copies through the float32 kernel) gives the same bits as the
#    AVX512-BF16 kernel;
#  - really bf16: it differs from bf16 storage with float32 products
#    (CT_BF16_COMPUTE=0);
#  - close to float32: its losses track the mixed_precision no run's (mean
#    relative gap printed; must stay under 2%).
# Usage: tests/cli_bf16.sh path/to/ctuner
. "$(dirname "$0")/lib/common.sh"
. "$(dirname "$0")/lib/shapes.sh"
shapes_fixture 32
cat > "$tmp/base.json" <<JSON
{"--data_backend_config": "$tmp/backend.json", "--resolution": 16, "--aspect_bucket_alignment": 8,
 "--learning_rate": 1e-3, "--disable_validation": true, "--seed": 7, "--max_train_steps": 6,
 "--checkpoint_step_interval": 3, "--max_grad_norm": 1.0, "--disable_progress_bar": true,
 "--preset": "tiny", "--optimizer": "adamw", "--use_ema": false, "--train_batch_size": 4,
 "--mixed_precision": "bf16"}
JSON

# run NAME THREADS [flags...]: trains into $tmp/NAME
run() {
  local name=$1 th=$2
  shift 2
  OMP_NUM_THREADS=$th "$CT" train --config "$tmp/base.json" --output_dir="$tmp/$name" "$@" \
    >/dev/null 2>"$tmp/$name.err"
}
# the losses and gradient norms of a run, one line
losses() {
  /usr/bin/python3 -c '
import json, sys
L = [x for x in map(json.loads, open(sys.argv[1])) if "loss" in x]
print(" ".join(repr(x["loss"]) + "/" + repr(x["grad_norm"]) for x in L))' "$tmp/$1/metrics.jsonl"
}
same() { # same NAME1 NAME2 WHAT: losses and final weights bit-identical
  if [ "$(losses "$1")" = "$(losses "$2")" ] &&
    cmp -s "$tmp/$1/checkpoint-6/model.safetensors" "$tmp/$2/checkpoint-6/model.safetensors"; then
    ok "$3: losses, gradient norms and final weights bit-identical"
  else
    bad "$3 differ"
    echo "  $1: $(losses "$1" | cut -c1-200)"
    echo "  $2: $(losses "$2" | cut -c1-200)"
  fi
}

run t1 1 || bad "bf16 run (1 thread): $(tail -3 "$tmp/t1.err")"
grep -q "bf16 operands and float32 sums" "$tmp/t1.err" && ok "the log says the products are bf16" \
  || bad "no bf16-compute line in the log: $(grep -i bf16 "$tmp/t1.err" | head -2)"
run t2 2 || bad "bf16 run (2 threads)"
same t1 t2 "1 and 2 threads"

CT_GEMM=nobf16 run copies 2 || bad "bf16 run with CT_GEMM=nobf16"
grep -q "(bf16_copies)" "$tmp/copies.err" && ok "CT_GEMM=nobf16 takes the fallback" \
  || bad "CT_GEMM=nobf16 did not take the fallback"
same t1 copies "AVX512-BF16 kernel and the fallback's copies"

(CTUNER_FAULT_KILL_AT_CHECKPOINT=6 run cut 2) 2>/dev/null
[ -f "$tmp/cut/checkpoint-3/model.safetensors" ] && [ ! -e "$tmp/cut/checkpoint-6" ] \
  && ok "killed during checkpoint-6" || bad "fault hook: $(ls "$tmp/cut")"
run cut 2 || bad "resume: $(tail -3 "$tmp/cut.err")"
same t1 cut "uninterrupted and resumed from checkpoint-3"

CT_BF16_COMPUTE=0 run store 2 || bad "bf16 storage, float32 products"
if [ "$(losses t1)" != "$(losses store)" ]; then ok "bf16 products differ from float32 products"
else bad "CT_BF16_COMPUTE=0 changed nothing: are the products bf16?"; fi

run f32 2 --mixed_precision=no || bad "float32 run"
gap=$(/usr/bin/python3 - "$tmp/t1/metrics.jsonl" "$tmp/f32/metrics.jsonl" <<'PY'
import json, sys
a, b = ([x["loss"] for x in map(json.loads, open(p)) if "loss" in x] for p in sys.argv[1:3])
assert len(a) == len(b) == 6, (len(a), len(b))
print("%.2e %.2e" % (sum(abs(x - y) for x, y in zip(a, b)) / sum(b), max(abs(x - y) / y for x, y in zip(a, b))))
PY
) || bad "loss comparison"
read -r mean_gap max_gap <<<"$gap"
if /usr/bin/python3 -c "import sys; sys.exit(0 if float('$mean_gap') < 0.02 else 1)"; then
  ok "losses track float32: mean relative gap $mean_gap, largest $max_gap over 6 steps"
else
  bad "losses drift from float32: mean relative gap $mean_gap, largest $max_gap"
fi
for r in t1 store f32; do echo "  $r: $(losses $r | cut -c1-300)"; done
exit $fail
