#!/usr/bin/env bash
# End-to-end: the command table (src/cli/commands.c) against the sources and
# the real binary. The commands are derived independently of the table — from
# the usage lines of the cmd_*.c help texts and from the handler functions
# they define — and `ctuner --help` must list every one; each `ctuner CMD [SUB]
# --help` (and `ctuner help CMD [SUB]`) exits 0 with its usage line; every
# option a cmd_*.c parses appears in the help of its commands; groups, unknown
# commands and subcommands exit as documented. Usage: tests/cli_help.sh path/to/ctuner
. "$(dirname "$0")/lib/common.sh"
SRC=$(cd "$(dirname "$0")/../src/cli" && pwd)

# ---- the commands, from the sources (not the table) ----
# Usage lines: "usage: ctuner NAME [SUB] ..." and continuation lines "       ctuner NAME SUB ...".
grep -ohE '"(usage: |       )ctuner [a-z]+( [a-z]+)?' "$SRC"/cmd_*.c | sed -E 's/^"(usage: | +)ctuner //' |
  sort -u > "$tmp/src_cmds"
[ "$(wc -l < "$tmp/src_cmds")" -ge 20 ] && ok "$(wc -l < "$tmp/src_cmds") commands in the cmd_*.c usage lines" ||
  bad "only $(wc -l < "$tmp/src_cmds") usage lines found in $SRC: $(tr '\n' ',' < "$tmp/src_cmds")"

# Every handler and help function the cmd_*.c files define is a row of the table.
missing=""
for f in $(grep -ohE '^(int|void) ct_cmd_[a-z_]+\((int argc, char \*\*argv|FILE \*f)\)' "$SRC"/cmd_*.c |
  sed -E 's/^(int|void) (ct_cmd_[a-z_]+)\(.*/\2/' | sort -u); do
  grep -qE "(^|[ ,{])$f([,}]|\$)" "$SRC/commands.c" || missing="$missing $f"
done
[ -z "$missing" ] && ok "every ct_cmd_* handler and help function is in the command table" ||
  bad "not in the command table (src/cli/commands.c):$missing"

# ---- ctuner --help lists every command ----
"$CT" --help > "$tmp/list"; rc=$?
[ $rc -eq 0 ] && ok "--help exits 0" || bad "--help rc=$rc"
sed -nE 's/^  ([a-z]+( [a-z]+)?)  .*/\1/p' "$tmp/list" > "$tmp/listed"
sort -u "$tmp/listed" > "$tmp/listed_sorted"
if diff "$tmp/src_cmds" "$tmp/listed_sorted" > "$tmp/d"; then
  ok "--help lists exactly the $(wc -l < "$tmp/listed") commands of the usage lines"
else
  bad "--help and the usage lines of src/cli/cmd_*.c differ (< sources only, > --help only): $(tr '\n' ' ' < "$tmp/d")"
fi
[ "$(wc -l < "$tmp/listed")" -eq "$(wc -l < "$tmp/listed_sorted")" ] && ok "no command listed twice" ||
  bad "a command is listed twice: $(sort "$tmp/listed" | uniq -d)"
"$CT" help | cmp -s - "$tmp/list" && ok "'ctuner help' = 'ctuner --help'" || bad "'ctuner help' differs from --help"
"$CT" -h | cmp -s - "$tmp/list" && ok "'ctuner -h' = 'ctuner --help'" || bad "'ctuner -h' differs from --help"

# ---- each command's help ----
nok=0
while read -r cmd; do
  # shellcheck disable=SC2086
  out=$("$CT" $cmd --help 2> "$tmp/err"); rc=$?
  if [ $rc -ne 0 ] || [ -s "$tmp/err" ]; then bad "ctuner $cmd --help: rc=$rc, stderr: $(head -2 "$tmp/err")"; continue; fi
  if ! echo "$out" | grep -qE "^(usage: |       )ctuner $cmd( |\$)"; then bad "ctuner $cmd --help: no usage line: $(echo "$out" | head -2)"; continue; fi
  # shellcheck disable=SC2086
  [ "$("$CT" help $cmd)" = "$out" ] || { bad "ctuner help $cmd differs from ctuner $cmd --help"; continue; }
  # shellcheck disable=SC2086
  [ "$("$CT" $cmd -h)" = "$out" ] || { bad "ctuner $cmd -h differs from ctuner $cmd --help"; continue; }
  nok=$((nok + 1))
done < "$tmp/listed"
[ $nok -eq "$(wc -l < "$tmp/listed")" ] && ok "all $nok 'ctuner CMD [SUB] --help' exit 0 with a usage line (= help CMD [SUB], = -h)"

# ---- every option a cmd_*.c parses is in the help of its commands ----
for f in "$SRC"/cmd_*.c; do
  cmds=$(grep -ohE '"(usage: |       )ctuner [a-z]+( [a-z]+)?' "$f" | sed -E 's/^"(usage: | +)ctuner //' | sort -u)
  [ -n "$cmds" ] || continue
  : > "$tmp/help_f"
  # shellcheck disable=SC2086
  while read -r cmd; do "$CT" $cmd --help >> "$tmp/help_f"; done <<< "$cmds"
  opts=$( (grep -ohE 'ct_cli_opt\(argc, argv, &i, "[a-z_-]+"' "$f" | sed -E 's/.*"(.*)"/--\1/'
           grep -ohE 'strcmp\(argv\[i\], "--[a-z_-]+"\)' "$f" | sed -E 's/.*"(.*)"\)/\1/') |
         grep -vxE -- '--help' | sort -u)
  undoc=""
  for o in $opts; do grep -qE -- "$o([^a-z_-]|\$)" "$tmp/help_f" || undoc="$undoc $o"; done
  [ -z "$undoc" ] && ok "$(basename "$f"): its $(echo $opts | wc -w) options are in its help" ||
    bad "$(basename "$f"): options parsed but not in the help:$undoc"
done

# ---- groups ----
for g in $(cut -d' ' -f1 < "$tmp/listed" | uniq); do
  subs=$(awk -v g="$g" '$1 == g && NF == 2 {print $2}' "$tmp/listed")
  [ -n "$subs" ] || continue
  out=$("$CT" "$g" --help); rc=$?
  want="usage: ctuner $g <$(echo $subs | tr ' ' '|')> [options]"
  miss=""
  for s in $subs; do echo "$out" | grep -qE "^(usage: |       )ctuner $g $s( |\$)" || miss="$miss $s"; done
  [ $rc -eq 0 ] && [ "$(echo "$out" | head -1)" = "$want" ] && [ -z "$miss" ] &&
    ok "ctuner $g --help: '$want' and the usage of each subcommand" ||
    bad "ctuner $g --help: rc=$rc, first line '$(echo "$out" | head -1)', missing:$miss"
  "$CT" "$g" > /dev/null 2> "$tmp/err"; rc=$?
  [ $rc -eq 2 ] && grep -q "expected a subcommand" "$tmp/err" && ok "ctuner $g without a subcommand: exit 2" ||
    bad "ctuner $g without a subcommand: rc=$rc $(head -1 "$tmp/err")"
  "$CT" "$g" frobnicate > /dev/null 2> "$tmp/err"; rc=$?
  [ $rc -eq 2 ] && grep -q "unknown subcommand 'frobnicate'" "$tmp/err" && ok "ctuner $g frobnicate: exit 2 naming it" ||
    bad "ctuner $g frobnicate: rc=$rc $(head -1 "$tmp/err")"
done

# ---- errors ----
"$CT" frobnicate > "$tmp/out" 2> "$tmp/err"; rc=$?
[ $rc -eq 2 ] && [ ! -s "$tmp/out" ] && grep -q "unknown command 'frobnicate'" "$tmp/err" && grep -q "^  bench step  " "$tmp/err" &&
  ok "unknown command: exit 2, named, the list on stderr" || bad "unknown command: rc=$rc $(head -2 "$tmp/err")"
"$CT" > "$tmp/out" 2> "$tmp/err"; rc=$?
[ $rc -eq 2 ] && [ ! -s "$tmp/out" ] && grep -q "^  train  " "$tmp/err" && ok "no command: exit 2, the list on stderr" ||
  bad "no command: rc=$rc"
"$CT" help frobnicate > /dev/null 2> "$tmp/err"; rc=$?
[ $rc -eq 2 ] && grep -q "unknown command 'frobnicate'" "$tmp/err" && ok "help of an unknown command: exit 2" ||
  bad "help frobnicate: rc=$rc"
"$CT" help model frobnicate > /dev/null 2> "$tmp/err"; rc=$?
[ $rc -eq 2 ] && grep -q "unknown subcommand 'frobnicate'" "$tmp/err" && ok "help of an unknown subcommand: exit 2" ||
  bad "help model frobnicate: rc=$rc"
"$CT" --log-level warn model info --help | grep -q "^usage: ctuner model info" && ok "--log-level before the command" ||
  bad "--log-level warn model info --help"
exit $fail
