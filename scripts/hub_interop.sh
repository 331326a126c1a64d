#!/usr/bin/env bash
# make interop: the Hugging Face cache ctuner writes is one huggingface_hub and
# diffusers read, and the reverse (docs/hub.md). scripts/hub_server.py serves
# the committed tiny FLUX pipeline on 127.0.0.1 as org/tiny-flux; never the
# internet.
#   1. ctuner hub download into HF_HOME=A; then, offline, huggingface_hub's
#      try_to_load_from_cache and snapshot_download(local_files_only) find
#      ctuner's files, and diffusers' FluxPipeline.from_pretrained loads them;
#   2. huggingface_hub's snapshot_download from the same server into HF_HOME=B;
#      then, offline, ctuner hub path and ctuner sample --pretrained read it.
# Usage: scripts/hub_interop.sh path/to/ctuner [python]
set -euo pipefail
CT=$(realpath "${1:?usage: $0 path/to/ctuner [python]}")
root=$(cd "$(dirname "$0")/.." && pwd)
py=${2:-$("$root/scripts/py_deps.sh" diffusers)}
tmp=$(mktemp -d)
spid=
trap '[ -n "$spid" ] && kill $spid 2>/dev/null; rm -rf "$tmp"' EXIT
P=$root/tests/data/flux_pipe/dev
ID=org/tiny-flux
unset HF_HUB_OFFLINE TRANSFORMERS_OFFLINE HF_TOKEN HF_HUB_CACHE HUGGINGFACE_HUB_CACHE
python3 "$root/scripts/hub_server.py" --repo "$ID=$P" --port-file "$tmp/port" --log "$tmp/log" &
spid=$!
for _ in $(seq 100); do [ -s "$tmp/port" ] && break; sleep 0.1; done
export HF_ENDPOINT=http://127.0.0.1:$(cat "$tmp/port")

snap=$(HF_HOME=$tmp/a "$CT" hub download $ID 2> "$tmp/err") || { cat "$tmp/err"; exit 1; }
HF_HOME=$tmp/a HF_HUB_OFFLINE=1 "$py" - "$ID" "$snap" <<'PY'
import sys, os
from huggingface_hub import try_to_load_from_cache, snapshot_download
import torch
from diffusers import FluxPipeline
repo, snap = sys.argv[1], sys.argv[2]
p = try_to_load_from_cache(repo, "transformer/config.json")
assert p == os.path.join(snap, "transformer/config.json"), (p, snap)
d = snapshot_download(repo, local_files_only=True)
assert os.path.realpath(d) == os.path.realpath(snap), (d, snap)
pipe = FluxPipeline.from_pretrained(repo, local_files_only=True)
n = sum(x.numel() for x in pipe.transformer.parameters())
print("ok - huggingface_hub finds ctuner's cache; FluxPipeline.from_pretrained loads it (%d transformer parameters)" % n)
PY

HF_HOME=$tmp/b "$py" - "$ID" <<'PY'
import sys
from huggingface_hub import snapshot_download
print("huggingface_hub wrote", snapshot_download(sys.argv[1]))
PY
# the same layout: every symlink ctuner made, huggingface_hub made with the same target
bad=0
while IFS= read -r l; do
  rel=${l#"$tmp/a/"}
  [ "$(readlink "$tmp/b/$rel")" = "$(readlink "$l")" ] || { echo "differs: $rel"; bad=1; }
done < <(find "$tmp/a/hub" -type l)
[ "$(cat "$tmp/a/hub/models--org--tiny-flux/refs/main")" = "$(cat "$tmp/b/hub/models--org--tiny-flux/refs/main")" ] || bad=1
[ $bad = 0 ] && echo "ok - the same refs/main, snapshot symlinks and blob names as huggingface_hub's" || exit 1
kill $spid; wait $spid 2>/dev/null || true; spid=
got=$(HF_HOME=$tmp/b HF_HUB_OFFLINE=1 "$CT" hub path $ID)
HF_HOME=$tmp/b HF_HUB_OFFLINE=1 "$CT" sample --pretrained $ID --prompt "a red square" --steps 2 \
  --width 32 --height 32 --out "$tmp/b.png" > /dev/null
"$CT" sample --pretrained "$P" --prompt "a red square" --steps 2 --width 32 --height 32 \
  --out "$tmp/p.png" > /dev/null 2>&1
cmp -s "$tmp/b.png" "$tmp/p.png"
echo "ok - ctuner reads the cache huggingface_hub wrote ($got): the local directory's image"
