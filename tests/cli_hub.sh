#!/usr/bin/env bash
# Hub ids downloaded from a local stand-in for the Hugging Face Hub
# (scripts/hub_server.py on 127.0.0.1 serving the committed tiny FLUX pipeline
# tests/data/flux_pipe/dev as org/tiny-flux; never the internet; docs/hub.md):
# a wrong token gets the server's 401 explained; the token file works; a
# transfer cut half-way resumes with Range, in the same run and in the next;
# the cache is huggingface_hub's layout (refs/main, snapshots/SHA symlinks
# into blobs/ named by etag, the pipeline's components only); ctuner sample
# --pretrained ID loads it, then again with the server gone (from the cache,
# saying so), giving the same image as the local directory; HF_HUB_OFFLINE
# with an empty cache fails naming the id; ctuner train from the id trains
# the weights it trains from the directory; a revision the cache lacks is
# named; variant fp16 downloads and trains from the variant's files, an
# absent variant is refused; config check shows the snapshot.
# Usage: tests/cli_hub.sh path/to/ctuner
. "$(dirname "$0")/lib/common.sh"
root=$(cd "$(dirname "$0")/.." && pwd)
P=$root/tests/data/flux_pipe/dev
command -v python3 > /dev/null || { skip "no python3 for the local hub server"; finish; }
unset HF_HUB_OFFLINE TRANSFORMERS_OFFLINE HF_TOKEN HUGGING_FACE_HUB_TOKEN HF_TOKEN_PATH \
  HF_HUB_CACHE HUGGINGFACE_HUB_CACHE
export HF_HOME=$tmp/home XDG_CACHE_HOME=$tmp/xdg HF_HUB_ETAG_TIMEOUT=5
ID=org/tiny-flux
REPO=$HF_HOME/hub/models--org--tiny-flux
spid=
start_server() {
  rm -f "$tmp/port"
  python3 "$root/scripts/hub_server.py" --repo "$ID=$P" --port-file "$tmp/port" --log "$tmp/log" "$@" &
  spid=$!
  for _ in $(seq 100); do [ -s "$tmp/port" ] && break; sleep 0.1; done
  export HF_ENDPOINT=http://127.0.0.1:$(cat "$tmp/port")
}
stop_server() { [ -n "$spid" ] && kill "$spid" 2> /dev/null && wait "$spid" 2> /dev/null; spid=; }
trap 'stop_server; rm -rf "$tmp"' EXIT
# org/tiny-fp16: the same pipeline with diffusers' fp16 variant names (vae/*.fp16.safetensors,
# transformer/*.fp16-0000N-of-00002.safetensors + index.fp16.json) and garbage plain vae weights
V=$tmp/fp16
cp -rL "$P" "$V" && rm "$V/golden.safetensors"
mv "$V/vae/diffusion_pytorch_model.safetensors" "$V/vae/diffusion_pytorch_model.fp16.safetensors"
echo garbage > "$V/vae/diffusion_pytorch_model.safetensors"
for k in 1 2; do
  mv "$V/transformer/diffusion_pytorch_model-0000$k-of-00002.safetensors" "$V/transformer/diffusion_pytorch_model.fp16-0000$k-of-00002.safetensors"
done
sed 's/diffusion_pytorch_model-0000/diffusion_pytorch_model.fp16-0000/' "$V/transformer/diffusion_pytorch_model.safetensors.index.json" \
  > "$V/transformer/diffusion_pytorch_model.safetensors.index.fp16.json"
rm "$V/transformer/diffusion_pytorch_model.safetensors.index.json"
start_server --token good-token --cut-once --repo "org/tiny-fp16=$V"
[ -s "$tmp/port" ] && ok "the local hub listens on $HF_ENDPOINT" || { bad "server did not start"; finish; }

# ---- tokens ----
HF_TOKEN=wrong-token "$CT" hub download $ID > /dev/null 2> "$tmp/err"; rc=$?
[ $rc -eq 1 ] && grep -q "answered 401" "$tmp/err" && grep -q "the token from HF_TOKEN was refused" "$tmp/err" &&
  grep -q "the hub says: Invalid credentials in Authorization header" "$tmp/err" && ! grep -q wrong-token "$tmp/err" &&
  ok "a wrong token: exit 1, the server's 401 explained, the token not printed" || bad "wrong token: rc=$rc $(cat "$tmp/err")"
"$CT" hub download $ID > /dev/null 2> "$tmp/err"; rc=$?
[ $rc -eq 1 ] && grep -q "needs a token: set HF_TOKEN" "$tmp/err" &&
  ok "no token: says a private or gated repo needs one" || bad "no token: rc=$rc $(cat "$tmp/err")"
[ ! -e "$REPO/snapshots" ] && ok "nothing written on a refused download" || bad "refused, yet $(ls -R "$REPO" | head)"

# ---- the download: token from HF_HOME/token, a cut transfer resumed in the same run ----
mkdir -p "$HF_HOME" && echo good-token > "$HF_HOME/token"
"$CT" hub download $ID > "$tmp/out" 2> "$tmp/err"; rc=$?
sha=$(cat "$REPO/refs/main" 2> /dev/null)
[ $rc -eq 0 ] && [ "$(cat "$tmp/out")" = "$REPO/snapshots/$sha" ] && [ ${#sha} -eq 40 ] &&
  ok "downloaded with the token file; prints the snapshot; refs/main holds the commit" || bad "download: rc=$rc $(cat "$tmp/out" "$tmp/err")"
grep -q "resuming" "$tmp/err" && grep -Eq '^GET /cdn/[0-9a-f]{64} range=bytes=[1-9][0-9]*- ' "$tmp/log" &&
  ok "transfers cut half-way were resumed with Range: bytes=N-" || bad "no resume: $(cat "$tmp/err"; cat "$tmp/log" | head)"
! grep -q '^GET /cdn/.*auth=yes' "$tmp/log" && grep -q '^HEAD /org/tiny-flux/resolve/.*auth=yes' "$tmp/log" &&
  ok "the token goes to the hub, never to the CDN host it redirects to" || bad "token leak: $(grep cdn "$tmp/log" | head -3)"
S=$REPO/snapshots/$sha
same=1
while IFS= read -r f; do
  rel=${f#"$P"/}
  [ "$rel" = golden.safetensors ] && continue
  cmp -s "$f" "$S/$rel" || { same=0; echo "differs: $rel"; }
done < <(find "$P" -type f)
[ $same = 1 ] && [ ! -e "$S/golden.safetensors" ] &&
  ok "every component file as served, the top-level file outside model_index.json's components not fetched" || bad "files differ"
t=$(readlink "$S/transformer/config.json")
v=$(readlink "$S/vae/diffusion_pytorch_model.safetensors")
[ "${t#../../../blobs/}" != "$t" ] && [ "$v" = "../../../blobs/$(sha256sum "$P/vae/diffusion_pytorch_model.safetensors" | cut -d' ' -f1)" ] &&
  [ -z "$(find "$REPO/blobs" -name '*.incomplete')" ] &&
  ok "huggingface_hub's layout: relative symlinks into blobs/, LFS blobs named by their sha256, no .incomplete left" ||
  bad "layout: $t $v $(ls "$REPO/blobs")"

# ---- a transfer interrupted in an earlier run resumes ----
blob=$REPO/blobs/${v##*/}
size=$(stat -c %s "$blob")
half=$((size / 2))
rm "$S/vae/diffusion_pytorch_model.safetensors" && head -c $half "$blob" > "$blob.incomplete" && rm "$blob"
: > "$tmp/log"
"$CT" hub download $ID > /dev/null 2> "$tmp/err"; rc=$?
[ $rc -eq 0 ] && grep -q "range=bytes=$half- " "$tmp/log" && grep -q "(resumed)" "$tmp/err" &&
  cmp -s "$P/vae/diffusion_pytorch_model.safetensors" "$S/vae/diffusion_pytorch_model.safetensors" &&
  [ "$(grep -c '^GET /cdn/' "$tmp/log")" -eq 1 ] &&
  ok "a .incomplete blob from an earlier run: resumed from byte $half, the other files not fetched again" ||
  bad "resume: rc=$rc $(cat "$tmp/err" "$tmp/log")"

# ---- the pipeline loads from the id: online, then from the cache with the server gone ----
SAMPLE=(--prompt "a red square" --steps 2 --width 32 --height 32 --seed 3)
"$CT" sample --pretrained "$P" "${SAMPLE[@]}" --out "$tmp/local.png" > /dev/null 2> "$tmp/err" ||
  bad "sample from the directory: $(cat "$tmp/err")"
"$CT" sample --pretrained $ID "${SAMPLE[@]}" --out "$tmp/hub.png" > /dev/null 2> "$tmp/err"; rc=$?
[ $rc -eq 0 ] && cmp -s "$tmp/local.png" "$tmp/hub.png" &&
  ok "sample --pretrained $ID: the image of the local directory" || bad "sample hub: rc=$rc $(cat "$tmp/err")"
stop_server
"$CT" sample --pretrained $ID "${SAMPLE[@]}" --out "$tmp/cached.png" > /dev/null 2> "$tmp/err"; rc=$?
[ $rc -eq 0 ] && cmp -s "$tmp/local.png" "$tmp/cached.png" && grep -q "cannot reach" "$tmp/err" &&
  grep -q "using the cached $ID" "$tmp/err" &&
  ok "the server gone: the cache, with a warning that says so" || bad "cached: rc=$rc $(cat "$tmp/err")"
HF_HUB_OFFLINE=1 "$CT" sample --pretrained $ID "${SAMPLE[@]}" --out "$tmp/off.png" > /dev/null 2> "$tmp/err"; rc=$?
[ $rc -eq 0 ] && cmp -s "$tmp/local.png" "$tmp/off.png" && ! grep -q "cannot reach" "$tmp/err" &&
  ok "HF_HUB_OFFLINE=1 with the cache: loads, no network tried" || bad "offline cached: rc=$rc $(cat "$tmp/err")"
HF_HUB_OFFLINE=1 HF_HOME=$tmp/empty "$CT" sample --pretrained $ID "${SAMPLE[@]}" --out "$tmp/x.png" > /dev/null 2> "$tmp/err"; rc=$?
[ $rc -ne 0 ] && grep -q "'$ID'" "$tmp/err" && grep -q "$tmp/empty/hub (from HF_HOME) has no" "$tmp/err" &&
  grep -q "HF_HUB_OFFLINE is set" "$tmp/err" &&
  ok "HF_HUB_OFFLINE=1, empty cache: fails naming the id and the cache it looked in" || bad "offline empty: rc=$rc $(cat "$tmp/err")"
# ---- train from the id (the cache, offline): the same steps as from the directory ----
"$CT" dataset synth --out "$tmp/data" --count 4 --seed 5 --size 32x32 > /dev/null || bad "synth"
echo "[{\"id\": \"s\", \"type\": \"local\", \"instance_data_dir\": \"$tmp/data\", \"caption_strategy\": \"textfile\"}]" > "$tmp/backend.json"
TRAIN=(--data_backend_config="$tmp/backend.json" --resolution=32 --aspect_bucket_alignment=8 --train_batch_size=1
  --disable_progress_bar=true --seed=3 --learning_rate=1e-3 --num_threads=2 --max_train_steps=1 --checkpoint_step_interval=1)
W=checkpoint-1/transformer/diffusion_pytorch_model.safetensors
"$CT" train --pretrained_model_name_or_path="$P" "${TRAIN[@]}" --output_dir="$tmp/t_dir" > /dev/null 2> "$tmp/err" ||
  bad "train from the directory: $(tail -3 "$tmp/err")"
HF_HUB_OFFLINE=1 "$CT" train --pretrained_model_name_or_path=$ID --revision=main "${TRAIN[@]}" --output_dir="$tmp/t_hub" > /dev/null 2> "$tmp/err"; rc=$?
[ $rc -eq 0 ] && [ -s "$tmp/t_hub/$W" ] && cmp -s "$tmp/t_dir/$W" "$tmp/t_hub/$W" && grep -q "pretrained_model_name_or_path $ID (revision main): $S" "$tmp/err" &&
  ok "train --pretrained_model_name_or_path=$ID: says which snapshot, trains the same weights as from the directory" ||
  bad "train hub: rc=$rc $(tail -3 "$tmp/err")"
HF_HUB_OFFLINE=1 "$CT" train --pretrained_model_name_or_path=$ID --revision=v9 "${TRAIN[@]}" --output_dir="$tmp/t_v9" > /dev/null 2> "$tmp/err"; rc=$?
[ $rc -eq 1 ] && grep -q "(revision v9).*has no $REPO/refs/v9" "$tmp/err" && [ ! -e "$tmp/t_v9/checkpoint-1" ] &&
  ok "train with a revision the cache lacks: exit 1, names refs/v9" || bad "revision v9: rc=$rc $(cat "$tmp/err")"
# ---- a variant: only its files downloaded, the pipeline opened through the variant view ----
start_server --token good-token --repo "org/tiny-fp16=$V"
HF_TOKEN=good-token "$CT" hub download org/tiny-fp16 --variant fp16 > "$tmp/out" 2> "$tmp/err"; rc=$?
VS=$(cat "$tmp/out")
[ $rc -eq 0 ] && [ -L "$VS/vae/diffusion_pytorch_model.fp16.safetensors" ] && [ ! -e "$VS/vae/diffusion_pytorch_model.safetensors" ] &&
  [ -e "$VS/transformer/diffusion_pytorch_model.safetensors.index.fp16.json" ] && [ -e "$VS/text_encoder/model.safetensors" ] &&
  ok "hub download --variant fp16: the variant's weights, plain ones only where it has none" || bad "variant download: rc=$rc $(cat "$tmp/err"; ls -R "$VS" | head -30)"
stop_server
HF_HUB_OFFLINE=1 "$CT" train --pretrained_model_name_or_path=org/tiny-fp16 --variant=fp16 "${TRAIN[@]}" --output_dir="$tmp/t_fp16" > /dev/null 2> "$tmp/err"; rc=$?
[ $rc -eq 0 ] && cmp -s "$tmp/t_dir/$W" "$tmp/t_fp16/$W" &&
  ok "train with variant fp16: the fp16 files under their plain names, the directory's weights" || bad "variant train: rc=$rc $(tail -3 "$tmp/err")"
HF_HUB_OFFLINE=1 "$CT" train --pretrained_model_name_or_path=org/tiny-fp16 --variant=bf16 "${TRAIN[@]}" --output_dir="$tmp/t_bf16" > /dev/null 2> "$tmp/err"; rc=$?
[ $rc -eq 1 ] && grep -q "variant 'bf16'.*no weight file of it" "$tmp/err" &&
  ok "a variant the repo lacks: refused by name" || bad "variant bf16: rc=$rc $(cat "$tmp/err")"
echo '{"pretrained_model_name_or_path": "org/tiny-flux"}' > "$tmp/c.json"
HF_HUB_OFFLINE=1 "$CT" config check "$tmp/c.json" > "$tmp/out" 2> "$tmp/err"
grep -q "^hub: pretrained_model_name_or_path $ID: $S$" "$tmp/out" &&
  ok "config check shows the snapshot a hub id resolves to" || bad "config check: $(grep hub "$tmp/out") $(cat "$tmp/err")"
HF_HUB_OFFLINE=1 "$CT" hub path $ID --revision "$sha" > "$tmp/out" && [ "$(cat "$tmp/out")" = "$S" ] &&
  ok "hub path with the commit as revision" || bad "hub path: $(cat "$tmp/out")"
finish
