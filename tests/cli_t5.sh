#!/usr/bin/env bash
# End-to-end: `ctuner model text` on the tiny FLUX T5 of tests/data/t5 — the
# ids it prints equal T5TokenizerFast's (tok_golden.json, padded to 16), the
# pieces are printed, the embedding has the config's shape; --tokens_only
# with spiece.model alone; a missing tokenizer_2 and a config.json whose
# vocab_size does not match the weights are refused with exit 1 and named.
# Usage: tests/cli_t5.sh path/to/ctuner
. "$(dirname "$0")/lib/common.sh"
D=tests/data/t5

out=$("$CT" model text --pretrained $D --max_sequence_length 16 --caption "A photo of a cat" --caption "") ; rc=$?
[ $rc -eq 0 ] && ok "model text exits 0" || bad "model text rc=$rc"
# T5TokenizerFast("A photo of a cat") is caption 3 of the golden
want=$(python3 -c "import json; g=json.load(open('$D/tok_golden.json')); print(g['ids'][3])")
got=$(echo "$out" | head -1 | python3 -c "import json,sys; print(json.loads(sys.stdin.read())['ids'])")
[ "$got" = "$want" ] && ok "ids equal T5TokenizerFast's: $got" || bad "ids $got, want $want"
echo "$out" | head -1 | grep -q '"pieces": \["▁", "A", "▁photo"' && ok "pieces printed" || bad "pieces: $out"
echo "$out" | grep -q '"shape": \[1, 16, 64\]' && ok "embedding shape [1, 16, 64]" || bad "no shape in: $out"
echo "$out" | tail -1 | grep -q '"ids": \[1\]' && ok "empty caption: </s> only" || bad "empty caption: $out"

mkdir -p "$tmp/tok" && cp $D/tokenizer_2/spiece.model "$tmp/tok/"
out2=$("$CT" model text --tokenizer "$tmp/tok" --tokens_only --caption "A photo of a cat"); rc=$?
got2=$(echo "$out2" | python3 -c "import json,sys; print(json.loads(sys.stdin.read())['ids'])")
[ $rc -eq 0 ] && [ "$got2" = "$want" ] && ok "spiece.model alone gives the same ids" || bad "spiece.model: rc=$rc $out2"

"$CT" model text --pretrained "$tmp/nowhere" > /dev/null 2> "$tmp/err"; rc=$?
[ $rc -eq 1 ] && grep -q "neither tokenizer.json nor spiece.model" "$tmp/err" && ok "missing tokenizer_2: exit 1, named" ||
  bad "missing dir: rc=$rc $(cat "$tmp/err")"
mkdir -p "$tmp/p" && cp -r $D/text_encoder_2 "$tmp/p/" && mkdir -p "$tmp/p/tokenizer_2" &&
  sed 's/"vocab_size": 500/"vocab_size": 300/' $D/text_encoder_2/config.json > "$tmp/p/text_encoder_2/config.json" &&
  cp $D/tokenizer_2/spiece.model "$tmp/p/tokenizer_2/"
"$CT" model text --pretrained "$tmp/p" > /dev/null 2> "$tmp/err"; rc=$?
[ $rc -eq 1 ] && grep -q "shared.weight" "$tmp/err" && ok "vocab_size not matching the weights: exit 1, tensor named" ||
  bad "vocab mismatch: rc=$rc $(cat "$tmp/err")"
"$CT" model text > /dev/null 2>&1; rc=$?
[ $rc -eq 2 ] && ok "no directory: exit 2" || bad "no directory: rc=$rc"
exit $fail
