#!/usr/bin/env bash
# End-to-end: `ctuner storage` against a real S3-compatible server (s3rver,
# scripts/s3_server.sh) on 127.0.0.1, through tests/lib/s3_fault_proxy.py,
# which checks every request's AWS Signature V4 (s3rver 3.7.1 does not) and
# injects faults. Checks: put/get byte-exact (also against s3rver's own file),
# ls lists only under the prefix, ListObjectsV2 pagination (1,100 keys), a
# missing object, a wrong secret (one clear error, no secret in any output, no
# retries), each fault mode (500, 503, 429, slow, drop, reset, mixed) retried
# to success and seen in the proxy's log, a request that always fails with 500,
# path-style and virtual-hosted addressing, rm, usage errors. Needs node + npm
# (s3rver is installed into build/npm-tools); without them this test FAILS.
# Usage: tests/cli_s3.sh path/to/ctuner
. "$(dirname "$0")/lib/common.sh"
root="$(cd "$(dirname "$0")/.." && pwd)"
CT="$(cd "$(dirname "$CT")" && pwd)/$(basename "$CT")"
PY=python3
[ -x /usr/bin/python3 ] && PY=/usr/bin/python3
t_start=$(date +%s)

srv="$tmp/s3"
proxy_pid=""
cleanup() {
  [ -n "$proxy_pid" ] && kill "$proxy_pid" 2>/dev/null
  "$root/scripts/s3_server.sh" stop "$srv" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
[ -n "${CLI_S3_KEEP:-}" ] && trap '[ -n "$proxy_pid" ] && kill "$proxy_pid"; "$root/scripts/s3_server.sh" stop "$srv"; echo "kept $tmp"' EXIT

if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  bad "node and npm are needed to run the S3 server s3rver (scripts/deps.sh --golden)"
  exit 1
fi
# (the server's and the proxy's lives are bounded, generously: cleanup ends them)
if ! S3_SERVER_MAX_SECONDS=1800 "$root/scripts/s3_server.sh" start "$srv" bkt > "$tmp/port" 2> "$tmp/srv.err"; then
  bad "could not start s3rver (npm registry unreachable?):"
  sed 's/^/    /' "$tmp/srv.err" | tail -10
  exit 1
fi
sport=$(cat "$tmp/port")
ctl="$tmp/proxy.ctl"
plog="$tmp/proxy.log"
echo "mode=none" > "$ctl"
"$PY" "$root/tests/lib/s3_fault_proxy.py" --upstream "127.0.0.1:$sport" --port-file "$tmp/proxy.port" \
  --log "$plog" --control "$ctl" --slow-seconds 8 --max-seconds 1800 2> "$tmp/proxy.err" &
proxy_pid=$!
for _ in $(seq 1200); do
  [ -s "$tmp/proxy.port" ] && break
  sleep 0.05
done
pport=$(cat "$tmp/proxy.port" 2> /dev/null)
if [ -z "$pport" ]; then
  bad "the fault proxy did not start: $(cat "$tmp/proxy.err")"
  exit 1
fi
ok "s3rver on port $sport, fault proxy (SigV4 check) on port $pport"

unset AWS_SESSION_TOKEN AWS_ENDPOINT_URL AWS_ENDPOINT_URL_S3 AWS_REGION AWS_DEFAULT_REGION AWS_PROFILE
export AWS_ACCESS_KEY_ID=S3RVER AWS_SECRET_ACCESS_KEY=S3RVER
EP="http://127.0.0.1:$pport"
# timeout 4 s (a slow fault holds its reply 8 s): a request that is not faulted
# must not time out, or it is retried and the counts below are off; 2 s was
# within reach of s3rver's own answer on a loaded machine
S3=(--endpoint "$EP" --region us-east-1 --timeout 4 --retries 4)
st() { "$CT" storage "$@" "${S3[@]}"; }
setctl() { # a new control file (a new inode, so the proxy sees the change)
  echo "$*" > "$ctl.new" && mv "$ctl.new" "$ctl"
}
# Lines of the proxy log for requests whose target contains $1.
plog_for() { grep -F " $1" "$plog" | grep -F -v "control file" || true; }

# ---- round trip ----
head -c 300000 /dev/urandom > "$tmp/big.bin"
: > "$tmp/empty.bin"
if st put "$tmp/big.bin" s3://bkt/data/big.bin && st get s3://bkt/data/big.bin --out "$tmp/big.out" &&
  cmp -s "$tmp/big.bin" "$tmp/big.out"; then
  ok "put/get 300,000 random bytes byte-exact"
else
  bad "put/get round trip of 300,000 bytes"
fi
if cmp -s "$tmp/big.bin" "$srv/data/bkt/data/big.bin._S3rver_object"; then
  ok "s3rver's stored copy equals the file"
else
  bad "s3rver's stored copy ($srv/data/bkt/data/big.bin._S3rver_object) differs or is missing"
fi
if st get s3://bkt/data/big.bin > "$tmp/big.stdout" && cmp -s "$tmp/big.bin" "$tmp/big.stdout"; then
  ok "get to stdout byte-exact"
else
  bad "get to stdout"
fi
if st put "$tmp/empty.bin" s3://bkt/data/empty.bin && st get s3://bkt/data/empty.bin --out "$tmp/empty.out" &&
  [ -f "$tmp/empty.out" ] && [ ! -s "$tmp/empty.out" ]; then
  ok "empty object round trip"
else
  bad "empty object round trip"
fi
# Keys that need encoding in the path (space, plus, unicode): the signature covers them.
printf 'odd' > "$tmp/odd.txt"
if st put "$tmp/odd.txt" "s3://bkt/data/sp ace+plus=é.txt" && st get "s3://bkt/data/sp ace+plus=é.txt" --out "$tmp/odd.out" &&
  cmp -s "$tmp/odd.txt" "$tmp/odd.out"; then
  ok "a key with space, '+', '=' and UTF-8 round trips (signed path encoding)"
else
  bad "a key with space, '+', '=' and UTF-8: $(grep -F 'sig=' "$plog" | tail -1 | cut -c1-300)"
fi

# ---- ls only under the prefix ----
echo a > "$tmp/a.txt"
echo bb > "$tmp/b.txt"
st put "$tmp/a.txt" s3://bkt/pre/a.txt && st put "$tmp/b.txt" s3://bkt/pre/sub/b.txt &&
  st put "$tmp/a.txt" s3://bkt/prefix-sibling/c.txt && st put "$tmp/a.txt" s3://bkt/pre.txt ||
  bad "puts for the ls test"
got=$(st ls s3://bkt/pre 2> "$tmp/ls.err" | awk '{print $1 " " $2}' | tr '\n' ';')
if [ "$got" = "2 a.txt;3 sub/b.txt;" ]; then
  ok "ls s3://bkt/pre lists only pre/... (not pre.txt, prefix-sibling/)"
else
  bad "ls s3://bkt/pre printed '$got' (want '2 a.txt;3 sub/b.txt;') $(cat "$tmp/ls.err")"
fi
if plog_for "GET /bkt?" | grep -q "prefix=pre%2F" || plog_for "GET /bkt/?" | grep -q "prefix=pre%2F"; then
  ok "the listing asked the server for prefix pre/ only"
else
  bad "no ListObjectsV2 with prefix=pre%2F in the proxy log"
fi

# ---- pagination: 1,100 keys ----
mkdir -p "$tmp/many/x" "$tmp/many/y"
for i in $(seq 0 549); do
  echo "$i" > "$tmp/many/x/$i.txt"
  echo "y$i" > "$tmp/many/y/$i.txt"
done
if st sync "$tmp/many" s3://bkt/many --jobs 8 > "$tmp/sync.json" 2> "$tmp/sync.err" &&
  grep -q '"files": 1100' "$tmp/sync.json"; then
  ok "sync uploaded 1,100 files: $(cat "$tmp/sync.json")"
else
  bad "sync of 1,100 files: $(cat "$tmp/sync.json" "$tmp/sync.err" | head -3)"
fi
n=$(st ls s3://bkt/many 2> "$tmp/ls2.err" | wc -l)
pages=$(grep "list-type=2" "$plog" | grep -c "prefix=many%2F" || true)
conts=$(grep "list-type=2" "$plog" | grep "prefix=many%2F" | grep -c "continuation-token=" || true)
if [ "$n" = 1100 ] && [ "$conts" -ge 1 ]; then
  ok "ls lists all 1,100 keys over $pages ListObjectsV2 pages (continuation tokens used)"
else
  bad "ls of 1,100 keys: $n lines, $conts continued pages $(head -2 "$tmp/ls2.err")"
fi
if [ "$(st get s3://bkt/many/y/549.txt 2> /dev/null)" = "y549" ]; then
  ok "a synced file reads back"
else
  bad "many/y/549.txt does not read back"
fi

# ---- missing object ----
st get s3://bkt/data/nope.bin > "$tmp/nf.out" 2> "$tmp/nf.err"
rc=$?
if [ $rc = 1 ] && grep -qi "not found" "$tmp/nf.err" && grep -q "nope.bin" "$tmp/nf.err" && [ ! -s "$tmp/nf.out" ]; then
  ok "missing object: exit 1, '$(head -1 "$tmp/nf.err")'"
else
  bad "missing object: exit $rc, '$(cat "$tmp/nf.err")'"
fi

# ---- wrong secret ----
wrong="wRoNg-SeCrEt-$RANDOM$RANDOM"
token="sEsSiOn-ToKeN-$RANDOM$RANDOM"
before=$(grep -c "sig=SignatureDoesNotMatch" "$plog" || true)
AWS_SECRET_ACCESS_KEY=$wrong AWS_SESSION_TOKEN=$token "$CT" --log-level debug storage get s3://bkt/data/big.bin \
  "${S3[@]}" > "$tmp/ws.out" 2> "$tmp/ws.err"
rc=$?
after=$(grep -c "sig=SignatureDoesNotMatch" "$plog" || true)
if [ $rc = 1 ]; then ok "wrong secret: exit 1"; else bad "wrong secret: exit $rc"; fi
if grep -F -q -e "$wrong" -e "$token" "$tmp/ws.out" "$tmp/ws.err"; then
  bad "the secret or the session token appears in the output (--log-level debug)"
else
  ok "neither the secret nor the session token appears in stdout/stderr (--log-level debug)"
fi
if [ "$(grep -c "ctuner storage" "$tmp/ws.err")" = 1 ] && grep -q "bkt" "$tmp/ws.err" &&
  grep -q "127.0.0.1:$pport" "$tmp/ws.err" && grep -qi "signature\|secret" "$tmp/ws.err"; then
  ok "wrong secret: one error naming bucket and endpoint: $(grep "ctuner storage" "$tmp/ws.err" | cut -c1-200)"
else
  bad "wrong secret: expected one error line naming bkt and 127.0.0.1:$pport, got: $(tail -3 "$tmp/ws.err")"
fi
if [ $((after - before)) = 1 ]; then
  ok "wrong secret: one request (403 is not retried)"
else
  bad "wrong secret: $((after - before)) rejected requests (want 1, no retries of a 403)"
fi

# ---- fault modes, each retried to success ----
for m in 500 503 429 slow drop reset; do
  setctl "mode=$m first=1"
  key="faults/$m.bin"
  head -c 20000 /dev/urandom > "$tmp/f.bin"
  t0=$(date +%s.%N)
  if st put "$tmp/f.bin" "s3://bkt/$key" 2> "$tmp/f.err" && st get "s3://bkt/$key" --out "$tmp/f.out" 2>> "$tmp/f.err" &&
    cmp -s "$tmp/f.bin" "$tmp/f.out"; then
    r=ok
  else
    r=bad
  fi
  t1=$(date +%s.%N)
  # A slow reply is logged when the proxy answers, after the client gave up.
  for _ in $(seq 600); do
    nf=$(plog_for "/bkt/$key " | grep -c "fault=$m" || true)
    [ "$nf" -ge 2 ] && break
    sleep 0.1
  done
  nok=$(plog_for "/bkt/$key " | grep -c "attempt=2 fault=none status=20" || true)
  if [ $r = ok ] && [ "$nf" -ge 2 ] && [ "$nok" -ge 2 ]; then
    ok "fault $m: put and get succeed after retries ($nf faults injected, $(printf '%.1f' "$(echo "$t1 - $t0" | bc)") s)"
  else
    bad "fault $m: result $r, $nf faults injected, $nok retried to success; $(tail -2 "$tmp/f.err")"
    plog_for "/bkt/$key " | sed 's/^/    /' | tail -6
  fi
done
setctl "mode=none"

setctl "mode=mixed every=3"
# (each attempt lands on a faulted request with odds 1/3, so retries 10, not
# 4: five faults in a row for one of ~120 requests would happen in ~40% of runs)
if "$CT" storage bench s3://bkt/mixed --count 40 --size 1000 --pools 8,2 --endpoint "$EP" --region us-east-1 \
    --timeout 2 --retries 10 > "$tmp/mixed.json" 2> "$tmp/mixed.err" &&
  grep -q '"ratio"' "$tmp/mixed.json"; then
  nmix=$(grep -F "/bkt/mixed/" "$plog" | grep -c -v "fault=none" || true)
  kinds=$(grep -F "/bkt/mixed/" "$plog" | grep -o "fault=[a-z0-9]*" | sort -u | grep -v none | tr '\n' ' ')
  ok "mixed faults on every 3rd request: 40 parallel puts + get_many with pools 8 and 2 succeed, content checked ($nmix faults: $kinds)"
else
  bad "mixed faults: $(cat "$tmp/mixed.json" "$tmp/mixed.err" | tail -3)"
fi
setctl "mode=none"

# ---- a request that always fails ----
echo x > "$tmp/x.txt"
st put "$tmp/x.txt" s3://bkt/always500.txt 2> /dev/null
setctl "mode=500 first=-1 match=always500"
t0=$(date +%s)
"$CT" storage get s3://bkt/always500.txt --endpoint "$EP" --region us-east-1 --timeout 2 --retries 2 > /dev/null 2> "$tmp/a5.err"
rc=$?
tries=$(plog_for "GET /bkt/always500.txt " | grep -c "fault=500" || true)
if [ $rc = 1 ] && [ "$tries" = 3 ] && grep -q "500" "$tmp/a5.err" && grep -q "always500" "$tmp/a5.err" &&
  [ "$(wc -l < "$tmp/a5.err")" -le 2 ]; then
  ok "always 500: exit 1 after 1 + 2 retries: $(head -1 "$tmp/a5.err" | cut -c1-200)"
else
  bad "always 500: exit $rc after $tries attempts (want 1 after 3): $(head -3 "$tmp/a5.err")"
fi
setctl "mode=none"

# ---- addressing ----
PE="http://s3.localhost:$pport"
if "$CT" storage get s3://bkt/data/big.bin --endpoint "$PE" --region us-east-1 --addressing path --out "$tmp/p.out" &&
  cmp -s "$tmp/big.bin" "$tmp/p.out" && tail -1 "$plog" | grep -q "GET /bkt/data/big.bin host=s3.localhost:$pport "; then
  ok "path-style: GET /bkt/data/big.bin, Host s3.localhost:$pport"
else
  bad "path-style addressing: $(tail -1 "$plog")"
fi
if "$CT" storage get s3://bkt/data/big.bin --endpoint "$PE" --region us-east-1 --addressing virtual --out "$tmp/v.out" &&
  cmp -s "$tmp/big.bin" "$tmp/v.out" && tail -1 "$plog" | grep -q "GET /data/big.bin host=bkt.s3.localhost:$pport "; then
  ok "virtual-hosted: GET /data/big.bin, Host bkt.s3.localhost:$pport"
else
  bad "virtual-hosted addressing: $(tail -1 "$plog")"
fi
got=$("$CT" storage ls s3://bkt/pre --endpoint "$PE" --region us-east-1 --addressing virtual 2> /dev/null | wc -l)
if [ "$got" = 2 ]; then ok "virtual-hosted ls"; else bad "virtual-hosted ls: $got lines"; fi

# ---- rm ----
if st rm s3://bkt/pre/a.txt && ! st get s3://bkt/pre/a.txt > /dev/null 2>&1 && [ ! -e "$srv/data/bkt/pre/a.txt._S3rver_object" ] &&
  st rm s3://bkt/pre/a.txt; then
  ok "rm deletes; rm of a missing object succeeds"
else
  bad "rm"
fi

# ---- usage and local paths ----
"$CT" storage get > /dev/null 2>&1
r1=$?
"$CT" storage ls s3://bkt --secret-key x > /dev/null 2> "$tmp/u.err"
r2=$?
"$CT" storage get s3://bkt --endpoint "$EP" > /dev/null 2>&1
r3=$?
if [ $r1 = 2 ] && [ $r2 = 2 ] && [ $r3 = 2 ] && grep -q AWS_SECRET_ACCESS_KEY "$tmp/u.err"; then
  ok "usage errors exit 2 (no credential flags)"
else
  bad "usage errors: exits $r1 $r2 $r3"
fi
mkdir -p "$tmp/loc"
if "$CT" storage put "$tmp/big.bin" "$tmp/loc/b.bin" && "$CT" storage get "$tmp/loc/b.bin" --out "$tmp/loc.out" &&
  cmp -s "$tmp/big.bin" "$tmp/loc.out" && [ "$("$CT" storage ls "$tmp/loc" | awk '{print $2}')" = b.bin ]; then
  ok "local paths: put/get/ls"
else
  bad "local paths"
fi

# The proxy checked every signature: no request but the wrong-secret one was rejected.
nsig=$(grep -c "sig=" "$plog" || true)
if [ "$nsig" = 1 ]; then
  ok "every other request's SigV4 signature verified by the proxy ($(grep -c "seq=" "$plog") requests)"
else
  bad "$nsig requests failed the proxy's SigV4 check (want 1, the wrong secret):"
  grep "sig=" "$plog" | grep -v "$wrong" | head -3 | cut -c1-400 | sed 's/^/    /'
fi
echo "# $(($(date +%s) - t_start)) s"
exit $fail
