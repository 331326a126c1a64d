#!/usr/bin/env bash
# End-to-end: `ctuner dataset synth` and `ctuner eval synth` on the real binary —
# file counts and formats, caption grammar, determinism, the judge on ground
# truth (and on wrong captions — colour/shape, or size/position/background —
# where it must disagree), prompts from file
# names, and usage errors. Usage: tests/cli_synth.sh path/to/ctuner
. "$(dirname "$0")/lib/common.sh"
PY=python3
[ -x /usr/bin/python3 ] && PY=/usr/bin/python3
# json FIELD < json  -> value
json() { "$PY" -c "import json,sys; print(json.load(sys.stdin)$1)"; }

out=$("$CT" dataset synth --out "$tmp/ds" --count 40 --seed 11) || bad "dataset synth rc=$?"
echo "$out" | grep -q '"count": 40' && ok "summary: $out" || bad "summary: $out"
n_img=$(ls "$tmp/ds" | grep -cE '^[0-9]{6}\.(png|jpg)$')
n_txt=$(ls "$tmp/ds" | grep -cE '^[0-9]{6}\.txt$')
[ "$n_img" -eq 40 ] && [ "$n_txt" -eq 40 ] && ok "40 images + 40 captions" || bad "images $n_img captions $n_txt"
png=0; jpg=0; badfmt=0
for f in "$tmp"/ds/*.png; do
  [ "$(head -c 4 "$f" | od -An -tx1 | tr -d ' \n')" = "89504e47" ] && png=$((png+1)) || badfmt=1
done
for f in "$tmp"/ds/*.jpg; do
  [ -e "$f" ] || continue
  [ "$(head -c 3 "$f" | od -An -tx1 | tr -d ' \n')" = "ffd8ff" ] && jpg=$((jpg+1)) || badfmt=1
done
[ $badfmt -eq 0 ] && [ $jpg -ge 2 ] && [ $png -ge 24 ] && ok "formats: $png PNG, $jpg JPEG" \
  || bad "formats: $png PNG, $jpg JPEG, bad signature $badfmt"
re='^a (small|medium|large) (red|green|blue|yellow|magenta|cyan|orange|purple) (circle|square|triangle) (at the (top left|top|top right|left|right|bottom left|bottom|bottom right)|in the center) on a (white|black|grey) background$'
nbad=$(cat "$tmp"/ds/*.txt | grep -cvE "$re")
[ "$nbad" -eq 0 ] && ok "captions follow the grammar" || bad "$nbad captions off-grammar: $(cat "$tmp"/ds/*.txt | grep -vE "$re" | head -2)"

# Deterministic for a seed; another seed differs.
"$CT" dataset synth --out "$tmp/ds2" --count 40 --seed 11 >/dev/null && diff -r -q "$tmp/ds" "$tmp/ds2" >/dev/null \
  && ok "same seed, same files" || bad "same seed gave different files"
"$CT" dataset synth --out "$tmp/ds3" --count 40 --seed 12 >/dev/null || bad "seed 12 rc=$?"
if diff -r -q "$tmp/ds" "$tmp/ds3" >/dev/null; then bad "seed 12 == seed 11"; else ok "another seed differs"; fi

# The judge on ground truth.
if out=$("$CT" eval synth --images "$tmp/ds"); then
  echo "$out" | "$PY" -c "
import json,sys
d=json.load(sys.stdin)
assert d['images'] == 40 and d['color_accuracy'] >= 0.95 and d['shape_accuracy'] >= 0.9, d
assert min(d[k + '_accuracy'] for k in ('size', 'position', 'background')) >= 0.95, d
assert d['all_accuracy'] >= 0.9, d
c=d['confusion']['size']
assert c['labels'] == ['small', 'medium', 'large'] and sum(map(sum, c['counts'])) == 40, c
assert len(d['confusion']['position']['counts'][0]) == 10, d['confusion']['position']
" && ok "eval on ground truth: $(echo "$out" | head -1)" || bad "eval on ground truth: $out"
else
  bad "eval synth rc=$?: $out"
fi

# Wrong captions: the judge must notice (colours rotated, shapes rotated).
mkdir -p "$tmp/wrong"
for f in "$tmp"/ds/*; do
  b=$(basename "$f")
  case "$b" in
    *.txt) sed -e 's/red/TMP/;s/green/red/;s/TMP/green/;s/blue/cyan/;s/yellow/purple/;s/magenta/orange/' \
               -e 's/circle/TMP/;s/square/circle/;s/triangle/square/;s/TMP/triangle/' "$f" >"$tmp/wrong/$b" ;;
    *) cp "$f" "$tmp/wrong/$b" ;;
  esac
done
out=$("$CT" eval synth --images "$tmp/wrong")
s=$(echo "$out" | json '["shape_accuracy"]'); c=$(echo "$out" | json '["color_accuracy"]')
"$PY" -c "import sys; sys.exit(not ($s == 0 and $c < 0.5))" && ok "wrong captions scored low: $out" || bad "wrong captions: $out"
# Sizes, positions and backgrounds rotated (colour and shape kept): those three
# and all-five must be 0, colour and shape still right.
mkdir -p "$tmp/wrong2"
for f in "$tmp"/ds/*; do
  b=$(basename "$f")
  case "$b" in
    *.txt) sed -e 's/small/TMP/;s/large/small/;s/medium/large/;s/TMP/medium/' \
               -e 's/white/TMP/;s/grey/white/;s/black/grey/;s/TMP/black/' \
               -e 's/left/TMP/;s/right/left/;s/TMP/right/;s/top/TMP/;s/bottom/top/;s/TMP/bottom/' \
               -e 's/in the center/at the top left/' "$f" >"$tmp/wrong2/$b" ;;
    *) cp "$f" "$tmp/wrong2/$b" ;;
  esac
done
out=$("$CT" eval synth --images "$tmp/wrong2")
echo "$out" | "$PY" -c "
import json,sys
d=json.load(sys.stdin)
assert d['size_accuracy'] == 0 and d['position_accuracy'] == 0 and d['background_accuracy'] == 0, d
assert d['all_accuracy'] == 0 and d['color_accuracy'] >= 0.95 and d['shape_accuracy'] >= 0.9, d
" && ok "wrong size/position/background scored 0: $(echo "$out" | head -1)" || bad "wrong size/position/background: $out"

# Prompt from the file name (validation images), --verbose per_image is valid JSON.
mkdir -p "$tmp/val"
cap=$(cat "$tmp/ds/000000.txt")
src=$(ls "$tmp"/ds/000000.*| grep -v txt)
cp "$src" "$tmp/val/step_100_$(echo "$cap" | tr ' ' '_')_0_32x32.${src##*.}"
src1=$(ls "$tmp"/ds/000001.* | grep -v txt)
cp "$src1" "$tmp/val/step_100_unrelated_0_32x32.${src1##*.}"  # no prompt: skipped
printf 'not an image' >"$tmp/val/broken.png"
printf '%s\n' "$cap" >"$tmp/val/broken.txt"
out=$("$CT" eval synth --images "$tmp/val" --verbose 2>"$tmp/err")
echo "$out" | "$PY" -c "
import json,sys
d=json.load(sys.stdin)
assert d['images'] == 1 and d['skipped'] == 2, d
p=d['per_image'][0]
assert p['prompt_from'] == 'filename' and p['color_ok'] and p['shape_ok'], p
assert p['all_ok'] and p['size_ok'] and p['position_ok'] and p['background_ok'], p
" && ok "prompt from file name, --verbose JSON" || bad "file-name prompt: $out $(cat "$tmp/err")"
grep -q "broken.png" "$tmp/err" && ok "unreadable image reported: $(grep broken "$tmp/err")" || bad "broken.png not reported"

# --size: every image WxH (PNG IHDR / JPEG SOF read by the judge's decoder via eval).
"$CT" dataset synth --out "$tmp/sized" --count 12 --seed 2 --size 40x24 >/dev/null \
  && $PY - "$tmp/sized" <<'PY' && ok "--size 40x24: every image 40x24" || bad "--size 40x24"
import os, struct, sys
d = sys.argv[1]
n = 0
for f in os.listdir(d):
    b = open(os.path.join(d, f), "rb").read()
    if f.endswith(".png"):
        w, h = struct.unpack(">II", b[16:24])
    elif f.endswith(".jpg"):
        i = 2
        while b[i + 1] not in (0xC0, 0xC1, 0xC2):
            i += 2 + struct.unpack(">H", b[i + 2:i + 4])[0]
        h, w = struct.unpack(">HH", b[i + 5:i + 9])
    else:
        continue
    assert (w, h) == (40, 24), (f, w, h)
    n += 1
assert n == 12, n
PY
for sz in 40 0x10 40x24x1 9000x8 ax; do
  "$CT" dataset synth --out "$tmp/badsize" --count 2 --size "$sz" >/dev/null 2>"$tmp/err"; rc=$?
  [ $rc -eq 2 ] && grep -q "size" "$tmp/err" || bad "--size $sz rc=$rc"
done
ok "bad --size values refused"

# Held-out prompts: never a (colour, shape, position) that training draws.
key() { sed -E 's/^a [a-z]+ //; s/ on a [a-z]+ background$//' | sort -u; }
"$CT" dataset prompts --count 3000 --seed 1 | key > "$tmp/train_keys"
"$CT" dataset prompts --held-out --count 300 --seed 7 > "$tmp/held"
key < "$tmp/held" > "$tmp/held_keys"
nh=$(wc -l < "$tmp/held"); nk=$(wc -l < "$tmp/held_keys"); nt=$(wc -l < "$tmp/train_keys")
both=$(comm -12 "$tmp/train_keys" "$tmp/held_keys" | wc -l)
[ "$nh" -eq 300 ] && [ "$nk" -eq 21 ] && [ "$nt" -eq 195 ] && [ "$both" -eq 0 ] \
  && ok "held-out prompts: 21 combinations, disjoint from the 195 training ones" \
  || bad "held-out prompts: $nh lines, $nk held keys, $nt train keys, $both shared"
"$CT" dataset prompts --count 4 --seed 3 | cmp -s - <("$CT" dataset prompts --count 4 --seed 3) \
  && ok "dataset prompts is deterministic" || bad "dataset prompts not deterministic"
"$CT" dataset prompts >/dev/null 2>&1; [ $? -eq 2 ] && ok "dataset prompts without --count" || bad "prompts without --count"

# Refusals and usage errors.
"$CT" dataset synth --out "$tmp/ds" --count 5 >/dev/null 2>"$tmp/err"; rc=$?
[ $rc -eq 1 ] && grep -q "not empty" "$tmp/err" && ok "non-empty dir refused" || bad "non-empty dir rc=$rc $(cat "$tmp/err")"
touch "$tmp/ds/keep.me"
"$CT" dataset synth --out "$tmp/ds" --count 5 --force >/dev/null && [ "$(ls "$tmp/ds" | grep -c txt)" -eq 5 ] && [ -e "$tmp/ds/keep.me" ] \
  && ok "--force replaces the old dataset, keeps other files" || bad "--force: $(ls "$tmp/ds" | wc -l) files"
for args in "--out $tmp/x" "--count 5" "--out $tmp/x --count 0" "--out $tmp/x --count abc" "--out $tmp/x --count 3 --bogus"; do
  # shellcheck disable=SC2086
  "$CT" dataset synth $args >/dev/null 2>"$tmp/err"; rc=$?
  [ $rc -eq 2 ] && [ -s "$tmp/err" ] && ok "dataset synth $args -> 2: $(head -1 "$tmp/err")" || bad "dataset synth $args rc=$rc"
done
"$CT" eval synth >/dev/null 2>"$tmp/err"; rc=$?
[ $rc -eq 2 ] && grep -q -- "--images" "$tmp/err" && ok "eval without --images" || bad "eval without --images rc=$rc"
"$CT" eval synth --images "$tmp/none" >/dev/null 2>"$tmp/err"; rc=$?
[ $rc -eq 1 ] && grep -q "none" "$tmp/err" && ok "eval on a missing dir" || bad "eval missing dir rc=$rc"
mkdir -p "$tmp/empty"
"$CT" eval synth --images "$tmp/empty" >/dev/null 2>"$tmp/err"; rc=$?
[ $rc -eq 1 ] && grep -q "no image" "$tmp/err" && ok "eval on an empty dir fails" || bad "eval empty dir rc=$rc"
"$CT" dataset frob >/dev/null 2>&1; [ $? -eq 2 ] && ok "unknown dataset subcommand" || bad "unknown dataset subcommand"
"$CT" dataset synth --help | grep -q -- "--count" && ok "dataset synth --help" || bad "dataset synth --help"
"$CT" eval --help | grep -q "background_accuracy" && ok "eval --help" || bad "eval --help"
"$CT" --help | grep -q "eval synth" && ok "--help lists eval synth" || bad "--help"
exit $fail
