# Sourced by the end-to-end tests (tests/cli_*.sh): the ctuner path from $1, a
# temporary directory removed at exit, and TAP-like ok/bad reporting; a test
# ends with `exit $fail`. (Not a test itself: ctest runs tests/*.sh only.)
set -u
CT=${1:?usage: $0 path/to/ctuner}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
ok() { echo "ok - $*"; }
bad() { echo "FAIL - $*"; fail=1; }
