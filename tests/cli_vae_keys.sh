#!/usr/bin/env bash
# model_type vae on the shared training loop (docs/vae.md): every training key
# that the MMDiT honours is honoured by the VAE or refused by name — ZeRO-1,
# use_ema, NVMe optimizer offload, max_nonfinite_steps, disable_validation,
# the per-rank thread split; ZeRO-2/3, bf16 storage, offload_param and the
# 1-bit optimizers are refused with their reason.
# Usage: tests/cli_vae_keys.sh path/to/ctuner
. "$(dirname "$0")/lib/common.sh"
MPIRUN=(mpirun --oversubscribe --allow-run-as-root)
export ASAN_OPTIONS=${ASAN_OPTIONS:-}:detect_leaks=0
PY=/usr/bin/python3

. "$(dirname "$0")/lib/shapes.sh"
shapes_fixture 16
cat > "$tmp/base.json" <<JSON
{"--model_type": "vae", "--vae_config": "$tmp/vae.json", "--resolution": 16, "--aspect_bucket_alignment": 8,
 "--data_backend_config": "$tmp/backend.json", "--train_batch_size": 2, "--learning_rate": 2e-3, "--seed": 3,
 "--max_train_steps": 6, "--checkpoint_step_interval": 3, "--validation_step_interval": 3,
 "--disable_progress_bar": true, "--vae_stats_images": 4, "--use_ema": false}
JSON
# same.py A B [tol]: the losses of two runs, equal (tol 0) or within tol relative
cat > "$tmp/same.py" <<'PY'
import json, sys
def losses(r):
    return [x["loss"] for x in map(json.loads, open(r + "/metrics.jsonl")) if "loss" in x]
a, b = losses(sys.argv[1]), losses(sys.argv[2])
tol = float(sys.argv[3]) if len(sys.argv) > 3 else 0.0
assert len(a) == len(b) > 0, (len(a), len(b))
err = max(abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a, b))
assert err <= tol, (err, a, b)
print(f"{len(a)} losses, max relative difference {err:.2e}")
PY
train() { # name, then flags
  local n=$1
  shift
  "$CT" train --config "$tmp/base.json" --output_dir="$tmp/$n" "$@" >/dev/null 2>"$tmp/$n.err"
}
train2() { # name, then flags: 2 ranks x batch 1
  local n=$1
  shift
  "${MPIRUN[@]}" -np 2 -x OMP_NUM_THREADS=1 "$CT" train --config "$tmp/base.json" --output_dir="$tmp/$n" \
    --train_batch_size=1 "$@" >/dev/null 2>"$tmp/$n.err"
}

# plain data parallel and ZeRO-1 (the optimizer state sharded) give the same steps
if train2 dp && train2 z1 --zero_stage=1; then
  r=$("$PY" "$tmp/same.py" "$tmp/z1" "$tmp/dp" 1e-6) && ok "zero_stage 1 on 2 ranks == zero_stage 0 ($r)" ||
    bad "zero_stage 1 differs: $r"
  ls "$tmp/z1/checkpoint-6/zero/" 2>/dev/null | grep -q "rank-1-of-2" && ok "ZeRO-1 checkpoint holds each rank's fragments" ||
    bad "no ZeRO fragments: $(ls -R "$tmp/z1/checkpoint-6" | head)"
  grep -q "1 OpenMP thread(s) per rank" "$tmp/dp.err" && ok "thread count reported per rank" ||
    bad "thread line: $(grep -m1 effective "$tmp/dp.err")"
else
  bad "2-rank VAE runs failed: $(tail -2 "$tmp/dp.err" "$tmp/z1.err")"
fi
# without OMP_NUM_THREADS, two ranks on this machine split its cores
if env -u OMP_NUM_THREADS "${MPIRUN[@]}" -np 2 "$CT" train --config "$tmp/base.json" --output_dir="$tmp/split" \
    --train_batch_size=1 --max_train_steps=1 >/dev/null 2>"$tmp/split.err"; then
  want=$(($(nproc) / 2))
  [ "$want" -lt 1 ] && want=1
  grep -q "($want OpenMP thread(s) per rank)" "$tmp/split.err" && ok "plain mpirun: $want thread(s) per rank (the cores split)" ||
    bad "thread split: $(grep -m1 effective "$tmp/split.err")"
else
  bad "split run failed: $(tail -2 "$tmp/split.err")"
fi

# use_ema: an EMA beside the weights, resumable
if train ema --use_ema=true && [ -f "$tmp/ema/checkpoint-6/ema.safetensors" ]; then
  r=$("$PY" - "$tmp/ema/checkpoint-6" <<'PY'
import json, struct, sys
import numpy as np
def load_file(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    return {k: np.frombuffer(b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]], dtype=np.float32)
            for k, v in h.items() if k != "__metadata__"}
d = sys.argv[1]
m, e = load_file(d + "/vae/diffusion_pytorch_model.safetensors"), load_file(d + "/ema.safetensors")
assert m.keys() == e.keys(), "tensor names differ"
diff = max(float(abs(m[k] - e[k]).max()) for k in m)
assert diff > 0, "the EMA equals the weights"
print(f"{len(m)} tensors, max |ema - weights| {diff:.3g}")
PY
  ) && ok "use_ema: ema.safetensors under the VAE's names ($r)" || bad "ema: $r"
  train ema --use_ema=true --max_train_steps=8 --resume_from_checkpoint=latest && ok "use_ema resumes" ||
    bad "ema resume: $(tail -2 "$tmp/ema.err")"
else
  bad "use_ema run: $(tail -2 "$tmp/ema.err")"
fi

# offload_optimizer nvme: the same steps as in memory
if train mem && train off --offload_optimizer=nvme --offload_param_path="$tmp/swap"; then
  r=$("$PY" "$tmp/same.py" "$tmp/off" "$tmp/mem") && ok "offload_optimizer nvme == in memory ($r)" || bad "offload differs: $r"
  grep -q "offload nvme" "$tmp/off.err" && ok "offload reported" || bad "offload not reported"
else
  bad "offload run: $(tail -2 "$tmp/off.err")"
fi

# max_nonfinite_steps: a NaN step is skipped; too many in a row stop the run
if CTUNER_FAULT_NAN_AT_STEP=2 train nan; then
  grep -q "step 2: the loss is not finite; step skipped" "$tmp/nan.err" &&
    grep -q '"step": 2,.*"skipped": true' "$tmp/nan/metrics.jsonl" && ok "a NaN loss skips its step" ||
    bad "skip: $(grep -m2 "finite" "$tmp/nan.err")"
else
  bad "NaN step failed the run: $(tail -2 "$tmp/nan.err")"
fi
CTUNER_FAULT_NAN_AT_STEP=2,3 train nan2 --max_nonfinite_steps=2
rc=$?
[ $rc != 0 ] && grep -q "2 consecutive steps had NaN/Inf" "$tmp/nan2.err" && ok "max_nonfinite_steps 2 stops (exit $rc)" ||
  bad "max_nonfinite_steps: exit $rc: $(tail -2 "$tmp/nan2.err")"

# disable_validation: no grid, no PSNR
if train noval --disable_validation=true; then
  [ ! -d "$tmp/noval/validation_images" ] && ! grep -q validation_psnr "$tmp/noval/metrics.jsonl" &&
    ok "disable_validation: no validation images or PSNR" || bad "validation ran although disabled"
  grep -q validation_psnr "$tmp/mem/metrics.jsonl" && ok "validation otherwise (PSNR in metrics.jsonl)" ||
    bad "no validation by default"
else
  bad "noval run: $(tail -2 "$tmp/noval.err")"
fi

# keys of the MMDiT only: one warning naming them
if train other --flow_shift=2 --validation_prompt="a red circle" --max_train_steps=1; then
  grep -q "model_type vae: 2 key(s) set in the config apply to another model type and have no effect here: .*flow_shift" \
    "$tmp/other.err" && [ "$(grep -c "apply to another model type" "$tmp/other.err")" = 1 ] &&
    ok "MMDiT-only keys draw one warning naming them" || bad "no warning: $(grep -m2 WARN "$tmp/other.err")"
else
  bad "run with MMDiT keys failed: $(tail -2 "$tmp/other.err")"
fi

# refused by name: exit code and the reason
refuse() { # what, expected text, flags
  local what=$1 want=$2
  shift 2
  out=$("$CT" train --config "$tmp/base.json" --output_dir="$tmp/r" "$@" 2>&1)
  local rc=$?
  [ $rc != 0 ] && echo "$out" | grep -q -- "$want" && ok "$what refused: $(echo "$out" | grep -m1 -o -- "$want")" ||
    bad "$what: exit $rc: $(echo "$out" | tail -2)"
}
refuse "zero_stage 2" "model_type vae: zero_stage 2 shards" --zero_stage=2
refuse "zero_stage 3" "model_type vae: zero_stage 3 shards" --zero_stage=3
refuse "mixed_precision bf16" "model_type vae: mixed_precision bf16" --mixed_precision=bf16
refuse "offload_param nvme" "offload_param" --zero_stage=3 --offload_param=nvme --offload_param_path="$tmp/swap"
refuse "onebitadam" "model_type vae does not support it" --optimizer=onebitadam --freeze_step=2
# the data loader gives RGB: a VAE of other channel counts is refused, not misread
sed 's/"latent_channels": 4/"latent_channels": 4, "in_channels": 4/' "$tmp/vae.json" > "$tmp/vae4.json"
refuse "in_channels 4" "in_channels 4, out_channels 3: training reads RGB images" --vae_config="$tmp/vae4.json"
exit $fail
