#!/usr/bin/env bash
# Device residency without a GPU (docs/training.md, "Compute backends and
# residency"): `ctuner train` on the test backend "sealed", whose memory the
# host cannot touch (any host access outside the backend table is a SIGSEGV,
# any op handed a host buffer aborts), must give the very bits of the same run
# on "cpu" — losses, gradient norms, every checkpoint file, validation images —
# for a full fine-tune (EMA, norm clipping, gradient checkpointing,
# validation), LoRA with dropout on an int8 base (value clipping, Lion),
# mixed_precision bf16 (sealed-bf16), a FLUX.1 pipeline in bf16, and resumes
# across the two (sealed -> cpu, cpu -> sealed). What does not run there yet
# is refused by name.
# Usage: tests/cli_sealed.sh path/to/ctuner
. "$(dirname "$0")/lib/common.sh"
export OMP_NUM_THREADS=2

"$CT" dataset synth --out "$tmp/data" --count 16 --seed 3 >/dev/null || { echo "FAIL - dataset synth"; exit 1; }
cat > "$tmp/backend.json" <<JSON
[{"id": "shapes", "type": "local", "instance_data_dir": "$tmp/data", "caption_strategy": "textfile", "crop": false}]
JSON
cat > "$tmp/base.json" <<JSON
{"--preset": "tiny", "--resolution": 8, "--aspect_bucket_alignment": 8, "--data_backend_config": "$tmp/backend.json",
 "--train_batch_size": 4, "--learning_rate": 1e-3, "--seed": 7, "--max_train_steps": 4,
 "--checkpoint_step_interval": 2, "--disable_progress_bar": true,
 "--validation_prompt": "a red circle", "--validation_step_interval": 4,
 "--validation_num_inference_steps": 2}
JSON
# train NAME BACKEND args...: output in $tmp/NAME-BACKEND, log in .err
train() {
  local name=$1 be=$2; shift 2
  "$CT" train --config "$tmp/base.json" --output_dir="$tmp/$name-$be" --compute_backend="$be" "$@" \
    >/dev/null 2>"$tmp/$name-$be.err"
}
# the loss and gradient norm of every step, as metrics.jsonl prints them
numbers() { grep -o '"step": [0-9]*\|"loss": [^,]*\|"grad_norm": [^,]*' "$1/metrics.jsonl"; }
# same NAME: cpu and sealed gave the same numbers and files, bit for bit
same() {
  local name=$1 a="$tmp/$1-cpu" b="$tmp/$1-sealed" d="" n=0
  grep -q "compute backend sealed" "$tmp/$name-sealed.err" || d="$d (no sealed backend line)"
  [ "$(numbers "$a")" = "$(numbers "$b")" ] || d="$d metrics.jsonl"
  for f in $(cd "$a" && ls checkpoint-*/*.safetensors checkpoint-*/*/*.safetensors pipeline/*/*.safetensors \
    validation_images/*.png pytorch_lora_weights.safetensors 2>/dev/null); do
    n=$((n + 1))
    cmp -s "$a/$f" "$b/$f" || d="$d $f"
  done
  [ "$n" -ge 3 ] || d="$d (only $n files)"
  [ -z "$d" ] && ok "$name: sealed = cpu bit for bit ($n files, losses, gradient norms)" ||
    bad "$name: sealed differs from cpu:$d; $(tail -2 "$tmp/$name-sealed.err")"
}
pair() { # NAME args...: the run on both backends, then compared
  local name=$1; shift
  if train "$name" cpu "$@" && train "$name" sealed "$@"; then same "$name"; else
    bad "$name: a run failed: $(tail -2 "$tmp/$name-cpu.err" "$tmp/$name-sealed.err")"; fi
}

pair full --use_ema=true --ema_validation=comparison --max_grad_norm=0.05 \
  --gradient_checkpointing=true
pair lora --model_type=lora --lora_rank=4 --lora_dropout=0.3 --flux_lora_target=all+ffs \
  --lora_init_type=gaussian --base_model_precision=int8-quanto --grad_clip_method=value \
  --max_grad_norm=0.001 --optimizer=lion
pair bf16 --mixed_precision=bf16 --use_ema=true
grep -q "products on sealed-bf16" "$tmp/bf16-sealed.err" && ok "bf16: the model computes on sealed-bf16" ||
  bad "bf16: no sealed-bf16 line: $(grep -i backend "$tmp/bf16-sealed.err")"

# ---- a FLUX.1 pipeline (tests/data/flux_pipe dev: guidance input, T5) in bf16: its transformer/
# in diffusers' layout beside the master weights, the pipeline's scheduler for validation ----
"$CT" dataset synth --out "$tmp/fdata" --count 4 --seed 5 --size 32x32 >/dev/null
cat > "$tmp/fbackend.json" <<JSON
[{"id": "shapes", "type": "local", "instance_data_dir": "$tmp/fdata", "caption_strategy": "textfile", "crop": false}]
JSON
for be in cpu sealed; do
  "$CT" train --pretrained_model_name_or_path=tests/data/flux_pipe/dev --model_flavour=dev \
    --data_backend_config="$tmp/fbackend.json" --resolution=32 --aspect_bucket_alignment=8 \
    --train_batch_size=1 --disable_progress_bar=true --seed=3 --learning_rate=1e-3 \
    --output_dir="$tmp/flux-$be" --max_train_steps=2 --checkpoint_step_interval=2 \
    --flux_guidance_value=3.5 --validation_prompt="a red circle" --validation_resolution=32 \
    --validation_num_inference_steps=1 --mixed_precision=bf16 --compute_backend=$be \
    >/dev/null 2>"$tmp/flux-$be.err" || bad "flux $be: $(tail -2 "$tmp/flux-$be.err")"
done
same flux

# ---- resume across backends: checkpoint-2 of one, steps 3-4 on the other ----
for p in "cpu sealed" "sealed cpu"; do
  set -- $p
  out="$tmp/resume-$1-$2"
  mkdir -p "$out" && cp -r "$tmp/full-$1/checkpoint-2" "$out/"
  if "$CT" train --config "$tmp/base.json" --output_dir="$out" --compute_backend="$2" \
    --use_ema=true --ema_validation=comparison --max_grad_norm=0.05 --gradient_checkpointing=true \
    --resume_from_checkpoint=latest >/dev/null 2>"$out.err"; then
    d=""
    for f in model ema optimizer; do
      cmp -s "$tmp/full-cpu/checkpoint-4/$f.safetensors" "$out/checkpoint-4/$f.safetensors" || d="$d $f"
    done
    [ "$(numbers "$out")" = "$(numbers "$tmp/full-cpu" | tail -n +7)" ] || d="$d losses"
    [ -z "$d" ] && ok "resume $1 -> $2: the uninterrupted cpu run's bits" || bad "resume $1 -> $2 differs:$d"
  else
    bad "resume $1 -> $2 failed: $(tail -2 "$out.err")"
  fi
done

# ---- an asynchronous device error (the backend's check) stops the run with its message ----
if CTUNER_SEALED_FAULT_AFTER=200 "$CT" train --config "$tmp/base.json" --output_dir="$tmp/fault" \
  --compute_backend=sealed >/dev/null 2>"$tmp/fault.err"; then
  bad "device fault: exit 0"
else
  grep -q "compute backend sealed, .*injected device fault after" "$tmp/fault.err" &&
    ! ls "$tmp/fault"/checkpoint-* >/dev/null 2>&1 && ok "a device error stops the run, named, without a checkpoint" ||
    bad "device fault: $(tail -1 "$tmp/fault.err")"
fi

# ---- refused by name, before anything is cached or computed ----
refused() { # what pattern args...
  local what=$1 pat=$2; shift 2
  if out=$("$CT" train --config "$tmp/base.json" --output_dir="$tmp/refused" "$@" 2>&1); then
    bad "$what: exit 0 on sealed"
  else
    echo "$out" | grep -q -- "$pat" && ok "$what refused by name" ||
      bad "$what: message lacks '$pat': $(echo "$out" | tail -1)"
  fi
}
S=--compute_backend=sealed
# a readable lycoris_config: since issue 32 train opens it before anything (as config check
# does), so a missing one would be the refusal instead of the backend's
echo '{"algo": "lokr", "multiplier": 1, "linear_dim": 10000, "linear_alpha": 1, "factor": 4}' > "$tmp/lyco.json"
refused "lycoris" "lora_type lycoris" $S --model_type=lora --lora_type=lycoris --lycoris_config="$tmp/lyco.json"
refused "dora" "use_dora" $S --model_type=lora --use_dora=true --lora_dropout=0
refused "muon" "optimizer muon" $S --optimizer=muon
refused "lamb" "optimizer lamb" $S --optimizer=lamb
refused "offload" "offload_optimizer" $S --offload_optimizer=cpu
refused "zero_stage 1" "zero_stage 1" $S --zero_stage=1
refused "an unknown backend" "unknown compute backend 'nope'; usable: cpu" --compute_backend=nope
exit $fail
