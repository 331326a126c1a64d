#!/usr/bin/env bash
# is_regularisation_data (issue 32; docs/lora.md): under model_type lora a
# regularisation dataset's batches train towards the base model's own
# prediction (SimpleTuner's trainer: the parent model's output with the
# adapters off as the target). Adapters start with B = 0, so the adapted
# model predicts what the base does: the loss of such a batch is exactly 0,
# no gradient reaches the adapters and B stays exactly zero, step after step;
# the same data without the flag trains (loss > 0, B moves). ZeRO-3 over two
# ranks (the frozen base gathered per block, once more for the base pass)
# gives the same. Under model_type full the flag has no effect (as in
# SimpleTuner) and the config check says so; a dataset with neither spelling
# is ordinary data; the British and the American spelling are one flag.
# Usage: tests/cli_regularisation.sh path/to/ctuner
. "$(dirname "$0")/lib/common.sh"
MPIRUN=(mpirun --oversubscribe --allow-run-as-root)
export ASAN_OPTIONS=${ASAN_OPTIONS:-}:detect_leaks=0
. "$(dirname "$0")/lib/shapes.sh"
shapes_fixture 8
cat > "$tmp/base.json" <<JSON
{"--data_backend_config": "$tmp/backend.json", "--resolution": 16, "--aspect_bucket_alignment": 8,
 "--learning_rate": 1e-3, "--seed": 7, "--max_train_steps": 3, "--disable_progress_bar": true,
 "--preset": "tiny", "--optimizer": "adamw", "--use_ema": false, "--disable_validation": true,
 "--model_type": "lora", "--lora_rank": 4, "--lora_alpha": 4, "--lora_dropout": 0,
 "--flux_lora_target": "all+ffs", "--train_batch_size": 2}
JSON
. "$(dirname "$0")/lib/adapters.sh"
adapter_base
for spelling in is_regularisation_data is_regularization_data; do
  cat > "$tmp/reg_$spelling.json" <<JSON
[{"id": "prior", "type": "local", "instance_data_dir": "$tmp/data", "caption_strategy": "textfile",
  "crop": false, "$spelling": true}]
JSON
done

# losses (and grad norms) all exactly 0, and every lora_B exactly zero: python exits 0
zero_run() { # dir
  /usr/bin/python3 - "$1" <<'PY'
import json, struct, sys
L = [(x["loss"], x["grad_norm"]) for x in map(json.loads, open(sys.argv[1] + "/metrics.jsonl")) if "loss" in x]
b = open(sys.argv[1] + "/pytorch_lora_weights.safetensors", "rb").read()
n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n])
B = [k for k in h if k.endswith("lora_B.weight")]
zero = all(not any(b[8 + n + h[k]["data_offsets"][0]:8 + n + h[k]["data_offsets"][1]]) for k in B)
print("  steps", len(L), "losses/grad norms", L, "B all zero:", zero, file=sys.stderr)
sys.exit(not (len(L) == 3 and B and zero and all(l == 0 and g == 0 for l, g in L)))
PY
}

if train reg 1 --data_backend_config="$tmp/reg_is_regularisation_data.json"; then
  zero_run "$tmp/reg" 2>"$tmp/reg.py" &&
    ok "regularisation data: loss 0 and no gradient at every step, B stays zero (the target is the base model's prediction)" ||
    bad "regularisation run: $(cat "$tmp/reg.py")"
fi
if train plain 1; then
  ! zero_run "$tmp/plain" 2>/dev/null &&
    ok "the same data without the flag trains (loss > 0, B moves)" || bad "the plain run did not train"
fi
if train reg_us 1 --data_backend_config="$tmp/reg_is_regularization_data.json"; then
  same reg reg_us "is_regularization_data (American spelling) = is_regularisation_data"
fi
if command -v mpirun >/dev/null; then
  if train reg_z3 2 --data_backend_config="$tmp/reg_is_regularisation_data.json" --train_batch_size=1 \
    --zero_stage=3; then
    zero_run "$tmp/reg_z3" 2>"$tmp/reg_z3.py" &&
      ok "2 ranks, ZeRO-3 (the base gathered again for the base pass): loss 0, B stays zero" ||
      bad "ZeRO-3 regularisation run: $(cat "$tmp/reg_z3.py")"
  fi
else
  bad "mpirun not found: run scripts/deps.sh"
fi

# model_type full: no effect, named by config check (and by train, in its log)
"$CT" config check "$tmp/base.json" --model_type=full --lora_rank=4 \
  --data_backend_config="$tmp/reg_is_regularisation_data.json" >"$tmp/full.out" 2>&1
grep -q "is_regularisation_data has no effect with model_type full" "$tmp/full.out" &&
  ok "model_type full: config check says is_regularisation_data has no effect" ||
  bad "model_type full: $(grep -i regularis "$tmp/full.out" || tail -3 "$tmp/full.out")"
"$CT" config check "$tmp/base.json" --data_backend_config="$tmp/reg_is_regularisation_data.json" \
  >"$tmp/lora.out" 2>&1
! grep -qi "\(warning\|error\):.*regularis" "$tmp/lora.out" &&
  ok "model_type lora: no problem about the flag" || bad "lora: $(grep -i regularis "$tmp/lora.out")"
exit $fail
