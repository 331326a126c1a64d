#!/usr/bin/env bash
# Gradient checkpointing end to end (docs/model.md): short training runs with
# gradient_checkpointing on (every block, and every 2nd) must give the same
# losses, grad norms and checkpoint weights as the same run without it, bit for
# bit — on one rank, under 2-rank ZeRO-3 (the recompute inside the hook that
# gathers a block's weights) and 2-rank ZeRO-2 bf16; the interval alone warns
# once; the VAE task warns that the keys do not apply.
# Usage: tests/cli_gradckpt.sh path/to/ctuner
. "$(dirname "$0")/lib/common.sh"
MPIRUN=(mpirun --oversubscribe --allow-run-as-root)
export ASAN_OPTIONS=${ASAN_OPTIONS:-}:detect_leaks=0
command -v mpirun >/dev/null || { echo "FAIL - mpirun not found: run scripts/deps.sh"; exit 1; }
. "$(dirname "$0")/lib/shapes.sh"
shapes_fixture 16
cat > "$tmp/base.json" <<JSON
{"--data_backend_config": "$tmp/backend.json", "--resolution": 16, "--aspect_bucket_alignment": 8,
 "--learning_rate": 1e-3, "--disable_validation": true, "--seed": 7, "--max_train_steps": 4,
 "--checkpoint_step_interval": 2, "--max_grad_norm": 1.0, "--disable_progress_bar": true,
 "--preset": "small", "--optimizer": "adamw", "--use_ema": false}
JSON

# losses and grad norms of metrics.jsonl, and a digest of every checkpoint's tensors
summary() {
  /usr/bin/python3 - "$1" <<'PY'
import hashlib, json, os, struct, sys
root, h = sys.argv[1], hashlib.sha256()
for d, _, fs in sorted(os.walk(root)):
    for f in sorted(fs):
        if not f.endswith(".safetensors"): continue
        b = open(os.path.join(d, f), "rb").read()
        n = struct.unpack("<Q", b[:8])[0]
        hd = json.loads(b[8:8 + n])
        h.update(os.path.relpath(os.path.join(d, f), root).encode())
        for k in sorted(x for x in hd if x != "__metadata__"):
            s, e = hd[k]["data_offsets"]
            h.update(k.encode()); h.update(b[8 + n + s:8 + n + e])
L = [x for x in map(json.loads, open(os.path.join(root, "metrics.jsonl"))) if "loss" in x]
print(h.hexdigest()[:16], len(L), " ".join(repr(x["loss"]) + "/" + repr(x["grad_norm"]) for x in L))
PY
}

# name | ranks | flags
train() {
  local name=$1 ranks=$2
  shift 2
  if [ "$ranks" = 1 ]; then
    OMP_NUM_THREADS=2 "$CT" train --config "$tmp/base.json" "$@" --output_dir="$tmp/$name" \
      >/dev/null 2>"$tmp/$name.err"
  else
    "${MPIRUN[@]}" -np "$ranks" -x OMP_NUM_THREADS=1 "$CT" train --config "$tmp/base.json" "$@" \
      --output_dir="$tmp/$name" >/dev/null 2>"$tmp/$name.err"
  fi || { bad "$name: training failed: $(tail -3 "$tmp/$name.err")"; return 1; }
}

same() { # name-off name-on what
  local a b
  a=$(summary "$tmp/$1") b=$(summary "$tmp/$2")
  if [ -n "$a" ] && [ "$a" = "$b" ] && [ "$(echo "$a" | cut -d' ' -f2)" = 4 ]; then
    ok "$3: losses, grad norms and checkpoint weights identical ($(echo "$a" | cut -d' ' -f1))"
  else
    bad "$3 differ"
    echo "  off: $a" | cut -c1-300
    echo "  on:  $b" | cut -c1-300
  fi
}

GC=(--gradient_checkpointing=true)
if train off 1 --train_batch_size=2 && train on 1 --train_batch_size=2 "${GC[@]}" &&
  train on2 1 --train_batch_size=2 "${GC[@]}" --gradient_checkpointing_interval=2; then
  same off on "1 rank, every block"
  same off on2 "1 rank, interval 2"
  grep -q "gradient checkpointing every 1 block(s): 2 of 2 double and 4 of 4 single" "$tmp/on.err" &&
    grep -q "every 2 block(s): 0 of 2 double and 2 of 4 single" "$tmp/on2.err" &&
    ok "the start log says which blocks are recomputed" || bad "no checkpointing line: $(grep -i checkp "$tmp/on2.err")"
fi
if train z3off 2 --train_batch_size=1 --zero_stage=3 &&
  train z3on 2 --train_batch_size=1 --zero_stage=3 "${GC[@]}"; then
  same z3off z3on "2 ranks ZeRO-3"
fi
if train z2off 2 --train_batch_size=1 --zero_stage=2 --mixed_precision=bf16 &&
  train z2on 2 --train_batch_size=1 --zero_stage=2 --mixed_precision=bf16 "${GC[@]}" \
    --gradient_checkpointing_interval=2; then
  same z2off z2on "2 ranks ZeRO-2 bf16, interval 2"
fi

# the same numbers, so the same config digest: a run resumes across the setting without
# the "different configuration" warning
dg() { grep -o '"config_digest": "[0-9a-f]*"' "$tmp/$1/checkpoint-2/training_state.json"; }
if [ -f "$tmp/off/checkpoint-2/training_state.json" ] && [ "$(dg off)" = "$(dg on2)" ]; then
  ok "the config digest leaves gradient_checkpointing out ($(dg off | cut -d'"' -f4))"
  mkdir -p "$tmp/res" && cp -r "$tmp/off/checkpoint-2" "$tmp/res/"
  if train res 1 --train_batch_size=2 "${GC[@]}"; then
    ! grep -q "different configuration" "$tmp/res.err" &&
      [ "$(summary "$tmp/res" | cut -d' ' -f1)" = "$(summary "$tmp/off" | cut -d' ' -f1)" ] &&
      ok "resumed with it from a checkpoint without it: no warning, the same final weights" ||
      bad "resume across the setting: $(grep -i "different\|warn" "$tmp/res.err" | head -2)"
  fi
else
  bad "config digests differ: $(dg off) vs $(dg on2)"
fi

# the interval without gradient_checkpointing: one warning, nothing recomputed
if train ivonly 1 --train_batch_size=2 --gradient_checkpointing_interval=2 --max_train_steps=1; then
  n=$(grep -c "gradient_checkpointing_interval 2 has no effect: gradient_checkpointing is off" "$tmp/ivonly.err")
  [ "$n" = 1 ] && ! grep -q "blocks recomputed" "$tmp/ivonly.err" && ok "the interval alone warns once" ||
    bad "interval alone: $n warnings: $(grep -i checkp "$tmp/ivonly.err")"
fi
# the VAE task: the keys apply to the MMDiT only, one warning naming them
if OMP_NUM_THREADS=2 "$CT" train --config "$tmp/base.json" --model_type=vae --vae_config="$tmp/vae.json" \
  --preset=tiny --train_batch_size=2 --max_train_steps=1 "${GC[@]}" --output_dir="$tmp/vae" \
  >/dev/null 2>"$tmp/vae.err"; then
  grep "apply to another model type" "$tmp/vae.err" | grep -q "gradient_checkpointing" &&
    ok "model_type vae: gradient_checkpointing warned as not applying" ||
    bad "vae: no warning: $(grep -i warn "$tmp/vae.err" | head -3)"
else
  bad "vae with gradient_checkpointing failed: $(tail -3 "$tmp/vae.err")"
fi
# refused like any int key when negative
if "$CT" train --config "$tmp/base.json" --gradient_checkpointing_interval=-1 --output_dir="$tmp/neg" \
  >/dev/null 2>"$tmp/neg.err"; then
  bad "a negative interval was accepted"
else
  grep -q "gradient_checkpointing_interval" "$tmp/neg.err" && ok "a negative interval is refused by name" ||
    bad "negative interval: $(tail -2 "$tmp/neg.err")"
fi
exit $fail
