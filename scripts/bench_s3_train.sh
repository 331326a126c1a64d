#!/usr/bin/env bash
# Training from a bucket against local disk: the same synthetic dataset
# (IMAGES images of 32x32 with captions) on disk and in s3rver behind the
# fault proxy adding LATENCY_MS to every request; prints the cache build time
# (`ctuner cache`: discovery, latent and text caches, the caches in the
# bucket for the S3 run) and the data wait of STEPS training steps, for each.
#   scripts/bench_s3_train.sh path/to/ctuner     (make bench-s3 runs it)
set -euo pipefail
CT=${1:?usage: $0 path/to/ctuner}
root="$(cd "$(dirname "$0")/.." && pwd)"
images=${IMAGES:-512} steps=${STEPS:-40} latency_ms=${LATENCY_MS:-20}
. "$root/tests/lib/s3_env.sh"
tmp=$(mktemp -d)
trap 's3_stop "$tmp/s3"; rm -rf "$tmp"' EXIT
delay=$(awk -v m="$latency_ms" 'BEGIN{printf "%.4f", m / 1000}')
s3_start "$tmp/s3" bench
s3_proxy "$tmp/s3" --mode slow --first -1 --slow-seconds "$delay" --max-seconds 3600 --no-verify --log "$tmp/proxy.log"
port=$S3_PORT
ep="http://127.0.0.1:$S3_PROXY_PORT"

"$CT" dataset synth --out "$tmp/data" --count "$images" --seed 1 --size 32x32 >/dev/null
"$CT" storage sync "$tmp/data" s3://bench/shapes --endpoint "http://127.0.0.1:$port" >/dev/null
cat > "$tmp/local.json" <<JSON
[{"id": "shapes", "type": "local", "instance_data_dir": "$tmp/data", "caption_strategy": "textfile", "text_embeds": "t"},
 {"id": "t", "type": "local", "dataset_type": "text_embeds", "default": true, "cache_dir": "$tmp/textcache"}]
JSON
keys="\"aws_bucket_name\": \"bench\", \"aws_endpoint_url\": \"$ep\", \"aws_max_pool_connections\": 32"
cat > "$tmp/s3.json" <<JSON
[{"id": "shapes", "type": "aws", $keys, "aws_data_prefix": "shapes", "caption_strategy": "textfile",
  "cache_dir_vae": "cache/vae", "text_embeds": "t"},
 {"id": "t", "type": "aws", $keys, "aws_data_prefix": "caches/text", "dataset_type": "text_embeds", "default": true}]
JSON
base=(--preset=tiny --resolution=32 --train_batch_size=8 --disable_validation=true --seed=1
      --checkpoint_step_interval=0 --max_train_steps="$steps")
echo "bench_s3_train: $images images, $steps steps of batch 8 (tiny preset), $latency_ms ms added per S3 request; $(nproc) cores" >&2
for kind in local s3; do
  t0=$(date +%s.%N)
  "$CT" cache "${base[@]}" --data_backend_config="$tmp/$kind.json" --output_dir="$tmp/out-$kind" >/dev/null 2>"$tmp/$kind.cache.err" || { tail -3 "$tmp/$kind.cache.err"; exit 1; }
  [ -n "${VERBOSE:-}" ] && cat "$tmp/$kind.cache.err" >&2
  t1=$(date +%s.%N)
  "$CT" train "${base[@]}" --data_backend_config="$tmp/$kind.json" --output_dir="$tmp/out-$kind" \
    >/dev/null 2>"$tmp/$kind.err"
  wait_line=$(grep -o 'data: waited .*' "$tmp/$kind.err" | tail -1)
  printf '{"storage": "%s", "cache_build_s": %.2f, "train": "%s"}\n' "$kind" "$(awk -v a="$t0" -v b="$t1" 'BEGIN{print b - a}')" "$wait_line"
done
if diff <(sed 's/"seconds".*//' "$tmp/out-local/metrics.jsonl") <(sed 's/"seconds".*//' "$tmp/out-s3/metrics.jsonl") >/dev/null; then
  echo "losses: identical ($steps steps)"
else
  echo "losses: DIFFER"
  exit 1
fi
