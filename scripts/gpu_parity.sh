#!/usr/bin/env bash
# Training parity of a device backend against the CPU (scripts/gpu_check.sh's
# part 3; docs/cuda.md): short `ctuner train` runs on the synthetic shapes, the
# same config on `cpu` and on $BACKEND (default cuda), compared step by step:
#   fp32 full fine-tune, 20 steps   losses within 1e-4 relative, every step
#   bf16 (mixed_precision bf16)     within 2e-2 (cpu-bf16 vs cuda-bf16)
#   LoRA rank 4 (dropout 0.1)       within 1e-4
#   the device run twice            bit-identical losses and checkpoint bytes
#   a device checkpoint resumed on the CPU (and the other way)  within 1e-4 of the device run
# Usage: scripts/gpu_parity.sh path/to/ctuner   (BACKEND=sealed runs it against the CPU-side
# test backend, where every comparison is exact)
. "$(dirname "$0")/../tests/lib/common.sh"
. "$(dirname "$0")/../tests/lib/shapes.sh"
BE=${BACKEND:-cuda}
PY=${PYTHON:-python3}
shapes_fixture 32
cat >"$tmp/base.json" <<JSON
{"--data_backend_config": "$tmp/backend.json", "--resolution": 16, "--aspect_bucket_alignment": 8,
 "--learning_rate": 1e-3, "--disable_validation": true, "--seed": 7, "--max_train_steps": 20,
 "--checkpoint_step_interval": 10, "--max_grad_norm": 1.0, "--disable_progress_bar": true,
 "--preset": "small", "--optimizer": "adamw", "--use_ema": true, "--train_batch_size": 4}
JSON

train() { # name backend flags...
  local name=$1 be=$2 t0=$SECONDS
  shift 2
  "$CT" train --config "$tmp/base.json" --compute_backend="$be" "$@" --output_dir="$tmp/$name" \
    >"$tmp/$name.out" 2>"$tmp/$name.err" ||
    { bad "$name ($be): training failed: $(tail -3 "$tmp/$name.err")"; return 1; }
  echo "  $name on $be: $((SECONDS - t0)) s"
}

# compare name-a name-b rtol what: every step's loss within rtol (relative), all steps present
compare() {
  local r
  r=$("$PY" - "$tmp/$1/metrics.jsonl" "$tmp/$2/metrics.jsonl" "$3" <<'PY'
import json, math, sys
def losses(p):
    return {x["step"]: x["loss"] for x in map(json.loads, open(p)) if "loss" in x}
a, b, tol = losses(sys.argv[1]), losses(sys.argv[2]), float(sys.argv[3])
# a resumed run (b) has the steps after its checkpoint only
if not b or not set(b) <= set(a) or (len(b) < len(a) and min(b) <= max(set(a) - set(b))):
    print("steps differ:", sorted(a), sorted(b)); sys.exit(1)
worst = max(abs(a[s] - b[s]) / max(abs(a[s]), 1e-12) if math.isfinite(b[s]) else math.inf for s in b)
print(f"{len(b)} steps, worst relative difference {worst:.3g} (tolerance {tol:g})")
sys.exit(0 if worst <= tol else 1)
PY
  ) && ok "$4: $r" || bad "$4: $r"
}

identical() { # name-a name-b what: losses and checkpoint tensors byte for byte
  local a b
  a=$(grep -o '"step": [0-9]*, "epoch": [0-9]*, "loss": [^,]*, "lr": [^,]*, "grad_norm": [^,]*' "$tmp/$1/metrics.jsonl" | md5sum)
  b=$(grep -o '"step": [0-9]*, "epoch": [0-9]*, "loss": [^,]*, "lr": [^,]*, "grad_norm": [^,]*' "$tmp/$2/metrics.jsonl" | md5sum)
  local ca cb
  ca=$(cd "$tmp/$1" && find . -name '*.safetensors' | sort | xargs md5sum | md5sum)
  cb=$(cd "$tmp/$2" && find . -name '*.safetensors' | sort | xargs md5sum | md5sum)
  if [ "$a" = "$b" ] && [ "$ca" = "$cb" ]; then ok "$3: losses, grad norms and checkpoints identical"; else
    bad "$3: the two runs differ (metrics $([ "$a" = "$b" ] && echo same || echo differ), checkpoints $([ "$ca" = "$cb" ] && echo same || echo differ))"
  fi
}

train fp32-cpu cpu && train fp32-dev "$BE" && compare fp32-cpu fp32-dev 1e-4 "fp32 full fine-tune, cpu vs $BE"
train fp32-dev2 "$BE" && identical fp32-dev fp32-dev2 "$BE run twice"
train bf16-cpu cpu --mixed_precision=bf16 && train bf16-dev "$BE" --mixed_precision=bf16 &&
  compare bf16-cpu bf16-dev 2e-2 "mixed_precision bf16, cpu vs $BE"
LORA=(--model_type=lora --lora_rank=4 --lora_alpha=4 --lora_dropout=0.1 --learning_rate=1e-2)
train lora-cpu cpu "${LORA[@]}" && train lora-dev "$BE" "${LORA[@]}" &&
  compare lora-cpu lora-dev 1e-4 "LoRA rank 4 with dropout, cpu vs $BE"
# a device checkpoint (step 10) resumed on the CPU, and a CPU one on the device
mkdir -p "$tmp/dev-to-cpu" "$tmp/cpu-to-dev"
cp -r "$tmp/fp32-dev/checkpoint-10" "$tmp/dev-to-cpu/" && cp -r "$tmp/fp32-cpu/checkpoint-10" "$tmp/cpu-to-dev/"
train dev-to-cpu cpu --resume_from_checkpoint=latest && compare fp32-dev dev-to-cpu 1e-4 "$BE checkpoint resumed on cpu"
train cpu-to-dev "$BE" --resume_from_checkpoint=latest && compare fp32-cpu cpu-to-dev 1e-4 "cpu checkpoint resumed on $BE"
exit $fail
