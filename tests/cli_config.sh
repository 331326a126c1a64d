#!/usr/bin/env bash
# End-to-end: `ctuner config check` on real files collected from public
# repositories (tests/data/realcfg/{simpletuner,databackend}, SOURCES.md says
# where each came from). For each file: no crash (exit 0 or 2 only, 2 iff an
# error is listed), nothing on stderr (no problem left to a log line), the
# problem list equal to the committed expectation (tests/data/realcfg/expected/;
# refusals by name are expected, a changed list is a failure), and for JSON
# configs every top-level key accounted for: set from the file or named in a
# problem (nothing dropped in silence). Then the all-at-once report of
# `ctuner train` on a file with several problems, and exit codes.
# Usage: tests/cli_config.sh path/to/ctuner [--record]
# --record rewrites the expectations (make record-config: never under ctest);
# CT_UPDATE in the environment fails the test (it used to rewrite them and pass).
. "$(dirname "$0")/lib/common.sh"
RECORD=0
[ "${2:-}" = --record ] && RECORD=1
if [ -n "${CT_UPDATE:-}" ]; then
  bad "CT_UPDATE is set: a test run never rewrites its expectations; record with 'make record-config'"
  exit 1
fi
if [ $RECORD = 1 ] && [ -n "${CT_UNDER_CTEST:-}" ]; then
  bad "--record under ctest (make test): recording is 'make record-config' alone"
  exit 1
fi
cd "$(dirname "$0")/.." || exit 1
R=tests/data/realcfg
EXP=$R/expected
echo '{}' > "$tmp/empty.json"

check_one() { # name, file, args...
  local name=$1 f=$2; shift 2
  "$CT" config check "$@" > "$tmp/out" 2> "$tmp/err"; local rc=$?
  sed -n '/^[0-9]* errors\?, [0-9]* warnings\?$/,$p' "$tmp/out" > "$tmp/probs"
  local nerr; nerr=$(head -1 "$tmp/probs" | sed -E 's/^([0-9]+) error.*/\1/')
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 2 ]; then bad "$name: exit $rc"; return; fi
  if [ -z "$nerr" ]; then bad "$name: no problem summary in the output"; return; fi
  if { [ "$nerr" -gt 0 ] && [ "$rc" -ne 2 ]; } || { [ "$nerr" -eq 0 ] && [ "$rc" -ne 0 ]; }; then
    bad "$name: $nerr errors but exit $rc"; return
  fi
  [ -s "$tmp/err" ] && { bad "$name: stderr: $(head -3 "$tmp/err")"; return; }
  if [ $RECORD = 1 ]; then cp "$tmp/probs" "$EXP/$name.txt"; fi
  if ! diff -u "$EXP/$name.txt" "$tmp/probs" > "$tmp/diff"; then
    bad "$name: problems differ from $EXP/$name.txt:"; head -20 "$tmp/diff"; return
  fi
  case $f in
  $R/simpletuner/*.json)
    # every member of the object (one per line): set from the file, or a problem at its line
    local keys lines
    keys=$(/usr/bin/python3 -c 'import json,sys; print(len(json.load(open(sys.argv[1]))))' "$f")
    lines=$({
      grep -o "(file $f:[0-9]*:" "$tmp/out" | sed -E 's/.*:([0-9]+):$/\1/'
      grep -o "^$f:[0-9]*:" "$tmp/probs" | sed -E 's/.*:([0-9]+):$/\1/'
    } | sort -u | wc -l)
    [ "$keys" -eq "$lines" ] ||
      { bad "$name: $keys keys but $lines lines set or named in a problem"; return; }
    ;;
  esac
  ok "$name: exit $rc, $(head -1 "$tmp/probs"), as expected"
}

mkdir -p "$EXP"
n=0
for f in $R/simpletuner/*; do
  check_one "simpletuner_$(basename "$f")" "$f" "$f"; n=$((n + 1))
done
for f in $R/databackend/*; do
  check_one "databackend_$(basename "$f")" "$f" "$tmp/empty.json" --data_backend_config "$f"; n=$((n + 1))
done
[ $n -ge 15 ] && ok "$n real files checked" || bad "only $n real files"

# ---- every problem at once, from ctuner train too; exit codes ----
cat > "$tmp/many.json" <<'J'
{"learning_rat": 1e-4,
 "train_batch_size": "many",
 "tread_config": "x",
 "zero_stage": 9}
J
out=$("$CT" train --config "$tmp/many.json" --lerning_rate=1 2>&1); rc=$?
[ $rc -eq 2 ] && ok "train: exit 2 on a bad config" || bad "train: exit $rc"
for pat in "many.json:1:18: unknown key 'learning_rat'; did you mean 'learning_rate'" \
  "many.json:2:22: key 'train_batch_size' expects an integer" "many.json:3:18: key 'tread_config'" \
  "--lerning_rate: unknown key" "many.json:4:16: zero_stage must be" "5 problems in the configuration"; do
  echo "$out" | grep -qF -- "$pat" && ok "train names: $pat" || bad "train lacks '$pat': $out"
done
"$CT" config check "$tmp/empty.json" > /dev/null; rc=$?
[ $rc -eq 0 ] && ok "config check of a clean file: exit 0" || bad "clean file: exit $rc"
"$CT" config check "$tmp/empty.json" --learning_rate=-1 > "$tmp/o"; rc=$?
[ $rc -eq 2 ] && grep -q -- "^--learning_rate: error: learning_rate must be" "$tmp/o" &&
  ok "config check: a bad --KEY is named, exit 2" || bad "bad --KEY: exit $rc: $(tail -2 "$tmp/o")"
grep -q '^learning_rate  *-1  (cli)$' "$tmp/o" && ok "resolved value and origin printed" ||
  bad "no 'learning_rate -1 (cli)' line: $(grep learning_rate "$tmp/o")"
"$CT" config check > /dev/null 2>&1; rc=$?
[ $rc -eq 2 ] && ok "config check without FILE: exit 2" || bad "no FILE: exit $rc"
exit $fail
