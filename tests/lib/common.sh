# Sourced by the end-to-end tests (tests/cli_*.sh): the ctuner path from $1, a
# temporary directory removed at exit, and TAP-like ok/bad/skip reporting; a
# test ends with `exit $fail`, or with `finish` when it can skip.
# (Not a test itself: ctest runs tests/*.sh only.)
#
# skip "why": a part that cannot run here (no torch, no mpirun), never reported
# as ok. finish prints the closing line "N ok, F failed, S skipped" and exits
# 1 on a failure, 77 (ctest's SKIP_RETURN_CODE: "Skipped") when nothing but
# skips happened, else 0. CT_NO_SKIP=1 makes every skip a failure (a machine
# that must run everything).
set -u
CT=${1:?usage: $0 path/to/ctuner}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
n_ok=0
n_bad=0
n_skip=0
ok() { echo "ok - $*"; n_ok=$((n_ok + 1)); }
bad() { echo "FAIL - $*"; fail=1; n_bad=$((n_bad + 1)); }
skip() {
  echo "skip - $*"
  n_skip=$((n_skip + 1))
  if [ -n "${CT_NO_SKIP:-}" ]; then bad "CT_NO_SKIP is set and this was skipped: $*"; fi
  return 0
}
# kill_serve_runs ROOT: ends the runs `ctuner serve` started under ROOT that its
# serve.json still records as running (their own sessions outlive the server):
# an exit trap's, so that a test that failed mid-run leaves no training behind
kill_serve_runs() {
  local p
  for p in $(/usr/bin/python3 -c '
import glob, json, sys
for f in glob.glob(sys.argv[1] + "/*/serve.json"):
    try: m = json.load(open(f))
    except Exception: continue
    if m.get("exit_code") is None and m.get("pid", 0) > 0: print(m["pid"])' "$1" 2>/dev/null); do
    kill -TERM -- "-$p" 2>/dev/null
  done
}
finish() {
  echo "$n_ok ok, $n_bad failed, $n_skip skipped"
  [ "$fail" != 0 ] && exit 1
  [ "$n_ok" = 0 ] && [ "$n_skip" -gt 0 ] && exit 77
  exit 0
}
