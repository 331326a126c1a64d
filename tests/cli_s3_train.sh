#!/usr/bin/env bash
# Training with S3 storage end to end (docs/storage.md), against s3rver (npm,
# started here on 127.0.0.1) behind tests/lib/s3_fault_proxy.py, which checks
# every request's Signature V4 and injects faults:
#  - the same images and captions on local disk and in a bucket (uploaded by
#    `ctuner storage sync`), with the latent and text caches in the bucket,
#    train to exactly the same losses — also while the proxy answers every 9th
#    request with a 500/503/429/slow/drop/reset fault;
#  - output_dir s3://bucket/prefix: checkpoints mirrored with .guard last,
#    checkpoints_total_limit applied in the bucket, and a resume on an empty
#    local directory pulls the newest checkpoint and continues exactly as an
#    uninterrupted run;
#  - a wrong secret: one clear error, the secret nowhere in the output.
# Needs node + npm (s3rver); without them this test FAILS, it does not skip.
# Usage: tests/cli_s3_train.sh path/to/ctuner
. "$(dirname "$0")/lib/common.sh"
. "$(dirname "$0")/lib/s3_env.sh"
export ASAN_OPTIONS=${ASAN_OPTIONS:-}:detect_leaks=0
srv="$tmp/s3"
trap 's3_stop "$srv"; rm -rf "$tmp"' EXIT
[ -n "${KEEP_TMP:-}" ] && trap 's3_stop "$srv"' EXIT

echo "mode=none" > "$tmp/proxy.ctl"
s3_start "$srv" train && s3_proxy "$srv" --log "$tmp/proxy.log" --control "$tmp/proxy.ctl" \
  --credentials S3RVER:S3RVER --max-seconds 900 || { bad "s3rver and the fault proxy did not start"; exit 1; }
ep="http://127.0.0.1:$S3_PROXY_PORT"

# The storage API itself against the server, through the signature check:
# put/get/range/head/delete, odd keys, 1,100 keys over two list pages, path-style
# and virtual-hosted (Host train.s3.localhost:PORT).
tests_bin="$(dirname "$CT")/ct_tests"
if [ -x "$tests_bin" ]; then
  for style in path virtual; do
    host=127.0.0.1
    [ $style = virtual ] && host=s3.localhost
    if CT_S3_TEST_ENDPOINT="http://$host:$S3_PROXY_PORT" CT_S3_TEST_BUCKET=train CT_S3_TEST_ADDRESSING=$style \
        "$tests_bin" storage s3_live >"$tmp/live.out" 2>&1 && ! grep -q '^\[ SKIP \]' "$tmp/live.out"; then
      ok "storage.s3_live ($style-style)"
    else
      bad "storage.s3_live ($style-style): $(grep -m3 'CHECK\|REQUIRE' "$tmp/live.out")"
    fi
  done
else
  bad "$tests_bin not found (the storage API test runs from the build directory)"
fi

# Two aspect buckets of synthetic images with captions.
"$CT" dataset synth --out "$tmp/data/sq" --count 24 --seed 1 --size 32x32 >/dev/null &&
  "$CT" dataset synth --out "$tmp/data/wide" --count 24 --seed 2 --size 48x32 >/dev/null ||
  { bad "dataset synth"; exit 1; }
if "$CT" storage sync "$tmp/data" s3://train/datasets/shapes --endpoint "$ep" >"$tmp/sync.out" 2>&1; then
  n=$("$CT" storage ls s3://train/datasets/shapes --endpoint "$ep" | wc -l)
  [ "$n" = 96 ] && ok "dataset uploaded: 48 images + 48 captions" || bad "bucket holds $n objects, not 96"
else
  bad "storage sync: $(tail -3 "$tmp/sync.out")"
fi

cat > "$tmp/local.json" <<JSON
[{"id": "shapes", "type": "local", "instance_data_dir": "$tmp/data", "caption_strategy": "textfile",
  "text_embeds": "text"},
 {"id": "text", "type": "local", "dataset_type": "text_embeds", "default": true, "cache_dir": "$tmp/textcache"}]
JSON
s3keys="\"aws_bucket_name\": \"train\", \"aws_endpoint_url\": \"$ep\", \"aws_access_key_id\": \"{env:AWS_ACCESS_KEY_ID}\",
  \"aws_secret_access_key\": \"{env:AWS_SECRET_ACCESS_KEY}\", \"aws_max_pool_connections\": 8, \"aws_max_retries\": 8"
cat > "$tmp/s3.json" <<JSON
[{"id": "shapes", "type": "aws", $s3keys, "aws_data_prefix": "datasets/shapes", "caption_strategy": "textfile",
  "cache_dir_vae": "cache/vae", "text_embeds": "text"},
 {"id": "text", "type": "aws", $s3keys, "aws_data_prefix": "caches", "dataset_type": "text_embeds", "default": true,
  "cache_dir": "text"}]
JSON
base=(--preset=tiny --resolution=16 --aspect_bucket_alignment=8 --train_batch_size=4 --learning_rate=1e-3
      --disable_validation=true --seed=3 --checkpoint_step_interval=5 --max_train_steps=12)
losses() { sed 's/"seconds".*//' "$1"; }

"$CT" train "${base[@]}" --data_backend_config="$tmp/local.json" --output_dir="$tmp/out-local" \
  >/dev/null 2>"$tmp/local.err" || bad "local run: $(tail -3 "$tmp/local.err")"
if "$CT" train "${base[@]}" --data_backend_config="$tmp/s3.json" --output_dir="$tmp/out-s3" \
    >/dev/null 2>"$tmp/s3.err"; then
  if diff <(losses "$tmp/out-local/metrics.jsonl") <(losses "$tmp/out-s3/metrics.jsonl") >/dev/null; then
    ok "bucket and local disk: the same 12 losses"
  else
    bad "losses differ between the bucket and local disk"
  fi
  nv=$("$CT" storage ls s3://train/datasets/shapes/cache/vae --endpoint "$ep" | wc -l)
  nt=$("$CT" storage ls s3://train/caches/text --endpoint "$ep" | wc -l)
  [ "$nv" -ge 48 ] && ok "latent cache in the bucket ($nv objects)" || bad "latent cache in the bucket: $nv objects"
  [ "$nt" -ge 1 ] && ok "text cache in the bucket ($nt objects)" || bad "text cache in the bucket: $nt objects"
  if grep -qr S3RVER "$tmp/out-s3"; then bad "a credential was written to output_dir"; else ok "no credential in output_dir"; fi
else
  bad "bucket run: $(tail -3 "$tmp/s3.err")"
fi

# The same with faults: every 9th request fails once in one of six ways; the
# caches in the bucket are dropped first so the faults hit the cache build too.
"$CT" storage ls s3://train/datasets/shapes/cache --endpoint "$ep" | awk '{print $2}' |
  while read -r k; do "$CT" storage rm "s3://train/datasets/shapes/$k" --endpoint "$ep"; done
echo "mode=mixed every=9 slow_seconds=3" > "$tmp/proxy.ctl"
sed 's/"aws_max_retries": 8/"aws_max_retries": 8, "aws_request_timeout": 1.5/' "$tmp/s3.json" > "$tmp/s3f.json"
if "$CT" train "${base[@]}" --data_backend_config="$tmp/s3f.json" \
    --output_dir="$tmp/out-fault" >/dev/null 2>"$tmp/fault.err"; then
  faults=$(grep -c 'fault=[^n]' "$tmp/proxy.log")
  kinds=$(grep -o 'fault=[^n ][^ ]*' "$tmp/proxy.log" | sort -u | wc -l)
  [ "$faults" -ge 10 ] && [ "$kinds" = 6 ] && ok "$faults faults of 6 kinds injected" ||
    bad "only $faults faults of $kinds kinds were injected"
  if diff <(losses "$tmp/out-local/metrics.jsonl") <(losses "$tmp/out-fault/metrics.jsonl") >/dev/null; then
    ok "with injected faults: the same losses"
  else
    bad "losses differ under faults"
  fi
else
  bad "run under faults: $(tail -3 "$tmp/fault.err")"
fi
echo "mode=none" > "$tmp/proxy.ctl"

# output_dir in the bucket: checkpoints 5 and 10 (limit 1), then a resume on an
# empty local directory continues to step 12 exactly as the uninterrupted run.
export AWS_ENDPOINT_URL="$ep"
# a file of another run's checkpoint-10 (say a rank's fragment) is in the way
echo stale > "$tmp/stale.bin"
"$CT" storage put "$tmp/stale.bin" s3://train/runs/r1/checkpoint-10/zero/rank-3-of-4.safetensors --endpoint "$ep"
if "$CT" train "${base[@]}" --data_backend_config="$tmp/local.json" --max_train_steps=10 \
    --output_dir=s3://train/runs/r1 --output_dir_local="$tmp/r1a" --checkpoints_total_limit=1 \
    >/dev/null 2>"$tmp/r1.err"; then
  keys=$("$CT" storage ls s3://train/runs/r1 --endpoint "$ep" | awk '{print $2}')
  echo "$keys" | grep -qx 'checkpoint-10/.guard' && echo "$keys" | grep -qx 'checkpoint-10/model.safetensors' &&
    ok "checkpoint-10 mirrored with its .guard" || bad "remote keys: $(echo $keys)"
  if echo "$keys" | grep -q '^checkpoint-5/'; then bad "checkpoint-5 still in the bucket (limit 1)"
  else ok "checkpoints_total_limit applied in the bucket"; fi
  echo "$keys" | grep -qx 'metrics.jsonl' && ok "metrics.jsonl uploaded" || bad "no metrics.jsonl in the bucket"
  if echo "$keys" | grep -q 'rank-3-of-4'; then bad "a stale file of checkpoint-10 stayed under its new .guard"
  else ok "a stale file of the same step was removed before the .guard"; fi
  if "$CT" train "${base[@]}" --data_backend_config="$tmp/local.json" --output_dir=s3://train/runs/r1 \
      --output_dir_local="$tmp/r1b" >/dev/null 2>"$tmp/r1b.err"; then
    grep -q "pulled checkpoint-10" "$tmp/r1b.err" && ok "resume pulled checkpoint-10 into an empty directory" ||
      bad "no pull in the log"
    if diff <(losses "$tmp/out-local/metrics.jsonl" | tail -2) <(losses "$tmp/r1b/metrics.jsonl" | tail -2) >/dev/null; then
      ok "steps 11-12 after the pull equal the uninterrupted run"
    else
      bad "resumed losses differ: $(losses "$tmp/r1b/metrics.jsonl" | tail -2 | tr '\n' ' ')"
    fi
  else
    bad "resume from the bucket: $(tail -3 "$tmp/r1b.err")"
  fi
else
  bad "output_dir s3: $(tail -3 "$tmp/r1.err")"
fi
# a newer checkpoint of another run in the prefix: rotation keeps this run's
printf complete > "$tmp/guard"
"$CT" storage put "$tmp/guard" s3://train/runs/r2/checkpoint-1000/.guard --endpoint "$ep"
if "$CT" train "${base[@]}" --data_backend_config="$tmp/local.json" --max_train_steps=5 --resume_from_checkpoint=none \
    --output_dir=s3://train/runs/r2 --output_dir_local="$tmp/r2" --checkpoints_total_limit=1 >/dev/null 2>"$tmp/r2.err"; then
  keys=$("$CT" storage ls s3://train/runs/r2 --endpoint "$ep" | awk '{print $2}')
  echo "$keys" | grep -qx 'checkpoint-5/.guard' && grep -q "newer than checkpoint-5" "$tmp/r2.err" &&
    ok "rotation keeps the checkpoint just uploaded and warns of a newer one" || bad "rotation: $(echo $keys)"
else
  bad "run beside a newer checkpoint: $(tail -3 "$tmp/r2.err")"
fi
unset AWS_ENDPOINT_URL

# A caption over the 1 MiB bound counts against its image (no caption); the
# rest of the dataset loads.
mkdir -p "$tmp/odd"
cp "$tmp/data/sq/000001.png" "$tmp/data/sq/000002.png" "$tmp/data/sq/000003.png" "$tmp/odd/"
for i in 1 2 3; do echo "a caption" > "$tmp/odd/00000$i.txt"; done
head -c 1200000 /dev/zero | tr '\0' 'a' > "$tmp/odd/000002.txt"
"$CT" storage sync "$tmp/odd" s3://train/odd --endpoint "$ep" >/dev/null
cat > "$tmp/odd.json" <<JSON
[{"id": "odd", "type": "aws", $s3keys, "aws_data_prefix": "odd", "caption_strategy": "textfile"}]
JSON
if out=$("$CT" cache "${base[@]}" --train_batch_size=1 --data_backend_config="$tmp/odd.json" \
    --output_dir="$tmp/out-odd" 2>"$tmp/odd.err"); then
  echo "$out" | "$S3_PY" -c 'import json,sys; d=json.load(sys.stdin); assert d["images"] == 2 and d["skipped"]["no_caption"] == 1, d' &&
    ok "a caption over 1 MiB drops its image only (2 of 3 kept)" || bad "odd dataset: $out"
else
  bad "an oversized caption ended discovery: $(tail -2 "$tmp/odd.err")"
fi

# A wrong secret: one clear error naming the bucket and the endpoint, no secret.
secret="Wr0ngSecretValue/abc"
if AWS_SECRET_ACCESS_KEY="$secret" "$CT" train "${base[@]}" --data_backend_config="$tmp/s3.json" \
    --output_dir="$tmp/out-bad" >"$tmp/bad.out" 2>"$tmp/bad.err"; then
  bad "a wrong secret trained"
else
  grep -q "SignatureDoesNotMatch" "$tmp/bad.err" && grep -q "s3://train/" "$tmp/bad.err" &&
    grep -q "aws_secret_access_key" "$tmp/bad.err" && ok "wrong secret: $(grep -m1 SignatureDoesNotMatch "$tmp/bad.err" | cut -c1-160)…" ||
    bad "wrong secret message: $(tail -2 "$tmp/bad.err")"
  n=$(grep -c "SignatureDoesNotMatch" "$tmp/bad.err")
  [ "$n" -le 2 ] && ok "the error is reported once ($n line(s))" || bad "the error is repeated $n times"
  if grep -rq "$secret" "$tmp/bad.out" "$tmp/bad.err" "$tmp/out-bad" 2>/dev/null; then bad "the secret appears in the output"
  else ok "the secret appears nowhere in stdout, stderr or output_dir"; fi
fi
# image_embeds (issue 21): local images whose latents go where the user put them, the
# cache_dir_vae of an S3 image_embeds dataset, {model_family} and {id} filled as
# SimpleTuner fills them; before, they went to a local directory named "vae/{model_family}/{id}".
cat > "$tmp/ie.json" <<JSON
[{"id": "shapes", "type": "local", "instance_data_dir": "$tmp/data", "caption_strategy": "textfile",
  "image_embeds": "lat", "cache_dir_vae": "vae/{model_family}/{id}"},
 {"id": "lat", "type": "aws", $s3keys, "aws_data_prefix": "embeds", "dataset_type": "image_embeds"},
 {"id": "text", "type": "local", "dataset_type": "text_embeds", "default": true, "cache_dir": "$tmp/ie-text"}]
JSON
ct_abs="$(cd "$(dirname "$CT")" && pwd)/$(basename "$CT")"
if (cd "$tmp" && "$ct_abs" cache "${base[@]}" --data_backend_config="$tmp/ie.json" --output_dir="$tmp/out-ie" \
    >/dev/null 2>"$tmp/ie.err"); then
  n=$("$CT" storage ls s3://train/embeds/vae/flux/shapes --endpoint "$ep" | wc -l)
  [ "$n" -ge 48 ] && [ ! -e "$tmp/vae" ] && ok "image_embeds: $n latents in s3://train/embeds/vae/flux/shapes, none local" ||
    bad "image_embeds: $n latents in the bucket; local: $(ls "$tmp" | tr '\n' ' ')"
else
  bad "image_embeds run: $(tail -3 "$tmp/ie.err")"
fi
exit $fail
