#!/usr/bin/env bash
# S3 transfer figures (docs/performance.md, "S3 storage"): fetching 2,000
# objects of 4 KiB with ct_storage_get_many over a pool of 32 connections vs 1
# (`ctuner storage bench`), against s3rver on 127.0.0.1 (scripts/s3_server.sh):
#  1. direct: the client and s3rver (one node process) share the machine's cores;
#  2. through tests/lib/s3_fault_proxy.py adding LATENCY_MS (default 20 ms) to
#     every request, standing in for the round trip to a remote bucket.
# Each prints one JSON line: objects/s per pool size and their ratio.
#   scripts/bench_s3.sh [path/to/ctuner]   (env: COUNT, SIZE, POOLS, LATENCY_MS)
set -euo pipefail
CT=$(readlink -f "${1:-build/ctuner}")
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
count=${COUNT:-2000} size=${SIZE:-4096} pools=${POOLS:-32,1} latency_ms=${LATENCY_MS:-20}
. tests/lib/s3_env.sh
tmp=$(mktemp -d)
trap 's3_stop "$tmp/s3"; rm -rf "$tmp"' EXIT
S3_SERVER_MAX_SECONDS=1800 s3_start "$tmp/s3" bench
port=$S3_PORT
echo "bench_s3: $count objects of $size bytes, pools $pools; s3rver on 127.0.0.1:$port; $(nproc) cores" >&2

echo "# direct to s3rver"
"$CT" storage bench s3://bench/objects --count "$count" --size "$size" --pools "$pools" \
  --endpoint "http://127.0.0.1:$port" --region us-east-1

if [ "$latency_ms" != 0 ]; then
  delay=$(awk -v m="$latency_ms" 'BEGIN{printf "%.4f", m / 1000}')
  s3_proxy "$tmp/s3" --mode slow --first -1 --slow-seconds "$delay" --max-seconds 1800
  echo "# through a proxy adding $latency_ms ms to every request"
  "$CT" storage bench s3://bench/objects --count "$count" --size "$size" --pools "$pools" \
    --endpoint "http://127.0.0.1:$S3_PROXY_PORT" --region us-east-1
fi
