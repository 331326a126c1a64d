#!/usr/bin/env bash
# lora_type lycoris end to end (docs/lora.md): a few steps of the tiny preset
# with a LoKr (full_matrix) + LoHa (module_algo_map) lycoris_config; the
# adapter file in LyCORIS's naming (lycoris_<module>.lokr_w1, .alpha, the
# config as lycoris_config metadata) in every checkpoint and in output_dir;
# validation images with the adapters (live and EMA); the adapters learn;
# 2 ranks under ZeRO-2 equal 1 rank; ZeRO-3 equals ZeRO-2; gradient
# checkpointing bit for bit; bf16 storage runs; a resume gives the
# uninterrupted run's numbers bit for bit; init_lora starts from a LyCORIS
# file; ctuner sample of the run (= --lora of its file on the base); the
# errors name the key.
# Usage: tests/cli_lycoris.sh path/to/ctuner
. "$(dirname "$0")/lib/common.sh"
MPIRUN=(mpirun --oversubscribe --allow-run-as-root)
export ASAN_OPTIONS=${ASAN_OPTIONS:-}:detect_leaks=0
command -v mpirun >/dev/null || { echo "FAIL - mpirun not found: run scripts/deps.sh"; exit 1; }
. "$(dirname "$0")/lib/shapes.sh"
shapes_fixture 8
cat > "$tmp/lyco.json" <<'JSON'
{"algo": "lokr", "multiplier": 1, "linear_dim": 10000, "linear_alpha": 1, "factor": 4,
 "full_matrix": true, "bypass_mode": false,
 "apply_preset": {"target_module": ["FluxAttention", "FeedForward"],
                  "module_algo_map": {"FeedForward": {"algo": "loha", "dim": 2, "alpha": 4}}}}
JSON
cat > "$tmp/base.json" <<JSON
{"--data_backend_config": "$tmp/backend.json", "--resolution": 16, "--aspect_bucket_alignment": 8,
 "--learning_rate": 1e-3, "--seed": 7, "--max_train_steps": 4,
 "--checkpoint_step_interval": 2, "--max_grad_norm": 1.0, "--disable_progress_bar": true,
 "--preset": "tiny", "--optimizer": "adamw", "--adam_epsilon": 1e-4, "--use_ema": true,
 "--model_type": "lora", "--lora_type": "lycoris", "--lycoris_config": "$tmp/lyco.json",
 "--disable_validation": true}
JSON

. "$(dirname "$0")/lib/adapters.sh"
adapter_base

if train one 1 --train_batch_size=2 --disable_validation=false --validation_prompt="a red circle" \
  --validation_step_interval=4 --validation_num_inference_steps=2; then
  v=validation_images/step_4_validation
  [ -s "$tmp/one/${v}_0_16x16.png" ] && [ -s "$tmp/one/$v-ema_0_16x16.png" ] &&
    /usr/bin/python3 - "$tmp/one/checkpoint-4" <<'PY' &&
import json, struct, sys
def tensors(p):
    b = open(p, "rb").read(); n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n])
    h.pop("__metadata__", None)
    return {k: b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]] for k, v in h.items()}
ema, live = tensors(sys.argv[1] + "/ema.safetensors"), tensors(sys.argv[1] + "/pytorch_lora_weights.safetensors")
adapters = {k for k in live if not k.endswith(".alpha")}
sys.exit(not (set(ema) == adapters and any(ema[k] != live[k] for k in ema)))
PY
    ok "validation images with the adapters, live and EMA; the EMA (ema.safetensors) covers exactly the adapter tensors" ||
    bad "validation images: $(ls "$tmp/one/validation_images" 2>&1 | tr '\n' ' ')"
  [ "$(ls "$tmp/one"/checkpoint-*/pytorch_lora_weights.safetensors | wc -l)" = 2 ] &&
    cmp -s "$tmp/one/checkpoint-4/pytorch_lora_weights.safetensors" \
      "$tmp/one/pytorch_lora_weights.safetensors" &&
    ! ls "$tmp/one"/checkpoint-*/model.safetensors >/dev/null 2>&1 &&
    ok "pytorch_lora_weights.safetensors in every checkpoint and in output_dir; no base saved" ||
    bad "adapter files: $(ls "$tmp/one" "$tmp/one/checkpoint-4")"
  grep -q "LyCORIS .*: 15 modules (LoCon 0, LoHa 4, LoKr 11)" "$tmp/one.err" &&
    ok "the start log names the modules" || bad "no LyCORIS line: $(grep -i lycoris "$tmp/one.err" | head -2)"
  /usr/bin/python3 - "$tmp/one" <<'PY' && ok "LyCORIS names, alphas and config metadata; losses finite; every zero-initialised half moved" || bad "the adapter file or training"
import json, struct, sys
L = [x["loss"] for x in map(json.loads, open(sys.argv[1] + "/metrics.jsonl")) if "loss" in x]
b = open(sys.argv[1] + "/pytorch_lora_weights.safetensors", "rb").read()
n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n])
meta = json.loads(h.pop("__metadata__")["lycoris_config"])
def val(k):
    s, e = h[k]["data_offsets"]
    return struct.unpack("<%df" % ((e - s) // 4), b[8 + n + s:8 + n + e])
w2 = [k for k in h if k.endswith(".lokr_w2") or k.endswith(".hada_w2_a")]
ok = (len(L) == 4 and all(x == x for x in L) and meta["algo"] == "lokr" and len(w2) == 15
      and "lycoris_transformer_blocks_0_attn_to_q.lokr_w1" in h
      and "lycoris_transformer_blocks_0_ff_net_0_proj.hada_w1_b" in h
      and val("lycoris_transformer_blocks_0_attn_to_q.alpha") == (10000.0,)  # full matrix: alpha = dim
      and val("lycoris_transformer_blocks_0_ff_net_2.alpha") == (4.0,)
      and h["lycoris_transformer_blocks_0_attn_to_q.alpha"]["shape"] == []
      and all(any(v != 0 for v in val(k)) for k in w2))
sys.exit(not ok)
PY
fi
train z2 2 --train_batch_size=1 --zero_stage=2 && near z2 one "2 ranks ZeRO-2 = 1 rank"
train z3 2 --train_batch_size=1 --zero_stage=3 && same z2 z3 "2 ranks ZeRO-3 = 2 ranks ZeRO-2"
train gc 1 --train_batch_size=2 --gradient_checkpointing=true && same one gc "gradient checkpointing"
train bf 1 --train_batch_size=2 --mixed_precision=bf16 --max_train_steps=2 &&
  [ -s "$tmp/bf/checkpoint-2/pytorch_lora_weights.safetensors" ] &&
  ok "mixed_precision bf16 (bf16 adapter storage) trains and saves" || bad "bf16"
mkdir -p "$tmp/res1" && cp -r "$tmp/one/checkpoint-2" "$tmp/res1/" &&
  train res1 1 --train_batch_size=2 --resume_from_checkpoint=latest &&
  same one res1 "resume at step 2 on 1 rank" checkpoint-4
train init 1 --train_batch_size=2 --max_train_steps=1 --use_ema=false \
  --init_lora="$tmp/one/pytorch_lora_weights.safetensors" &&
  [ "$(summary "$tmp/init" | cut -d' ' -f3)" != "$(summary "$tmp/one" | cut -d' ' -f3)" ] &&
  ok "init_lora starts from a LyCORIS file" || bad "init_lora"

# sampling: the run's checkpoint = its base + its LyCORIS file through --lora
# (ct_lora_merge_any); lora merge of the file moves only the Linear weights
# its modules name (FluxAttention, FeedForward); --ema refused
s=(--prompt "a red circle" --steps 2 --width 16 --height 16)
R=$tmp/one/checkpoint-4
if "$CT" sample --checkpoint "$R" "${s[@]}" --out "$tmp/s_run.png" >/dev/null 2>"$tmp/s.err" &&
  "$CT" sample --checkpoint "$tmp/full/checkpoint-3" --lora "$R/pytorch_lora_weights.safetensors" \
    "${s[@]}" --out "$tmp/s_lora.png" >/dev/null 2>>"$tmp/s.err" &&
  cmp -s "$tmp/s_run.png" "$tmp/s_lora.png"; then
  ok "sample: a LyCORIS run's checkpoint = its base + sample --lora of its file"
else
  bad "sampling a LyCORIS run: $(tail -2 "$tmp/s.err")"
fi
if "$CT" lora merge --checkpoint "$tmp/full/checkpoint-3" --lora "$R/pytorch_lora_weights.safetensors" \
  --out "$tmp/lmerged" >"$tmp/s.out" 2>"$tmp/s.err" &&
  "$CT" checkpoint export --checkpoint "$tmp/full/checkpoint-3" --format diffusers \
    --out "$tmp/lbase" >/dev/null 2>>"$tmp/s.err" &&
  /usr/bin/python3 - "$tmp/lmerged" "$tmp/lbase" <<'PY'; then
import json, struct, sys
def load(d):
    b = open(d + "/diffusion_pytorch_model.safetensors", "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n]); h.pop("__metadata__", None)
    return {k: (v["shape"], b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]]) for k, v in h.items()}
m, b = load(sys.argv[1]), load(sys.argv[2])
moved = sorted(k for k in b if m[k][1] != b[k][1])
# Linear layers inside FluxAttention / FeedForward (2-D .weight; the q/k norms are RMSNorms)
want = sorted(k for k, (s, _) in b.items() if len(s) == 2 and k.endswith(".weight")
              and (".attn." in k or ".ff." in k or ".ff_context." in k))
# (the context side's adapters barely trained here: ~1e-14, below a float32 step of W)
sys.exit(0 if set(m) == set(b) and set(moved) <= set(want) and len(moved) >= 8 else 1)
PY
  ok "lora merge of a LyCORIS file moves its modules' weights and nothing else ($(grep -o '"adapters": [0-9]*' "$tmp/s.out"))"
else
  bad "lora merge of a LyCORIS file: $(tail -2 "$tmp/s.err")"
fi
"$CT" lora merge --checkpoint "$R" --out "$tmp/lown" >/dev/null 2>"$tmp/s.err" &&
  diff -r "$tmp/lown" "$tmp/lmerged" >/dev/null &&
  ok "lora merge --checkpoint of a LyCORIS run = its base + --lora of its file (same files)" ||
  bad "lora merge of a LyCORIS run: $(tail -2 "$tmp/s.err")"
"$CT" lora export --format comfyui --checkpoint "$R" --out "$tmp/lexp.safetensors" >/dev/null 2>"$tmp/s.err"
[ $? -eq 1 ] && grep -q "lora export converts peft adapters only" "$tmp/s.err" &&
  ok "lora export of a LyCORIS run is refused, saying why" || bad "lora export: $(tail -1 "$tmp/s.err")"
"$CT" sample --checkpoint "$R" --ema "${s[@]}" --out "$tmp/s_ema.png" >/dev/null 2>"$tmp/s.err"
[ $? -eq 1 ] && grep -q "no alphas" "$tmp/s.err" && ok "sample --ema of a LyCORIS run is refused, saying why" ||
  bad "--ema: $(tail -1 "$tmp/s.err")"

# errors name the problem
bad_cfg() { echo "$1" > "$tmp/bad.json"; }
bad_cfg '{"algo": "boft", "multiplier": 1, "linear_dim": 2, "linear_alpha": 1}'
err "unsupported algo" "algo 'boft' is LyCORIS's but not implemented" --lycoris_config="$tmp/bad.json"
bad_cfg '{"algo": "lokr", "multiplier": 1, "linear_dim": 2, "linear_alpha": 1, "factor": 0}'
err "bad factor" "factor 0: LoKr's factor must be" --lycoris_config="$tmp/bad.json"
bad_cfg '{"algo": "lokr", "multiplier": 1, "linear_dim": 2, "linear_alpha": 1, "rank": 4}'
err "unknown key" "unknown lycoris_config key 'rank'" --lycoris_config="$tmp/bad.json"
err "no config" "lora_type lycoris needs lycoris_config" --lycoris_config=
err "missing file" "lycoris_config: .*nope.json" --lycoris_config="$tmp/nope.json"
bad_cfg '{"algo": "loha", "multiplier": 1, "linear_dim": 2, "linear_alpha": 1, "apply_preset": {"target_module": ["FluxAttention"]}}'
err "a file of another config" "not a LyCORIS adapter for this model" --lycoris_config="$tmp/bad.json" \
  --init_lora="$tmp/one/pytorch_lora_weights.safetensors"
exit $fail
