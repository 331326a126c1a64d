# Sourced by the S3 tests and benchmarks (tests/cli_s3_train.sh,
# scripts/bench_s3*.sh): s3rver (scripts/s3_server.sh) on 127.0.0.1 and the
# fault proxy (tests/lib/s3_fault_proxy.py) in front of it. (Not a test
# itself: ctest runs tests/*.sh only.)
#   s3_start DIR BUCKET...   start s3rver with the buckets; sets S3_PORT
#   s3_proxy DIR [ARGS...]   start the proxy in front of it; sets S3_PROXY_PORT, S3_PROXY_PID
#   s3_stop DIR              stop both
# Credentials: S3RVER / S3RVER, exported here (and no other AWS_* setting).
S3_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
S3_PY=python3
[ -x /usr/bin/python3 ] && S3_PY=/usr/bin/python3
S3_PROXY_PID=""
unset AWS_SESSION_TOKEN AWS_ENDPOINT_URL AWS_ENDPOINT_URL_S3 AWS_PROFILE AWS_REGION AWS_DEFAULT_REGION
export AWS_ACCESS_KEY_ID=S3RVER AWS_SECRET_ACCESS_KEY=S3RVER

s3_start() {
  local dir=$1
  shift
  mkdir -p "$dir"
  S3_PORT=$("$S3_ROOT/scripts/s3_server.sh" start "$dir" "$@" 2>"$dir/start.err") || {
    echo "s3rver did not start (node/npm and the npm registry are needed): $(tail -3 "$dir/start.err")" >&2
    return 1
  }
}

s3_proxy() {
  local dir=$1
  shift
  rm -f "$dir/proxy.port"
  "$S3_PY" "$S3_ROOT/tests/lib/s3_fault_proxy.py" --upstream "127.0.0.1:$S3_PORT" --port-file "$dir/proxy.port" "$@" 2>>"$dir/proxy.err" &
  S3_PROXY_PID=$!
  for _ in $(seq 1200); do # (a minute: python's start on a loaded machine)
    [ -s "$dir/proxy.port" ] && break
    sleep 0.05
  done
  [ -s "$dir/proxy.port" ] || { echo "the fault proxy did not start" >&2; return 1; }
  S3_PROXY_PORT=$(cat "$dir/proxy.port")
}

s3_stop() {
  [ -n "$S3_PROXY_PID" ] && kill "$S3_PROXY_PID" 2>/dev/null
  S3_PROXY_PID=""
  "$S3_ROOT/scripts/s3_server.sh" stop "$1" 2>/dev/null || true
}
