#!/usr/bin/env bash
# use_dora end to end (docs/lora.md): peft's DoRA on standard LoRA, a few
# steps of the tiny preset (all+ffs, lora_dropout 0); every adapter's
# lora_magnitude_vector in the files and use_dora in their LoraConfig; the
# magnitudes move; 2 ranks under ZeRO-2 equal 1 rank; a resume gives the
# uninterrupted run's numbers bit for bit; dropout and ZeRO-3 refused.
# Usage: tests/cli_dora.sh path/to/ctuner
. "$(dirname "$0")/lib/common.sh"
MPIRUN=(mpirun --oversubscribe --allow-run-as-root)
export ASAN_OPTIONS=${ASAN_OPTIONS:-}:detect_leaks=0
command -v mpirun >/dev/null || { echo "FAIL - mpirun not found: run scripts/deps.sh"; exit 1; }
. "$(dirname "$0")/lib/shapes.sh"
shapes_fixture 8
cat > "$tmp/base.json" <<JSON
{"--data_backend_config": "$tmp/backend.json", "--resolution": 16, "--aspect_bucket_alignment": 8,
 "--learning_rate": 1e-3, "--seed": 7, "--max_train_steps": 4,
 "--checkpoint_step_interval": 2, "--max_grad_norm": 1.0, "--disable_progress_bar": true,
 "--preset": "tiny", "--optimizer": "adamw", "--adam_epsilon": 1e-4, "--use_ema": true,
 "--model_type": "lora", "--lora_rank": 4, "--lora_alpha": 8, "--lora_dropout": 0,
 "--flux_lora_target": "all+ffs", "--use_dora": true, "--disable_validation": true}
JSON

. "$(dirname "$0")/lib/adapters.sh"
adapter_base

if train one 1 --train_batch_size=2; then
  grep -q "LoRA all+ffs: .* adapters, rank 4, alpha 8 (scale 2)" "$tmp/one.err" &&
    [ "$(ls "$tmp/one"/checkpoint-*/pytorch_lora_weights.safetensors | wc -l)" = 2 ] &&
    ok "adapter files in every checkpoint" || bad "no DoRA run: $(tail -2 "$tmp/one.err")"
  /usr/bin/python3 - "$tmp/one" "$tmp/one/checkpoint-2" <<'PY' && ok "lora_magnitude_vector per adapter (1-D), use_dora true; losses finite; the magnitudes moved" || bad "the DoRA file or training"
import json, struct, sys
def read(d):
    b = open(d + "/pytorch_lora_weights.safetensors", "rb").read()
    n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n])
    meta = json.loads(h.pop("__metadata__")["lora_adapter_metadata"])
    return {k: (v["shape"], b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]]) for k, v in h.items()}, meta
L = [x["loss"] for x in map(json.loads, open(sys.argv[1] + "/metrics.jsonl")) if "loss" in x]
end, meta = read(sys.argv[1]); mid, _ = read(sys.argv[2])
mags = [k for k in end if k.endswith(".lora_magnitude_vector")]
A = [k for k in end if k.endswith(".lora_A.weight")]
sys.exit(not (len(L) == 4 and all(x == x for x in L) and meta["transformer.use_dora"] is True
              and len(mags) == len(A) > 0 and all(len(end[k][0]) == 1 for k in mags)
              and all(end[k][1] != mid[k][1] for k in mags)))
PY
fi
train z2 2 --train_batch_size=1 --zero_stage=2 && near z2 one "2 ranks ZeRO-2 = 1 rank"
mkdir -p "$tmp/res1" && cp -r "$tmp/one/checkpoint-2" "$tmp/res1/" &&
  train res1 1 --train_batch_size=2 --resume_from_checkpoint=latest &&
  same one res1 "resume at step 2 on 1 rank" checkpoint-4
err "dora with dropout" "use_dora with lora_dropout 0.2 is not implemented" --lora_dropout=0.2
err "dora at ZeRO-3" "use_dora with zero_stage 3 is not implemented" --zero_stage=3
err "a DoRA file for plain LoRA" "not an adapter for this model" \
  --init_lora="$tmp/one/pytorch_lora_weights.safetensors" --use_dora=false
exit $fail
