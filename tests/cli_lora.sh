#!/usr/bin/env bash
# model_type lora end to end (docs/lora.md): a few steps of the tiny preset
# with flux_lora_target all+ffs; pytorch_lora_weights.safetensors in every
# checkpoint and in output_dir; the base (model.safetensors) not saved; 2
# ranks under ZeRO-2 and ZeRO-3 equal 1 rank with the same global batch; a
# resume gives the uninterrupted run's numbers bit for bit, also across world
# size and stage; init_lora starts from a file; the errors name the problem.
# Usage: tests/cli_lora.sh path/to/ctuner
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
 "--model_type": "lora",
 "--lora_rank": 4, "--lora_alpha": 8, "--lora_dropout": 0, "--flux_lora_target": "all+ffs",
 "--lora_init_type": "gaussian", "--validation_prompt": "a red circle",
 "--validation_step_interval": 4, "--validation_num_inference_steps": 2}
JSON

. "$(dirname "$0")/lib/adapters.sh"
adapter_base

if train one 1 --train_batch_size=2; then
  ls "$tmp/one"/checkpoint-*/pytorch_lora_weights.safetensors >/dev/null 2>&1 &&
    [ "$(ls "$tmp/one"/checkpoint-*/pytorch_lora_weights.safetensors | wc -l)" = 2 ] &&
    cmp -s "$tmp/one/checkpoint-4/pytorch_lora_weights.safetensors" \
      "$tmp/one/pytorch_lora_weights.safetensors" &&
    ! ls "$tmp/one"/checkpoint-*/model.safetensors >/dev/null 2>&1 &&
    ok "pytorch_lora_weights.safetensors in every checkpoint and in output_dir; no base model saved" ||
    bad "adapter files: $(ls "$tmp/one" "$tmp/one/checkpoint-4")"
  grep -q "LoRA all+ffs: .* adapters, rank 4, alpha 8 (scale 2)" "$tmp/one.err" &&
    ok "the start log names the adapters" || bad "no LoRA line: $(grep -i lora "$tmp/one.err" | head -2)"
  /usr/bin/python3 - "$tmp/one" <<'PY' && ok "losses finite; every adapter's B moved from zero" || bad "training did not learn"
import json, struct, sys
L = [x["loss"] for x in map(json.loads, open(sys.argv[1] + "/metrics.jsonl")) if "loss" in x]
b = open(sys.argv[1] + "/pytorch_lora_weights.safetensors", "rb").read()
n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n])
meta = json.loads(h["__metadata__"]["lora_adapter_metadata"])
B = [k for k in h if k.endswith("lora_B.weight")]
nz = all(any(b[8 + n + h[k]["data_offsets"][0]:8 + n + h[k]["data_offsets"][1]]) for k in B)
sys.exit(not (len(L) == 4 and all(x == x for x in L) and nz and meta["transformer.r"] == 4
              and meta["transformer.lora_alpha"] == 8))
PY
fi
# losses, grad norms and final adapters within 1e-5 relative, as cli_dist.sh (the GEMM
# of batch 2 vs two of batch 1 agree to rounding only; adam_epsilon 1e-4 keeps Adam from
# turning the rounding of B's near-zero first gradients into +-lr steps: measured
# 3.3e-7, 1.8e-5 with the default 1e-8) (the GEMM of batch 2
# vs two of batch 1 agree to rounding only, as for full training: cli_dist.sh)
# 2 ranks (batch 1 each) = 1 rank (batch 2), ZeRO-2 and ZeRO-3 over the adapters
train z2 2 --train_batch_size=1 --zero_stage=2 && near z2 one "2 ranks ZeRO-2 = 1 rank"
train z3 2 --train_batch_size=1 --zero_stage=3 && same z2 z3 "2 ranks ZeRO-3 = 2 ranks ZeRO-2"
# ZeRO-3 shards the frozen base too (by bytes, gathered per block): half of it per rank
/usr/bin/python3 - "$tmp/z3.err" <<'PY' && ok "ZeRO-3: the frozen base sharded ($(grep -o '[0-9]* of [0-9]* bytes per rank' "$tmp/z3.err"))" || bad "ZeRO-3 base not sharded: $(grep -i 'frozen\|ZeRO' "$tmp/z3.err" | head -3)"
import re, sys
m = re.search(r"frozen base sharded by bytes: (\d+) of (\d+) bytes per rank", open(sys.argv[1]).read())
sys.exit(not (m and 2 * int(m.group(1)) - int(m.group(2)) in range(0, 129)))
PY
# offload_param nvme at ZeRO-3: the adapters' weights and the base's byte range each in a swap file,
# read piece by piece before each gather: the same numbers
train zo 2 --train_batch_size=1 --zero_stage=3 --offload_param=nvme --offload_optimizer=nvme \
  --offload_param_path="$tmp/swap" &&
  grep -q "the frozen base's [0-9]* bytes per rank in" "$tmp/zo.err" && same z3 zo "ZeRO-3 with the base offloaded (offload_param nvme) = ZeRO-3" &&
  cmp -s "$tmp/z3/validation_images/step_4_validation_0_16x16.png" "$tmp/zo/validation_images/step_4_validation_0_16x16.png" &&
  ok "... and its validation image (the base read back from the swap file)" || bad "offloaded base: validation image"
# dropout masks keyed by sample id: 2 ranks draw what 1 rank draws
train d1 1 --train_batch_size=2 --lora_dropout=0.3 --disable_validation=true &&
  train d2 2 --train_batch_size=1 --lora_dropout=0.3 --zero_stage=2 --disable_validation=true &&
  near d2 d1 "lora_dropout 0.3: 2 ranks ZeRO-2 = 1 rank" &&
  [ "$(summary "$tmp/d1" | cut -d' ' -f3)" != "$(summary "$tmp/one" | cut -d' ' -f3)" ] &&
  ok "dropout changes the run" || bad "dropout had no effect"
# validation samples with the adapters, live and EMA (the EMA covers the adapters only)
v=validation_images/step_4_validation
[ -s "$tmp/one/$v-ema_0_16x16.png" ] && [ -s "$tmp/z3/${v}_0_16x16.png" ] &&
  cmp -s "$tmp/z2/${v}_0_16x16.png" "$tmp/z3/${v}_0_16x16.png" &&
  cmp -s "$tmp/z2/$v-ema_0_16x16.png" "$tmp/z3/$v-ema_0_16x16.png" &&
  ! cmp -s "$tmp/one/${v}_0_16x16.png" "$tmp/one/$v-ema_0_16x16.png" &&
  ok "validation images (live and EMA) with the adapters; ZeRO-3's equal ZeRO-2's" ||
  bad "validation images: $(ls "$tmp/one/validation_images" "$tmp/z3/validation_images" 2>&1 | tr '\n' ' ')"
# gradient checkpointing recomputes the adapters too: the same numbers
train gc 1 --train_batch_size=2 --gradient_checkpointing=true && same one gc "gradient checkpointing"
# resume from checkpoint-2: the last steps as the uninterrupted run, bit for bit
mkdir -p "$tmp/res1" && cp -r "$tmp/one/checkpoint-2" "$tmp/res1/" &&
  train res1 1 --train_batch_size=2 --resume_from_checkpoint=latest &&
  same one res1 "resume at step 2 on 1 rank" checkpoint-4
mkdir -p "$tmp/res2" && cp -r "$tmp/z2/checkpoint-2" "$tmp/res2/" &&
  train res2 2 --train_batch_size=1 --zero_stage=3 --resume_from_checkpoint=latest &&
  same z3 res2 "ZeRO-2 checkpoint resumed under ZeRO-3 on 2 ranks" checkpoint-4
# a 2-rank ZeRO-3 checkpoint resumed on 1 rank (stage 0): the 1-rank run's numbers (within 1e-5)
wnear() { # a b what: the final adapter files within 1e-5 relative
  /usr/bin/python3 - "$tmp/$1" "$tmp/$2" <<'PY' && ok "$3 (within 1e-5)" || bad "$3"
import json, struct, sys
def w(r):
    b = open(r + "/pytorch_lora_weights.safetensors", "rb").read()
    n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n]); h.pop("__metadata__")
    return {k: struct.unpack("<%df" % ((v["data_offsets"][1] - v["data_offsets"][0]) // 4),
                             b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]]) for k, v in h.items()}
import math
a, b = w(sys.argv[1]), w(sys.argv[2])
if not (a and set(a) == set(b) and all(len(a[k]) == len(b[k]) for k in a)):
    sys.exit("  the adapter files hold other tensors (or none)")
if not all(math.isfinite(v) for t in list(a.values()) + list(b.values()) for v in t):
    sys.exit("  a NaN or Inf in the adapters")  # max() below would drop it
e = max(max(abs(x - y) for x, y in zip(a[k], b[k])) / (max(abs(v) for v in a[k]) or 1) for k in a)
print(f"  max relative difference {e:.2e}")
sys.exit(not e < 1e-5)
PY
}
mkdir -p "$tmp/res3" && cp -r "$tmp/z3/checkpoint-2" "$tmp/res3/" &&
  train res3 1 --train_batch_size=2 --resume_from_checkpoint=latest &&
  wnear one res3 "ZeRO-3 2-rank checkpoint resumed on 1 rank"
# the same 2-rank ZeRO-3 checkpoint on 1 rank at ZeRO-3 (one shard: the whole base
# through the hooks) continues exactly as on 1 rank at stage 0
mkdir -p "$tmp/res4" && cp -r "$tmp/z3/checkpoint-2" "$tmp/res4/" &&
  train res4 1 --train_batch_size=2 --zero_stage=3 --resume_from_checkpoint=latest &&
  same res3 res4 "2-rank ZeRO-3 checkpoint: 1 rank ZeRO-3 = 1 rank stage 0" checkpoint-4
# a 1-rank stage-0 checkpoint on 2 ranks: ZeRO-3 (sharded base) = ZeRO-2 (whole base), bit
# for bit, and within 1e-5 of the uninterrupted 2-rank run
for s in 2 3; do
  mkdir -p "$tmp/up$s" && cp -r "$tmp/one/checkpoint-2" "$tmp/up$s/" &&
    train up$s 2 --train_batch_size=1 --zero_stage=$s --resume_from_checkpoint=latest --disable_validation=true
done
same up2 up3 "1-rank stage-0 checkpoint on 2 ranks: ZeRO-3 = ZeRO-2" checkpoint-4
wnear z3 up3 "1-rank stage-0 checkpoint resumed on 2 ranks ZeRO-3 = the 2-rank run"
# init_lora: start from the finished adapter; the first loss differs from a fresh start
train init 1 --train_batch_size=2 --max_train_steps=1 --init_lora="$tmp/one/pytorch_lora_weights.safetensors" &&
  [ "$(summary "$tmp/init" | cut -d' ' -f3)" != "$(summary "$tmp/one" | cut -d' ' -f3)" ] &&
  ok "init_lora starts from the file" || bad "init_lora"

# errors name the problem
err "rank too large" "lora_rank 65 does not fit module" --lora_rank=65
err "target missing" "match no module" --flux_lora_target=tiny
err "unknown preset" "flux_lora_target" --flux_lora_target=everything
err "adapter of another model" "not an adapter for this model" --flux_lora_target=context \
  --init_lora="$tmp/one/pytorch_lora_weights.safetensors"
err "dora with dropout" "use_dora with lora_dropout 0.1 is not implemented" --use_dora=true --lora_dropout=0.1
err "lycoris without its config" "lora_type lycoris needs lycoris_config" --lora_type=lycoris
err "fp8 base" "base_model_precision fp8-quanto is not implemented" --base_model_precision=fp8-quanto
exit $fail
