#!/usr/bin/env bash
# End-to-end: `ctuner config check` on real files collected from public
# repositories (tests/data/realcfg/{simpletuner,databackend,deepspeed}, SOURCES.md says
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
# hub ids in these files resolve against no Hugging Face cache of this machine
export HF_HOME="$tmp/hf" HF_HUB_CACHE="$tmp/hf/hub" HF_HUB_OFFLINE=1
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
  # log lines other than INFO (the resolved DeepSpeed settings) would be problems left out of the list
  grep -v '^\[ctuner\] INFO ' "$tmp/err" > "$tmp/err2"
  [ -s "$tmp/err2" ] && { bad "$name: stderr: $(head -3 "$tmp/err2")"; return; }
  if [ $RECORD = 1 ]; then cp "$tmp/probs" "$EXP/$name.txt"; fi
  if ! diff -u "$EXP/$name.txt" "$tmp/probs" > "$tmp/diff"; then
    bad "$name: problems differ from $EXP/$name.txt:"; head -20 "$tmp/diff"; return
  fi
  case $f in
  $R/simpletuner/*.json)
    # every member of the object (one per line): set from the file, or a problem at its line
    local keys lines
    if ! keys=$(/usr/bin/python3 -c 'import json,sys; print(len(json.load(open(sys.argv[1]))))' "$f" 2>/dev/null); then
      # not JSON to Python either (a snippet with a trailing comma): the syntax error is named
      grep -q "^$f:[0-9]*:[0-9]*: error: " "$tmp/probs" && ok "$name: invalid JSON, named at its place" ||
        bad "$name: invalid JSON not named"
      return
    fi
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
for f in $R/deepspeed/*; do # read for one process, as config check folds a DeepSpeed file in
  check_one "deepspeed_$(basename "$f")" "$f" "$tmp/empty.json" --deepspeed_config "$f"; n=$((n + 1))
done
[ $n -ge 35 ] && ok "$n real files checked" || bad "only $n real files"

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

# ---- every CLI takes --KEY VALUE and --KEY=VALUE alike (issue 32) ----
echo '{"zero_optimization": {"stage": 2}, "train_micro_batch_size_per_gpu": 1}' > "$tmp/ds.json"
printf 'compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_GPU\nnum_processes: 2\n' > "$tmp/acc.yaml"
both() { # what, then the command with its options as KEY VALUE pairs after "--"
  local what=$1; shift
  local pre=() sp=() eq=()
  while [ "$1" != -- ]; do pre+=("$1"); shift; done
  shift
  while [ $# -gt 0 ]; do
    case $1 in
    --) sp+=("$@"); eq+=("$@"); break ;; # the command after launch's "--" goes as it is
    --*=* | --dry-run) sp+=("$1"); eq+=("$1"); shift ;;
    --*) sp+=("$1" "$2"); eq+=("$1=$2"); shift 2 ;;
    *) sp+=("$1"); eq+=("$1"); shift ;;
    esac
  done
  "$CT" "${pre[@]}" "${sp[@]}" > "$tmp/sp.out" 2>&1; local r1=$?
  "$CT" "${pre[@]}" "${eq[@]}" > "$tmp/eq.out" 2>&1; local r2=$?
  if [ $r1 = $r2 ] && cmp -s "$tmp/sp.out" "$tmp/eq.out" && ! grep -q "one FILE only\|unexpected argument\|unknown option" "$tmp/sp.out"; then
    ok "$what: --KEY VALUE = --KEY=VALUE (exit $r1)"
  else
    bad "$what: exit $r1 vs $r2"; diff "$tmp/sp.out" "$tmp/eq.out" | head -5; head -3 "$tmp/sp.out"
  fi
}
both "config check" config check "$tmp/empty.json" -- --deepspeed_config "$tmp/ds.json" --learning_rate 2e-4 \
  --data_backend_config "$tmp/empty.json"
grep -q '^zero_stage  *2  (deepspeed)$' "$tmp/sp.out" && grep -q '^learning_rate  *0.0002[0-9]*  (cli)$' "$tmp/sp.out" &&
  ok "config check F --deepspeed_config X: the DeepSpeed file is read" || bad "deepspeed_config X: $(grep -E '^(zero_stage|learning_rate) ' "$tmp/sp.out")"
both "train (a refused config)" train -- --config "$tmp/many.json" --learning_rate -1 --seed 3
both "model info" model info -- --preset tiny
both "launch --dry-run" launch -- --accelerate-config "$tmp/acc.yaml" --launcher mpirun --dry-run -- train --seed 1
both "eval vae (missing dirs)" eval vae -- --vae "$tmp/novae" --images "$tmp/noimg" --limit 2

# ---- a directory as the config file; an integer too large ----
mkdir -p "$tmp/cfgdir" && echo '{}' > "$tmp/cfgdir/config.json"
"$CT" config check "$tmp/cfgdir" > "$tmp/o" 2>&1; rc=$?
[ $rc = 2 ] && grep -q "is a directory, not a config file (.*cfgdir/config.json)" "$tmp/o" &&
  ok "a directory as the config: says so and names its config.json" || bad "directory: exit $rc: $(tail -2 "$tmp/o")"
"$CT" train --config "$tmp/cfgdir" > "$tmp/o" 2>&1; rc=$?
[ $rc = 2 ] && grep -q "is a directory, not a config file" "$tmp/o" && ok "train: the same" || bad "train directory: exit $rc: $(tail -2 "$tmp/o")"
echo '{"max_train_steps": 99999999999999999999999}' > "$tmp/big.json"
"$CT" config check "$tmp/big.json" --seed 99999999999999999999 > "$tmp/o" 2>&1
[ "$(grep -c "too large for an integer" "$tmp/o")" = 2 ] && ok "integers too large: 'too large' (file and --KEY)" ||
  bad "too large: $(grep -i "max_train_steps\|seed" "$tmp/o" | tail -2)"

# ---- config check opens what train opens: the same problems, from the same code ----
same_as_train() { # what, pattern, KEY=VALUE...
  local what=$1 pat=$2; shift 2
  local args=()
  for kv in "$@"; do args+=("--$kv"); done
  "$CT" config check "$tmp/empty.json" "${args[@]}" > "$tmp/cc" 2>&1; local rc1=$?
  "$CT" train --config "$tmp/empty.json" "${args[@]}" > "$tmp/tr" 2>&1; local rc2=$?
  local m1 m2
  m1=$(sed -n 's/^--[a-z_]*: error: //p' "$tmp/cc" | grep -- "$pat" | head -1)
  m2=$(sed -n 's/^ctuner train: --[a-z_]*: //p' "$tmp/tr" | grep -- "$pat" | head -1)
  if [ $rc1 = 2 ] && [ $rc2 = 2 ] && [ -n "$m1" ] && [ "$m1" = "$m2" ]; then
    ok "$what: config check and train refuse it alike: ${m1:0:90}"
  else
    bad "$what: config check exit $rc1 '$m1', train exit $rc2 '$m2'"; tail -2 "$tmp/tr"
  fi
}
mkdir -p "$tmp/notapipe"
same_as_train "lycoris_config missing" "lycoris_config: " model_type=lora lora_type=lycoris \
  "lycoris_config=$tmp/nope.json" "data_backend_config=$tmp/empty.json"
echo '{"algo": "lokr", "multiplier": 1.0, "linear_dim": 4, "linear_alpha": 1, "nonsense": 3}' > "$tmp/lyco.json"
same_as_train "lycoris_config with an unknown key" "lycoris_config: " model_type=lora lora_type=lycoris \
  "lycoris_config=$tmp/lyco.json" "data_backend_config=$tmp/empty.json"
same_as_train "vae_config missing" "$tmp/novae.json" model_type=vae "vae_config=$tmp/novae.json" \
  "data_backend_config=$tmp/empty.json"
same_as_train "tokenizer files missing" "$tmp/vocab.json" text_encoder=clip-bpe "tokenizer_vocab=$tmp/vocab.json" \
  "tokenizer_merges=$tmp/merges.txt" "data_backend_config=$tmp/empty.json"
same_as_train "not a pipeline directory" "FLUX.1 pipeline " "pretrained_model_name_or_path=$tmp/notapipe" \
  "data_backend_config=$tmp/empty.json"
same_as_train "init_lora missing" "init_lora '" model_type=lora "init_lora=$tmp/nope.safetensors" \
  "data_backend_config=$tmp/empty.json"
exit $fail
