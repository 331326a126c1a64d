#!/usr/bin/env bash
# `make demo-lora` (docs/lora.md): teach the base of `make demo` a colour word
# it never saw, with a LoRA, and judge it before and after.
#
# The base (examples/demo/config.json: the demo preset on synthetic shapes)
# learnt eight colour words. The LoRA data are synthetic shapes whose orange
# ones are captioned "coral" instead (plus a quarter of the others, as they
# are, so the rest is not forgotten). Before and after, 48 prompts that say
# "coral" are sampled and judged by `ctuner eval synth` against "orange"
# (colour accuracy, and all five attributes), and the same 48 prompts with
# their own colour words check that the base's skills survive. ("coral" is 4
# tokens of the demo's small BPE vocabulary: the captions still fit
# tokenizer_max_length 16 but for their last word; "vermilion" would take 8.)
#   scripts/demo_lora.sh [path/to/ctuner]      DEMO_LORA_OUT=dir (default demo-lora-output)
#   the base: DEMO_LORA_BASE=checkpoint dir, else make demo's newest checkpoint
#   (demo-output/run), else one trained here (DEMO_LORA_BASE_STEPS, default
#   1000 as make demo); DEMO_LORA_STEPS LoRA steps (default 200);
#   DEMO_LORA_PROMPTS prompts judged (default 48); DEMO_LORA_GRID=PATH also
#   writes the before/after grid there (the README's docs/img/demo_lora.png).
set -euo pipefail
CT=${1:-build/ctuner}
cd "$(dirname "$0")/.."
OUT=${DEMO_LORA_OUT:-demo-lora-output}
WORD=coral COLOUR=orange
BASE_STEPS=${DEMO_LORA_BASE_STEPS:-1000}
LORA_STEPS=${DEMO_LORA_STEPS:-200}
N=${DEMO_LORA_PROMPTS:-48}
PY=/usr/bin/python3
start=$(date +%s)
mkdir -p "$OUT"

newest() { # the newest complete checkpoint under $1, or nothing
  local d
  for d in $(ls -d "$1"/checkpoint-* 2>/dev/null | sort -t- -k2 -n -r); do
    grep -qs complete "$d/.guard" && { echo "$d"; return; }
  done
}

echo "== 1/5 the base"
base=${DEMO_LORA_BASE:-$(newest demo-output/run)}
[ -z "$base" ] && base=$(newest "$OUT/base/run")
if [ -z "$base" ]; then
  echo "   training one as make demo does ($BASE_STEPS steps): $OUT/base"
  export DEMO_OUT=$OUT/base
  [ -f "$DEMO_OUT/data/.complete" ] || {
    rm -rf "$DEMO_OUT/data"
    "$CT" dataset synth --out "$DEMO_OUT/data" --count 2000 --seed 1 --size 64x64 >/dev/null
    touch "$DEMO_OUT/data/.complete"
  }
  "$CT" train --config examples/demo/config.json --resume_from_checkpoint=none \
    --max_train_steps="$BASE_STEPS" --checkpoint_step_interval="$BASE_STEPS" \
    --disable_progress_bar=true >"$OUT/base.log" 2>&1 || { tail -5 "$OUT/base.log"; exit 1; }
  base=$(newest "$OUT/base/run")
fi
echo "   $base"
weights=$base/ema.safetensors
[ -f "$weights" ] || weights=$base/model.safetensors

echo "== 2/5 LoRA data: synthetic shapes, the orange ones captioned '$WORD'"
rm -rf "$OUT/lora-data"
"$CT" dataset synth --out "$OUT/lora-data" --count 1600 --seed 2 --size 64x64 >/dev/null
$PY - "$OUT/lora-data" "$WORD" "$COLOUR" <<'PY'
import glob, os, sys
d, word, colour = sys.argv[1:]
kept = [0, 0]
for i, t in enumerate(sorted(glob.glob(os.path.join(d, "*.txt")))):
    cap = open(t).read().strip()
    img = [p for p in glob.glob(t[:-4] + ".*") if not p.endswith(".txt")]
    if f" {colour} " in f" {cap} ":
        open(t, "w").write(cap.replace(f" {colour} ", f" {word} ") + "\n")
        kept[0] += 1
    elif i % 4 == 0:
        kept[1] += 1  # prior preservation: the other colours as they are
    else:
        for p in img + [t]:
            os.remove(p)
print(f"   {kept[0]} '{word}' images, {kept[1]} others")
PY
cat >"$OUT/lora-backend.json" <<JSON
[{"id": "coral", "type": "local", "instance_data_dir": "$OUT/lora-data", "caption_strategy": "textfile", "crop": false}]
JSON
cat >"$OUT/prompts.json" <<JSON
{"circle": "a large $WORD circle in the center on a white background",
 "square": "a medium $WORD square at the top left on a black background",
 "triangle": "a large $WORD triangle at the bottom right on a grey background",
 "red": "a large red circle in the center on a white background"}
JSON

echo "== 3/5 LoRA training ($LORA_STEPS steps, all+ffs rank 16; $OUT/lora/metrics.jsonl)"
DEMO_OUT=$OUT "$CT" train --config examples/demo/config.json --resume_from_checkpoint=none \
  --output_dir="$OUT/lora" --data_backend_config="$OUT/lora-backend.json" \
  --user_prompt_library="$OUT/prompts.json" --model_type=lora \
  --pretrained_model_path="$weights" --flux_lora_target=all+ffs --lora_rank=16 \
  --lora_alpha=16 --lora_dropout=0 --optimizer=adamw --learning_rate=2e-3 \
  --lr_scheduler=constant_with_warmup --lr_warmup_steps=10 --use_ema=false \
  --max_train_steps="$LORA_STEPS" --checkpoint_step_interval="$LORA_STEPS" \
  --validation_step_interval="$LORA_STEPS" --disable_progress_bar=true >"$OUT/lora.log" 2>&1 ||
  { tail -5 "$OUT/lora.log"; exit 1; }
lora=$(newest "$OUT/lora")

echo "== 4/5 sampling $N '$WORD' prompts and the same $N with their own colours, before and after"
"$CT" dataset prompts --count "$N" --seed 11 >"$OUT/own.txt"
$PY - "$OUT/own.txt" "$WORD" >"$OUT/word.txt" <<'PY'
import sys
colours = ["red", "green", "blue", "yellow", "magenta", "cyan", "orange", "purple"]
for line in open(sys.argv[1]):
    w = line.split()
    w[w.index(next(c for c in w if c in colours))] = sys.argv[2]  # the first colour word
    print(" ".join(w))
PY
judge() { # name checkpoint-args... ; prompts file by name
  local name=$1 set=$2
  shift 2
  rm -rf "$OUT/$name"
  "$CT" sample "$@" --prompts-file "$OUT/$set.txt" --out-dir "$OUT/$name" >/dev/null
  # the judge reads the prompt beside each image: the new word means orange
  sed -i "s/\b$WORD\b/$COLOUR/" "$OUT/$name"/*.txt
  "$CT" eval synth --images "$OUT/$name" >"$OUT/$name.json"
}
judge before_word word --checkpoint "$base" --ema
judge after_word word --checkpoint "$lora"
judge before_own own --checkpoint "$base" --ema
judge after_own own --checkpoint "$lora"

echo "== 5/5 judged"
$PY - "$OUT" "$WORD" "$COLOUR" "${DEMO_LORA_GRID:-}" "$(($(date +%s) - start))" <<'PY'
import json, os, sys
out, word, colour, grid, secs = sys.argv[1:]
r = {k: json.load(open(os.path.join(out, k + ".json")))
     for k in ("before_word", "after_word", "before_own", "after_own")}
s = {"word": word, "means": colour, "prompts": r["before_word"]["images"], "seconds": int(secs)}
for k, v in r.items():
    s[k] = {"color_accuracy": v["color_accuracy"], "all_accuracy": v["all_accuracy"]}
json.dump(s, open(os.path.join(out, "summary.json"), "w"), indent=1)
print(f"'{word}' prompts judged as {colour}: colour accuracy {s['before_word']['color_accuracy']:.2f}"
      f" before, {s['after_word']['color_accuracy']:.2f} after (all five: "
      f"{s['before_word']['all_accuracy']:.2f} -> {s['after_word']['all_accuracy']:.2f})")
print(f"the same prompts with their own colours: all five {s['before_own']['all_accuracy']:.2f}"
      f" before, {s['after_own']['all_accuracy']:.2f} after")
# the grid: the first 8 '{word}' prompts, before (top) and after (bottom), x4 pixels
from PIL import Image, ImageDraw
ims = [[Image.open(os.path.join(out, f"{k}_word", f"{i:04d}.png")).convert("RGB")
        for i in range(8)] for k in ("before", "after")]
w, h = ims[0][0].size
z, pad, lab = 4, 4, 60
g = Image.new("RGB", (lab + 8 * (w * z + pad), 2 * (h * z + pad)), "white")
d = ImageDraw.Draw(g)
for r_, row in enumerate(ims):
    d.text((4, r_ * (h * z + pad) + h * z // 2 - 6), ("before", "after")[r_], fill="black")
    for c, im in enumerate(row):
        g.paste(im.resize((w * z, h * z), Image.NEAREST), (lab + c * (w * z + pad), r_ * (h * z + pad)))
g.save(os.path.join(out, "before_after.png"))
if grid:
    g.save(grid)
PY
echo
echo "demo-lora finished in $(($(date +%s) - start)) s. Look at:"
echo "  $OUT/summary.json          colour and all-five accuracy before/after"
echo "  $OUT/before_after.png      the first 8 '$WORD' prompts (in $OUT/word.txt), base above, LoRA below"
echo "  $OUT/lora/validation_images/   the LoRA run's validation grid"
echo "  $OUT/lora/pytorch_lora_weights.safetensors   the adapter (ctuner lora export/merge take it)"
