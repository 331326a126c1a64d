#!/usr/bin/env bash
# End-to-end tests of `ctuner train` and `ctuner sample` on a small synthetic
# dataset with the tiny preset: config errors, accumulation equivalence,
# bit-exact resume after kill -9 during a checkpoint write, rotation, NaN
# skipping, validation images, sampling. Usage: tests/cli_train.sh path/to/ctuner
. "$(dirname "$0")/lib/common.sh"
export OMP_NUM_THREADS=2

"$CT" dataset synth --out "$tmp/data" --count 24 --seed 3 >/dev/null || { echo "FAIL - dataset synth"; exit 1; }
cat > "$tmp/backend.json" <<JSON
[{"id": "shapes", "type": "local", "instance_data_dir": "$tmp/data", "caption_strategy": "textfile", "crop": false}]
JSON
# A tiny, fast base config; every test overrides what it needs.
cat > "$tmp/base.json" <<JSON
{"--preset": "tiny", "--resolution": 8, "--aspect_bucket_alignment": 8, "--data_backend_config": "$tmp/backend.json",
 "--train_batch_size": 4, "--learning_rate": 1e-3, "--validation_num_inference_steps": 2,
 "--disable_validation": true, "--seed": 7}
JSON
run() { "$CT" train --config "$tmp/base.json" "$@"; }

# ---- config errors: non-zero exit and a message naming the problem ----
expect_err() { # name, pattern, args...
  local name=$1 pat=$2; shift 2
  if out=$("$@" 2>&1); then bad "$name: exit 0"; return; fi
  echo "$out" | grep -q -- "$pat" && ok "$name" || bad "$name: message '$out' lacks '$pat'"
}
echo '{"--learning_rat": 1e-4}' > "$tmp/c1.json"
expect_err "unknown key" "did you mean 'learning_rate'" "$CT" train --config "$tmp/c1.json"
echo '{"train_batch_size": "four"}' > "$tmp/c2.json"
expect_err "wrong type" "train_batch_size' expects an integer" "$CT" train --config "$tmp/c2.json"
printf '{\n  "seed": 1,\n  "output_dir": "x",,\n}\n' > "$tmp/c3.json"
expect_err "bad JSON" "c3.json:3:" "$CT" train --config "$tmp/c3.json"
echo '{"use_ema": 3}' > "$tmp/c4.json"
expect_err "bool type" "use_ema' expects a boolean" "$CT" train --config "$tmp/c4.json"
echo '[{"id": "x", "type": "local", "instance_data_dir": "/nonexistent/dir"}]' > "$tmp/b2.json"
expect_err "missing data dir" "/nonexistent/dir" run --data_backend_config="$tmp/b2.json" --output_dir="$tmp/e"
expect_err "unknown optimizer" "unknown optimizer 'adamq'" run --optimizer=adamq --output_dir="$tmp/e"
expect_err "unknown key on the command line" "did you mean 'max_train_steps'" run --max_train_step=3
expect_err "env var unset" "CT_TEST_UNSET_VAR" run --output_dir='{env:CT_TEST_UNSET_VAR}/x'
expect_err "muon momentum range" "muon_momentum must be in" run --optimizer=muon --muon_momentum=1.5

# ---- every key the binary knows has a row in docs/config.md (the user's reference) ----
cfgdoc="$(cd "$(dirname "$0")/.." && pwd)/docs/config.md"
keys=$("$CT" train --help-keys) || bad "train --help-keys: exit $?"
keys=$(printf '%s\n' "$keys" | awk '{print $1}')
nkeys=$(printf '%s\n' "$keys" | grep -c .)
# an empty list would pass the loop below: the binary knows over 150 keys
[ "$nkeys" -ge 100 ] || bad "train --help-keys lists $nkeys keys (expected over 100)"
missing=$(printf '%s\n' "$keys" | while read -r k; do
  [ -n "$k" ] && { grep -q "^| \`$k\`" "$cfgdoc" || echo "$k"; }; done)
[ -z "$missing" ] && [ "$nkeys" -ge 100 ] && ok "docs/config.md lists every key ($nkeys)" || bad "docs/config.md lacks: $missing"
expect_err "batch larger than dataset" "cannot fill the effective batch size" run --train_batch_size=100 --output_dir="$tmp/e"
CT_TEST_OUT="$tmp/envout" run --output_dir='{env:CT_TEST_OUT}' --max_train_steps=1 >/dev/null 2>&1 \
  && [ -d "$tmp/envout/checkpoint-1" ] && ok "{env:VAR} substitution" || bad "{env:VAR} substitution"
# keys with no effect here draw one warning each run, naming them (task_mmdit.c)
run --output_dir="$tmp/warn" --max_train_steps=1 --snr_gamma=5 --noise_offset=0.05 \
  --flux_guidance_value=2 >/dev/null 2>"$tmp/warn.log" || bad "warning run: $(tail -3 "$tmp/warn.log")"
n1=$(grep -c "snr_gamma, noise_offset: no effect on FLUX.1" "$tmp/warn.log")
n2=$(grep -c "flux_guidance_value: no effect without a FLUX.1 pipeline" "$tmp/warn.log")
[ "$n1" = 1 ] && [ "$n2" = 1 ] && ok "DDPM keys and FLUX.1 pipeline keys warned once each, by name" \
  || bad "warnings ($n1, $n2): $(grep -i warn "$tmp/warn.log")"

# ---- accumulation: batch 8 x 1 == batch 4 x 2 (SGD, lr 1000: w0 - w1 = 1000 g) ----
acc() { run --output_dir="$tmp/$1" --train_batch_size=$2 --gradient_accumulation_steps=$3 \
  --max_train_steps=1 --optimizer=sgd --optimizer_momentum=0 --adam_weight_decay=0 \
  --learning_rate=1000 --max_grad_norm=0 --caption_dropout_probability=0.5 >/dev/null 2>"$tmp/$1.log"; }
acc acc1 8 1 && acc acc2 4 2 || bad "accumulation runs: $(cat "$tmp/acc1.log" "$tmp/acc2.log")"
run --output_dir="$tmp/init" --max_train_steps=1 --learning_rate=0 --optimizer=sgd --optimizer_momentum=0 \
  --adam_weight_decay=0 >/dev/null 2>&1
if /usr/bin/python3 - "$tmp" <<'PY'
import json, struct, sys
import numpy as np
d = sys.argv[1]
def load(p):
    b = open(p, "rb").read(); n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8+n]); out = {}
    for k, v in h.items():
        if k == "__metadata__": continue
        s, e = v["data_offsets"]; out[k] = np.frombuffer(b[8+n+s:8+n+e], dtype=np.float32)
    return out
w0 = load(d + "/init/checkpoint-1/model.safetensors")
a = load(d + "/acc1/checkpoint-1/model.safetensors"); b = load(d + "/acc2/checkpoint-1/model.safetensors")
ga = np.concatenate([(w0[k].astype(np.float64) - a[k]) / 1000 for k in sorted(w0)])
gb = np.concatenate([(w0[k].astype(np.float64) - b[k]) / 1000 for k in sorted(w0)])
rel = np.abs(ga - gb).max() / np.abs(ga).max()
la = json.loads(open(d + "/acc1/metrics.jsonl").readline())["loss"]; lb = json.loads(open(d + "/acc2/metrics.jsonl").readline())["loss"]
print("grad rel err %.3g, loss %r vs %r, |g|max %.3g" % (rel, la, lb, np.abs(ga).max()))
sys.exit(0 if rel <= 1e-6 and abs(la - lb) <= 1e-6 * abs(la) and np.abs(ga).max() > 0 else 1)
PY
then ok "accumulation 8x1 == 4x2"; else bad "accumulation 8x1 != 4x2"; fi

# ---- grad_clip_method: value clamps each element (SimpleTuner's default), norm scales the whole ----
# SGD, lr 1: w0 - w1 is the clipped gradient; acc1 (same batch 8, lr 1000, no clipping) gives g
for m in value norm; do
  run --output_dir="$tmp/clip-$m" --train_batch_size=8 --max_train_steps=1 --optimizer=sgd --optimizer_momentum=0 \
    --adam_weight_decay=0 --learning_rate=1 --max_grad_norm=0.001 --grad_clip_method=$m \
    --caption_dropout_probability=0.5 >/dev/null 2>"$tmp/clip-$m.log" || bad "clip $m: $(tail -2 "$tmp/clip-$m.log")"
done
if /usr/bin/python3 - "$tmp" <<'PY'
import json, struct, sys
import numpy as np
d = sys.argv[1]
def load(p):
    b = open(p, "rb").read(); n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8+n]); out = {}
    for k, v in h.items():
        if k == "__metadata__": continue
        s, e = v["data_offsets"]; out[k] = np.frombuffer(b[8+n+s:8+n+e], dtype=np.float32)
    return out
w0 = load(d + "/init/checkpoint-1/model.safetensors")
g = np.concatenate([(w0[k].astype(np.float64) - load(d + "/acc1/checkpoint-1/model.safetensors")[k]) / 1000 for k in sorted(w0)])
gv = np.concatenate([w0[k].astype(np.float64) - load(d + "/clip-value/checkpoint-1/model.safetensors")[k] for k in sorted(w0)])
gn = np.concatenate([w0[k].astype(np.float64) - load(d + "/clip-norm/checkpoint-1/model.safetensors")[k] for k in sorted(w0)])
# value: clip(g, -c, c) elementwise; norm: g * c / (|g| + 1e-6)
ev = np.abs(gv - np.clip(g, -1e-3, 1e-3)).max() / 1e-3
en = np.abs(gn - g * 1e-3 / (np.linalg.norm(g) + 1e-6)).max() / np.abs(gn).max()
print("value clip err %.3g (%d of %d clamped), norm clip err %.3g, |g| %.3g" % (ev, (np.abs(g) > 1e-3).sum(), g.size, en, np.linalg.norm(g)))
sys.exit(0 if ev < 1e-3 and en < 1e-3 and (np.abs(g) > 1e-3).sum() > 0 and np.linalg.norm(g) > 1e-3 else 1)
PY
then ok "grad_clip_method value clamps elements, norm scales to the norm (SGD, lr 1)"; else bad "grad_clip_method"; fi

# ---- SimpleTuner's validation keys: the negative prompt drives the CFG pass; the rest warn or refuse ----
vrun() { rm -rf "$tmp/$1"; run --output_dir="$tmp/$1" --max_train_steps=3 --learning_rate=1e-2 --disable_validation=false --validation_prompt="a red circle" \
  --validation_guidance=4 "${@:2}" >/dev/null 2>"$tmp/$1.log"; }
vrun vneg0 && vrun vneg1 --validation_negative_prompt="a blue square" &&
  vrun vneg2 --validation_negative_prompt="" --evaluation_type=clip --validation_guidance_rescale=0.7 \
    --validation_disable_unconditional=false --validation_prompt_library=false --controlnet=false; rc=$?
img() { ls "$tmp/$1/validation_images/"*validation*.png | head -1; }
[ $rc -eq 0 ] && ! cmp -s "$(img vneg0)" "$(img vneg1)" && cmp -s "$(img vneg0)" "$(img vneg2)" &&
  [ "$(grep -c "evaluation_type clip has no effect\|validation_guidance_rescale 0.7 has no effect\|validation_disable_unconditional false" "$tmp/vneg2.log")" -eq 3 ] &&
  ok "validation_negative_prompt is the CFG pass's prompt; evaluation_type clip, guidance rescale, disable_unconditional false warn once each" ||
  bad "validation keys: rc=$rc $(img vneg0) $(img vneg1) $(img vneg2) $(cmp "$(img vneg0)" "$(img vneg1)"; cmp "$(img vneg0)" "$(img vneg2)") $(tail -3 "$tmp/vneg2.log")"
expect_err "controlnet true refused" "ControlNet training is not implemented" run --controlnet=true --output_dir="$tmp/e"
expect_err "validation_prompt_library true refused" "user_prompt_library" run --validation_prompt_library=true --output_dir="$tmp/e"

# ---- bit-exact resume after kill -9 during a checkpoint write ----
common=(--max_train_steps=6 --checkpoint_step_interval=3 --use_ema=true --lr_scheduler=cosine
        --lr_warmup_steps=2 --caption_dropout_probability=0.3)
run --output_dir="$tmp/full" "${common[@]}" >/dev/null 2>&1 || bad "uninterrupted run"
CTUNER_FAULT_KILL_AT_CHECKPOINT=6 run --output_dir="$tmp/cut" "${common[@]}" >/dev/null 2>&1
rc=$?
[ $rc -eq 137 ] || [ $rc -gt 128 ] && ok "killed during checkpoint-6 (rc $rc)" || bad "fault hook did not kill (rc $rc)"
[ -f "$tmp/cut/checkpoint-3/.guard" ] && ok "checkpoint-3 guarded" || bad "checkpoint-3 missing"
[ -d "$tmp/cut/checkpoint-6-tmp" ] && [ ! -e "$tmp/cut/checkpoint-6" ] && ok "broken checkpoint-6 left as -tmp only" \
  || bad "unexpected state after kill: $(ls "$tmp/cut")"
"$CT" sample --checkpoint "latest:$tmp/cut" --prompt "a red circle" --out "$tmp/s.png" --steps 2 >/dev/null 2>&1 \
  && ok "previous checkpoint usable after the kill" || bad "sampling from checkpoint-3 after the kill"
out=$(run --output_dir="$tmp/cut" "${common[@]}" 2>&1) || bad "resume: $out"
echo "$out" | grep -q '"from_step": 3' && ok "resumed from step 3" || bad "did not resume from 3: $out"
[ ! -e "$tmp/cut/checkpoint-6-tmp" ] && ok "stale -tmp removed" || bad "stale -tmp still there"
cmp -s "$tmp/full/checkpoint-6/model.safetensors" "$tmp/cut/checkpoint-6/model.safetensors" \
  && ok "resumed weights bit-identical" || bad "resumed weights differ"
cmp -s "$tmp/full/checkpoint-6/ema.safetensors" "$tmp/cut/checkpoint-6/ema.safetensors" \
  && ok "resumed EMA bit-identical" || bad "resumed EMA differs"
cmp -s "$tmp/full/checkpoint-6/optimizer.safetensors" "$tmp/cut/checkpoint-6/optimizer.safetensors" \
  && ok "resumed optimizer state bit-identical" || bad "resumed optimizer state differs"
if diff <(sed 's/"seconds".*//' "$tmp/full/metrics.jsonl") <(sed 's/"seconds".*//' "$tmp/cut/metrics.jsonl") >/dev/null; then
  ok "losses bit-identical (metrics.jsonl)"; else bad "metrics differ after resume"; fi

# ---- rotation ----
run --output_dir="$tmp/rot" --max_train_steps=5 --checkpoint_step_interval=1 --checkpoints_total_limit=2 >/dev/null 2>&1
[ "$(cd "$tmp/rot" && ls -d checkpoint-* | sort | tr '\n' ' ')" = "checkpoint-4 checkpoint-5 " ] \
  && ok "rotation keeps the newest 2" || bad "rotation left: $(ls "$tmp/rot")"

# ---- NaN/Inf: skipped and counted; too many in a row stop the run ----
out=$(CTUNER_FAULT_NAN_AT_STEP=2 run --output_dir="$tmp/nan1" --max_train_steps=4 2>&1)
echo "$out" | grep -q '"nonfinite_steps_skipped": 1' && ok "one NaN step skipped" || bad "NaN skip: $out"
out=$(CTUNER_FAULT_NAN_AT_STEP=3,4,5 run --output_dir="$tmp/nan2" --max_train_steps=8 --checkpoint_step_interval=2 \
  --max_nonfinite_steps=3 2>&1) && bad "3 NaN steps in a row did not stop the run" || {
  echo "$out" | grep -q "3 consecutive steps" && ok "stops after max_nonfinite_steps" || bad "NaN stop message: $out"; }
[ -f "$tmp/nan2/checkpoint-2/.guard" ] && [ ! -e "$tmp/nan2/checkpoint-4" ] && ok "last checkpoint predates the NaNs" \
  || bad "checkpoints after NaN stop: $(ls "$tmp/nan2")"

# ---- validation images, grid, metrics, sampling ----
run --output_dir="$tmp/val" --max_train_steps=4 --validation_step_interval=2 --disable_validation=false \
  --validation_prompt="a small red circle at the center on a white background" --num_validation_images=2 \
  --use_ema=true >/dev/null 2>&1 || bad "validation run"
for f in step_2_validation_0_8x8.png step_2_validation_1_8x8.png step_4_validation-ema_0_8x8.png step_2_grid.png step_4_grid.png; do
  [ -s "$tmp/val/validation_images/$f" ] || bad "missing validation image $f"
done
[ -s "$tmp/val/validation_images/step_2_validation_0_8x8.txt" ] && ok "validation images + grid + sidecars" || bad "no sidecar"
[ "$(wc -l < "$tmp/val/metrics.jsonl")" -eq 4 ] && ok "metrics.jsonl has 4 lines" || bad "metrics lines"
python3 -c "import json,sys; [json.loads(l) for l in open('$tmp/val/metrics.jsonl')]" && ok "metrics are JSON" || bad "metrics JSON"
"$CT" sample --checkpoint "$tmp/val/checkpoint-4" --prompt "a blue square" --out "$tmp/one.png" --steps 3 --ema >/dev/null \
  && [ -s "$tmp/one.png" ] && ok "sample --ema" || bad "sample --ema"
printf 'a red circle\na green square\n' > "$tmp/prompts.txt"
"$CT" sample --checkpoint "$tmp/val/checkpoint-4" --prompts-file "$tmp/prompts.txt" --out-dir "$tmp/many" --per-prompt 2 --steps 2 >/dev/null \
  && [ -s "$tmp/many/0003.png" ] && grep -q "green square" "$tmp/many/0003.txt" && ok "sample --prompts-file" || bad "sample --prompts-file"
expect_err "sample without checkpoint" "need --checkpoint" "$CT" sample --prompt x --out y.png

# ---- clip-bpe: tokenizer files copied into the checkpoint, which then stands alone ----
cp -r "$(dirname "$0")/../examples/demo/tokenizer" "$tmp/tok"
bpe=(--text_encoder=clip-bpe --tokenizer_vocab="$tmp/tok/vocab.json" --tokenizer_merges="$tmp/tok/merges.txt")
expect_err "clip-bpe without files" "needs tokenizer_vocab" run --text_encoder=clip-bpe --output_dir="$tmp/e"
expect_err "clip-bpe with a missing vocab" "$tmp/tok/nope.json" run "${bpe[@]}" --tokenizer_vocab="$tmp/tok/nope.json" --output_dir="$tmp/e"
run "${bpe[@]}" --output_dir="$tmp/bpe" --max_train_steps=2 --tokenizer_max_length=8 >/dev/null 2>"$tmp/bpe.log"
grep -q "captions are longer than tokenizer_max_length 8 allows (6 BPE tokens)" "$tmp/bpe.log" \
  && ok "clip-bpe trains; truncation warning counts BPE tokens" || bad "clip-bpe run: $(cat "$tmp/bpe.log")"
cmp -s "$tmp/bpe/checkpoint-2/tokenizer_vocab.json" "$tmp/tok/vocab.json" && cmp -s "$tmp/bpe/checkpoint-2/tokenizer_merges.txt" "$tmp/tok/merges.txt" \
  && ok "checkpoint carries the tokenizer" || bad "tokenizer files missing from the checkpoint"
rm -rf "$tmp/tok"
"$CT" sample --checkpoint "$tmp/bpe/checkpoint-2" --prompt "a small red circle at the top left on a white background" \
  --out "$tmp/bpe.png" --steps 2 >/dev/null 2>"$tmp/bpe_s.log" && [ -s "$tmp/bpe.png" ] \
  && ok "sample from a clip-bpe checkpoint without the original tokenizer files" || bad "bpe sample: $(cat "$tmp/bpe_s.log")"

exit $fail
