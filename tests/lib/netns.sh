# Sourced by the network-namespace tests (netns_dist.sh, netns_launch.sh):
# CT (absolute) from $1, $tmp, namespace names $A and $B (PREFIX + a/b +
# pid) removed at exit with $tmp, ok/bad reporting, no LSan for Open MPI's
# start-up allocations, and exit 77 (ctest's skip) where namespaces cannot be
# made. Usage: netns_setup PREFIX "$@"
netns_setup() {
  set -u
  CT=$(readlink -f "${2:?usage: $0 path/to/ctuner}")
  tmp=$(mktemp -d)
  A=${1}a$$
  B=${1}b$$
  trap 'ip netns del "$A" 2>/dev/null; ip netns del "$B" 2>/dev/null; rm -rf "$tmp"' EXIT
  fail=0
  export ASAN_OPTIONS=${ASAN_OPTIONS:-}:detect_leaks=0
  if ! ip netns add "$A" 2>"$tmp/ns.err"; then
    echo "SKIP - cannot create network namespaces here: $(cat "$tmp/ns.err") (needs root and CAP_SYS_ADMIN)"
    exit 77
  fi
}
ok() { echo "ok - $*"; }
bad() { echo "FAIL - $*"; fail=1; }
