#!/usr/bin/env bash
# A local S3-compatible server for tests and benchmarks: the npm package
# s3rver (pinned; installed into build/npm-tools when missing, test-only).
#   scripts/s3_server.sh start DIR [BUCKET...]   start on 127.0.0.1, a free port; prints the port
#   scripts/s3_server.sh stop DIR                stop the server started with DIR
# DIR/data holds the objects (DIR/data/BUCKET/KEY._S3rver_object); DIR/port,
# DIR/pid and DIR/s3rver.log say where it listens and what it said. Buckets
# (default: "bucket") are created at start. Credentials: access key S3RVER,
# secret S3RVER. Note that s3rver 3.7.1 checks only that the access key
# exists, not the Signature V4 itself: tests/lib/s3_fault_proxy.py checks it.
# It runs with --service-endpoint localhost, so virtual-hosted requests work
# as Host BUCKET.s3.localhost:PORT (endpoint http://s3.localhost:PORT);
# BUCKET.localhost:PORT does not (s3rver takes the whole name as the bucket).
# Path-style works with any of 127.0.0.1, localhost, s3.localhost.
# The server exits by itself after S3_SERVER_MAX_SECONDS (default 3600).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
tools="$root/build/npm-tools"
ver=3.7.1

die() {
  echo "s3_server.sh: $*" >&2
  exit 1
}

install_s3rver() {
  local have
  have=$(node -e "try{console.log(require('$tools/node_modules/s3rver/package.json').version)}catch(e){}" 2>/dev/null || true)
  [ "$have" = "$ver" ] && return 0
  command -v npm >/dev/null || die "npm not found (install node + npm: scripts/deps.sh --golden)"
  mkdir -p "$tools"
  npm install --prefix "$tools" --no-audit --no-fund --silent --save-exact "s3rver@$ver" >&2 ||
    die "npm could not install s3rver@$ver (is the npm registry reachable?)"
}

stop() {
  local dir=$1 pid
  [ -f "$dir/pid" ] || return 0
  pid=$(cat "$dir/pid")
  if kill -0 "$pid" 2>/dev/null; then
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 50); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$dir/pid" "$dir/port"
}

start() {
  local dir=$1
  shift
  local buckets=("$@")
  [ ${#buckets[@]} -gt 0 ] || buckets=(bucket)
  command -v node >/dev/null || die "node not found (install node + npm: scripts/deps.sh --golden)"
  install_s3rver
  mkdir -p "$dir/data"
  dir="$(cd "$dir" && pwd)"
  stop "$dir"
  local args=(-d "$dir/data" -a 127.0.0.1 -p 0 --silent --service-endpoint localhost)
  for b in "${buckets[@]}"; do args+=(--configure-bucket "$b"); done
  # `timeout` passes a TERM on to node and bounds the server's life.
  timeout --kill-after=5 "${S3_SERVER_MAX_SECONDS:-3600}" \
    node --openssl-legacy-provider "$tools/node_modules/s3rver/bin/s3rver.js" "${args[@]}" > "$dir/s3rver.log" 2>&1 < /dev/null &
  local pid=$!
  echo "$pid" > "$dir/pid"
  local port=""
  for _ in $(seq 1200); do # 2 minutes (node's start on a loaded machine)
    port=$(sed -n 's/^S3rver listening on [^:]*:\([0-9][0-9]*\).*/\1/p' "$dir/s3rver.log")
    [ -n "$port" ] && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  if [ -z "$port" ]; then
    stop "$dir"
    die "s3rver did not start: $(tail -5 "$dir/s3rver.log")"
  fi
  # Wait until it answers (an unsigned request to the service root: 200 or 403).
  local code=000
  for _ in $(seq 100); do
    code=$(curl -s -o /dev/null -m 2 -w '%{http_code}' "http://127.0.0.1:$port/" || true)
    [ "$code" != 000 ] && break
    sleep 0.1
  done
  if [ "$code" = 000 ]; then
    stop "$dir"
    die "s3rver on port $port does not answer"
  fi
  echo "$port" > "$dir/port"
  echo "$port"
}

case "${1:-}" in
  start)
    [ $# -ge 2 ] || die "usage: s3_server.sh start DIR [BUCKET...]"
    shift
    start "$@"
    ;;
  stop)
    [ $# -eq 2 ] || die "usage: s3_server.sh stop DIR"
    stop "$2"
    ;;
  *)
    echo "usage: scripts/s3_server.sh start DIR [BUCKET...] | stop DIR" >&2
    exit 2
    ;;
esac
