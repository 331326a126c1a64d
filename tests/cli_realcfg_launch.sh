#!/usr/bin/env bash
# Real Accelerate configs from public repositories (tests/data/realcfg/,
# SOURCES.md says where each came from and what it must do): every file of
# the Accelerate table goes through `ctuner launch --dry-run` and must run,
# warn or be refused as the table's last column says.
# Usage: tests/cli_realcfg_launch.sh path/to/ctuner
. "$(dirname "$0")/lib/common.sh"
dir=$(cd "$(dirname "$0")/data/realcfg" && pwd)
for n in 1 2 3 4; do echo "node$n slots=8"; done > "$tmp/hosts"
rows=0
while IFS='|' read -r _ file repo path commit args expect _; do
  file=$(echo "$file" | xargs)
  case $file in *.yaml | *.yml) ;; *) continue ;; esac
  args=$(echo "$args" | xargs)
  expect=$(echo "$expect" | sed 's/^ *//; s/ *$//')
  rows=$((rows + 1))
  # shellcheck disable=SC2086
  out=$("$CT" launch --accelerate-config "$dir/accelerate/$file" ${args//HOSTS/$tmp/hosts} --dry-run -- train \
    2>"$tmp/err")
  rc=$?
  err=$(cat "$tmp/err")
  kind=${expect%%:*}
  want=${expect#*: }
  [ "$want" = "$expect" ] && want=""
  case $kind in
  runs)
    [ $rc = 0 ] && echo "$out" | grep -q "^mpirun " && echo "$out" | grep -qF -- "$want" &&
      ok "$file runs: $out" || bad "$file: expected to run${want:+ with '$want'}: exit $rc, $out $err" ;;
  warns)
    [ $rc = 0 ] && echo "$err" | grep "warning" | grep -qF -- "$want" &&
      ok "$file warns: $want" || bad "$file: expected a warning '$want': exit $rc, $err" ;;
  refused)
    [ $rc = 2 ] && echo "$err" | grep -qF -- "$want" &&
      ok "$file refused: $want" || bad "$file: expected refusal '$want': exit $rc, $out $err" ;;
  *) bad "$file: unknown expectation '$expect' in SOURCES.md" ;;
  esac
done < "$dir/SOURCES.md"
n=$(ls "$dir/accelerate" | wc -l)
[ "$rows" = "$n" ] && ok "all $n files of tests/data/realcfg/accelerate have a row" ||
  bad "$rows rows in SOURCES.md for $n files in tests/data/realcfg/accelerate"
exit $fail
