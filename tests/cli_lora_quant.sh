#!/usr/bin/env bash
# model_type lora on a frozen base stored narrow (base_model_precision,
# docs/lora.md): the same LoRA run (tiny preset, all+ffs, same seed and data)
# on a bf16 base and on int8-quanto / int8-torchao bases; the loss curves
# (means over windows of 10 steps) agree within 2% of the bf16 base's, the
# int8 base is logged at about a quarter of float32's bytes, and the
# precisions ctuner does not build (or a quantised base under model_type
# full, or a quantised text encoder) are refused by name. LORA_QUANT_STEPS (default 30) sets the length:
# `make lora-quant-long` runs 200 steps.
# Usage: tests/cli_lora_quant.sh path/to/ctuner
. "$(dirname "$0")/lib/common.sh"
export ASAN_OPTIONS=${ASAN_OPTIONS:-}:detect_leaks=0
. "$(dirname "$0")/lib/shapes.sh"
STEPS=${LORA_QUANT_STEPS:-30}
shapes_fixture 8
cat > "$tmp/base.json" <<JSON
{"--data_backend_config": "$tmp/backend.json", "--resolution": 16, "--aspect_bucket_alignment": 8,
 "--learning_rate": 1e-3, "--seed": 7, "--max_train_steps": $STEPS, "--train_batch_size": 2,
 "--checkpoint_step_interval": 1000, "--max_grad_norm": 1.0, "--disable_progress_bar": true,
 "--preset": "tiny", "--optimizer": "adamw", "--adam_epsilon": 1e-4,
 "--model_type": "lora", "--disable_validation": true,
 "--lora_rank": 4, "--lora_alpha": 8, "--lora_dropout": 0, "--flux_lora_target": "all+ffs",
 "--lora_init_type": "gaussian"}
JSON

# a base that is not the seeded init (its zero final layer and gates pass no gradient)
OMP_NUM_THREADS=2 "$CT" train --config "$tmp/base.json" --model_type=full --max_train_steps=6 \
  --output_dir="$tmp/full" --checkpoint_step_interval=6 >/dev/null 2>"$tmp/full.err" ||
  { echo "FAIL - base: $(tail -3 "$tmp/full.err")"; exit 1; }
/usr/bin/python3 - "$tmp/base.json" "$tmp/full/checkpoint-6/model.safetensors" <<'PY'
import json, sys
c = json.load(open(sys.argv[1])); c["--pretrained_model_path"] = sys.argv[2]
json.dump(c, open(sys.argv[1], "w"))
PY

for p in bf16 int8-quanto int8-torchao; do
  OMP_NUM_THREADS=2 "$CT" train --config "$tmp/base.json" --base_model_precision=$p \
    --disable_validation=false --validation_prompt="a red circle" \
    --validation_step_interval="$STEPS" --validation_num_inference_steps=2 \
    --output_dir="$tmp/$p" >/dev/null 2>"$tmp/$p.err" ||
    { bad "$p: training failed: $(tail -3 "$tmp/$p.err")"; continue; }
  mib=$(grep -o "frozen base takes [0-9.]* MiB (float32: [0-9.]* MiB)" "$tmp/$p.err")
  [ -n "$mib" ] && ok "$p: $mib" || bad "$p: no base size logged: $(tail -2 "$tmp/$p.err")"
  ls "$tmp/$p"/validation/*/*.png >/dev/null 2>&1 || ls -R "$tmp/$p" | grep -q '\.png$' ||
    bad "$p: no validation image"
done

for p in int8-quanto int8-torchao; do
  if r=$(/usr/bin/python3 - "$tmp/bf16/metrics.jsonl" "$tmp/$p/metrics.jsonl" "$STEPS" <<'PY'
import json, sys
def losses(f):
    return [x["loss"] for x in map(json.loads, open(f)) if "loss" in x]
a, b, n = losses(sys.argv[1]), losses(sys.argv[2]), int(sys.argv[3])
if len(a) != n or len(b) != n:
    print(f"{len(a)} and {len(b)} losses, want {n}"); sys.exit(1)
w = 10
worst = max(abs(sum(b[i:i + w]) - sum(a[i:i + w])) / sum(a[i:i + w]) for i in range(0, n, w))
step = max(abs(x - y) / y for x, y in zip(b, a))
print(f"windows of {w}: worst {worst:.4f} of the bf16 base's mean loss; worst single step {step:.4f}; "
      f"last-window mean {sum(b[-w:]) / w:.5f} vs {sum(a[-w:]) / w:.5f}")
sys.exit(0 if worst <= 0.02 and worst > 0 else 1)
PY
  ); then
    ok "$p vs bf16 base, $STEPS steps: $r"
  else
    bad "$p vs bf16 base: $r"
  fi
done

err() { # what want flags...
  local what=$1 want=$2
  shift 2
  if OMP_NUM_THREADS=1 "$CT" train --config "$tmp/base.json" --max_train_steps=1 \
    --output_dir="$tmp/e" "$@" >/dev/null 2>"$tmp/e.err"; then
    bad "$what: accepted"
  elif grep -q -- "$want" "$tmp/e.err"; then
    ok "$what: $(grep -m1 -o -- "$want.\{0,60\}" "$tmp/e.err")"
  else
    bad "$what: $(tail -2 "$tmp/e.err")"
  fi
}
err "fp8 base" "base_model_precision fp8-quanto is not implemented" --base_model_precision=fp8-quanto
err "nf4 base" "base_model_precision nf4-bnb is not implemented" --base_model_precision=nf4-bnb
err "unknown precision" "base_model_precision must be" --base_model_precision=int7
err "full fine-tune" "needs model_type lora" --model_type=full --base_model_precision=int8-quanto
err "quantize_via" "quantize_via" --base_model_precision=int8-quanto --quantize_via=accelerator
err "T5 int4" "text_encoder_2_precision int4-quanto is not implemented" \
  --text_encoder_2_precision=int4-quanto
err "CLIP nf4" "text_encoder_1_precision nf4-bnb is not implemented" \
  --text_encoder_1_precision=nf4-bnb
err "CLIP fp8" "text_encoder_1_precision fp8-quanto is not implemented" \
  --text_encoder_1_precision=fp8-quanto
exit $fail
