#!/usr/bin/env bash
# End-to-end: `ctuner model convert` between diffusers' FluxTransformer2DModel
# layout and BFL's single file, on the diffusers-written goldens of
# tests/data/flux (scripts/flux_golden.py): diffusers -> BFL gives the BFL file
# diffusers' converter reads (bfl.safetensors, byte for byte); BFL -> diffusers
# gives save_pretrained's config.json byte for byte and, sharded, the index; a
# pipeline directory's transformer/ is found; the BFL file's names are the ones
# diffusers' single-file converter reads (tests/data/flux/bfl_keys_dev.txt);
# bad input exits 1 or 2, named.
# Values against diffusers itself: tests/test_flux.c, and live `make interop`.
# Usage: tests/cli_flux.sh path/to/ctuner
. "$(dirname "$0")/lib/common.sh"
D=tests/data/flux

"$CT" model convert --from $D/schnell/transformer --to "$tmp/s.safetensors" --layout bfl > "$tmp/out"; rc=$?
[ $rc -eq 0 ] && grep -q '"from_layout": "diffusers"' "$tmp/out" && ok "diffusers -> bfl exits 0" || bad "rc=$rc $(cat "$tmp/out")"
python3 - "$tmp/s.safetensors" $D/bfl.safetensors <<'PY' && ok "BFL file holds the golden BFL tensors bit for bit" || bad "BFL tensors differ"
import json, struct, sys
def read(p):
    b = open(p, "rb").read(); n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n]); d = b[8 + n:]
    h.pop("__metadata__", None)
    return {k: (v["dtype"], v["shape"], d[v["data_offsets"][0]:v["data_offsets"][1]]) for k, v in h.items()}
sys.exit(0 if read(sys.argv[1]) == read(sys.argv[2]) else 1)
PY

"$CT" model convert --from $D/bfl.safetensors --axes_dims_rope 4,6,6 --to "$tmp/s_d" --layout diffusers --max_shard_size 64K > /dev/null; rc=$?
[ $rc -eq 0 ] && cmp -s "$tmp/s_d/config.json" $D/schnell/transformer/config.json && ok "bfl -> diffusers: config.json as save_pretrained's" || bad "rc=$rc config: $(diff "$tmp/s_d/config.json" $D/schnell/transformer/config.json)"
n=$(ls "$tmp/s_d"/diffusion_pytorch_model-0000*-of-0000*.safetensors 2>/dev/null | wc -l)
[ "$n" -gt 1 ] && [ -f "$tmp/s_d/diffusion_pytorch_model.safetensors.index.json" ] && ok "sharded at 64K: $n shards + index" || bad "$n shards"
"$CT" model convert --from "$tmp/s_d" --to "$tmp/s2.safetensors" --layout bfl > /dev/null && cmp -s "$tmp/s.safetensors" "$tmp/s2.safetensors" &&
  ok "diffusers -> bfl -> diffusers (sharded) -> bfl: same bytes" || bad "round trip differs"

mkdir -p "$tmp/pipe" && cp -r $D/dev/transformer "$tmp/pipe/"
"$CT" model convert --from "$tmp/pipe" --to "$tmp/d.safetensors" --layout bfl > "$tmp/out"; rc=$?
[ $rc -eq 0 ] && grep -q '"from": "[^"]*/pipe/transformer"' "$tmp/out" && grep -q '"guidance_embeds": true' "$tmp/out" &&
  ok "a pipeline directory: its transformer/ is converted (dev, guidance)" || bad "pipeline: rc=$rc $(cat "$tmp/out")"
# the names diffusers' from_single_file reads for dev's depth (scripts/bfl_keys_golden.py: its
# converter run at FLUX.1's width; live in make interop): exactly those, none missing or extra
python3 - "$tmp/d.safetensors" $D/bfl_keys_dev.txt <<'PY' && ok "the BFL file's names = those diffusers' single-file converter reads ($(wc -l < $D/bfl_keys_dev.txt))" || bad "BFL names differ from diffusers' list"
import json, struct, sys
b = open(sys.argv[1], "rb").read(); h = json.loads(b[8:8 + struct.unpack("<Q", b[:8])[0]])
h.pop("__metadata__", None)
have = {k[len("model.diffusion_model."):] if k.startswith("model.diffusion_model.") else k for k in h}
want = set(open(sys.argv[2]).read().split())
if have != want:
    print("missing", sorted(want - have)[:6], "extra", sorted(have - want)[:6])
sys.exit(0 if have == want else 1)
PY

"$CT" model convert --from hf-org/FLUX.1-dev --to "$tmp/x" --layout diffusers 2> "$tmp/err"; rc=$?
[ $rc -eq 2 ] && grep -q "ctuner does not download" "$tmp/err" && ok "a hub id: exit 2, says fetch it first" || bad "hub id: rc=$rc $(cat "$tmp/err")"
"$CT" model convert --from $D/bfl.safetensors --to "$tmp/y" --layout diffusers 2> "$tmp/err"; rc=$?
[ $rc -eq 1 ] && grep -q "axes_dims_rope" "$tmp/err" && ok "tiny BFL without --axes_dims_rope: exit 1, asks for it" || bad "axes: rc=$rc $(cat "$tmp/err")"
"$CT" model convert --from $D/schnell/transformer --to "$tmp/s_d" --layout diffusers 2> "$tmp/err"; rc=$?
[ $rc -eq 1 ] && grep -q "not an empty directory" "$tmp/err" && ok "an existing directory is not overwritten" || bad "exists: rc=$rc $(cat "$tmp/err")"
"$CT" model convert --from $D/schnell/transformer --to "$tmp/z" --layout comfy 2> "$tmp/err"; rc=$?
[ $rc -eq 2 ] && ok "unknown layout: exit 2" || bad "layout: rc=$rc"
exit $fail
