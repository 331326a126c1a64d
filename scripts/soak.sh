#!/usr/bin/env bash
# Fault campaigns against a built ctuner (make soak: the Release build;
# docs/reliability.md says what each case proves and records the results).
#   scripts/soak.sh [--kills N] [--cases LIST] [--seed S] path/to/ctuner
# Cases (LIST is comma-separated; default all):
#   kill     N random kill -9 (default 50) of a small training run with a
#            checkpoint every 3 steps, each followed by a resume; lives 2, 7, 12, ...
#            die inside a checkpoint write (CTUNER_FAULT_KILL_AT_CHECKPOINT).
#            When a run completes, its final model, EMA, optimizer state and
#            losses must equal an uninterrupted run's bit for bit, and a new
#            round starts until N kills are done. After every kill, each guarded
#            checkpoint's safetensors files must be whole.
#   enospc   the output_dir on a tmpfs of a few MB (a private mount namespace,
#            unshare -m; skipped with a message where mounts are not allowed):
#            the second checkpoint runs out of space at three fill levels: a
#            clear error, the first checkpoint intact (a resume from it on a
#            large disk ends bit-identical), nothing guarded half-written.
#   corrupt  latent and text cache entries with a damaged header, truncated or
#            emptied: rebuilt with a warning naming each, same losses; a latent
#            entry with flipped bytes in its data (after the header); a
#            checkpoint's model.safetensors truncated or with a damaged header
#            and its optimizer.safetensors with a bad length: the resume is
#            refused naming the file.
#   rank     2 MPI ranks, ZeRO-3: one rank killed -9 after checkpoint-20: the
#            job ends within 60 s naming the rank, and a resume on 2 ranks ends
#            bit-identical to an uninterrupted run; one rank stopped (SIGSTOP)
#            with --distributed_timeout 15: the job ends within 60 s (skipped
#            while ctuner does not know distributed_timeout).
#   s3       output_dir s3://bucket/prefix with the endpoint (s3rver behind
#            tests/lib/s3_fault_proxy.py) failing every upload of one
#            checkpoint: mid-run a warning and training goes on; at the end
#            an error saying the last checkpoint is only local; never a .guard
#            on a partial upload; a resume pulls the newest complete one.
# Prints ok/FAIL/skip lines, then a Markdown table (also in
# $SOAK_DIR/results.md, default build/soak/). Exit 1 if any case failed.
# --seed makes the kill times repeatable (the seed is printed).
set -u
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
kills=50
cases="kill,enospc,corrupt,rank,s3"
seed="${SOAK_SEED:-$(date +%s)}"
while [ $# -gt 1 ]; do
  case "$1" in
  --kills) kills=$2; shift 2 ;;
  --cases) cases=$2; shift 2 ;;
  --seed) seed=$2; shift 2 ;;
  *) echo "soak.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
CT="${1:?usage: scripts/soak.sh [--kills N] [--cases LIST] [--seed S] path/to/ctuner}"
CT="$(cd "$(dirname "$CT")" && pwd)/$(basename "$CT")"
[ -x "$CT" ] || { echo "soak.sh: $CT is not an executable" >&2; exit 2; }
case "$kills" in '' | *[!0-9]*) echo "soak.sh: --kills wants a number" >&2; exit 2 ;; esac
RANDOM=$((seed % 32768))
PY=python3
[ -x /usr/bin/python3 ] && PY=/usr/bin/python3
out_dir="${SOAK_DIR:-$root/build/soak}"
mkdir -p "$out_dir"
tmp=$(mktemp -d)
cleanup_pids=()
cleanup() {
  local p
  for p in "${cleanup_pids[@]}"; do # only if still ours (its command line names our directory)
    tr '\0' ' ' 2>/dev/null < "/proc/$p/cmdline" | grep -qF "$tmp" || continue
    kill -CONT "$p" 2>/dev/null
    kill -9 "$p" 2>/dev/null
  done
  [ -n "${KEEP_TMP:-}" ] && echo "soak.sh: kept $tmp" || rm -rf "$tmp"
}
trap cleanup EXIT
export OMP_NUM_THREADS=1
fail=0
rows=()
ok() { echo "ok - $*"; }
bad() { echo "FAIL - $*"; fail=1; }
nskip=0 # skipped cases: counted in the closing line; CT_NO_SKIP=1 makes them failures
skip() {
  echo "skip - $*"
  nskip=$((nskip + 1))
  if [ -n "${CT_NO_SKIP:-}" ]; then bad "CT_NO_SKIP is set and this was skipped: $*"; fi
  return 0
}
row() { rows+=("| $1 | $2 | $3 |"); } # case, result, details
echo "soak.sh: $CT, cases $cases, $kills kill(s), seed $seed"

# ---- a small dataset and run (the tiny preset, 8x8 images) ----
"$CT" dataset synth --out "$tmp/data" --count 24 --seed 3 >/dev/null || { echo "FAIL - dataset synth"; exit 1; }
cat > "$tmp/backend.json" <<JSON
[{"id": "shapes", "type": "local", "instance_data_dir": "$tmp/data", "caption_strategy": "textfile", "crop": false}]
JSON
base=(--preset=tiny --resolution=8 --aspect_bucket_alignment=8 --data_backend_config="$tmp/backend.json"
      --train_batch_size=4 --learning_rate=1e-3 --disable_validation=true --seed=7 --use_ema=true
      --lr_scheduler=cosine --lr_warmup_steps=2 --caption_dropout_probability=0.3)
train() { "$CT" train "${base[@]}" "$@"; }
losses() { sed 's/"seconds".*//' "$1"; }
now_ms() { date +%s%3N; }
# same_ckpt A B: every .safetensors of two checkpoints (model, EMA, optimizer
# state or its ZeRO fragments) byte-identical, and the same set of them
same_ckpt() {
  local f a b
  a=$(cd "$1" && ls *.safetensors zero/*.safetensors 2>/dev/null)
  b=$(cd "$2" && ls *.safetensors zero/*.safetensors 2>/dev/null)
  [ "$a" = "$b" ] || { echo "different files: $(echo $a) vs $(echo $b)"; return 1; }
  echo "$a" | grep -q '^model.safetensors$' || { echo "no model.safetensors"; return 1; }
  for f in $a; do
    cmp -s "$1/$f" "$2/$f" || { echo "$f differs"; return 1; }
  done
}
# whole_ckpts DIR: every guarded checkpoint's .safetensors files are complete
# (header parses, the data section as long as the offsets say); prints problems
whole_ckpts() {
  "$PY" - "$1" <<'PY'
import glob, json, os, struct, sys
bad = []
for g in glob.glob(os.path.join(sys.argv[1], "checkpoint-*", ".guard")):
    d = os.path.dirname(g)
    for f in glob.glob(os.path.join(d, "*.safetensors")) + glob.glob(os.path.join(d, "zero", "*.safetensors")):
        try:
            b = open(f, "rb").read()
            n = struct.unpack("<Q", b[:8])[0]
            h = json.loads(b[8:8 + n])
            end = max([v["data_offsets"][1] for k, v in h.items() if k != "__metadata__"] or [0])
            if len(b) != 8 + n + end:
                bad.append("%s: %d bytes, header says %d" % (f, len(b), 8 + n + end))
        except Exception as e:
            bad.append("%s: %s" % (f, e))
print("\n".join(bad))
sys.exit(1 if bad else 0)
PY
}
has_case() { case ",$cases," in *",$1,"*) return 0 ;; *) return 1 ;; esac; }

# ---- (a) kill -9 at random moments, resume, compare ----
case_kill() {
  local steps=45 common ref t0 tref i=0 round=0 lives=0 inckpt=0 startup=0 mid=0 done_rounds=0 problems=""
  common=(--max_train_steps=$steps --checkpoint_step_interval=3 --checkpoints_total_limit=3)
  t0=$(now_ms)
  train --output_dir="$tmp/k-ref" "${common[@]}" >/dev/null 2>"$tmp/k-ref.err" || {
    bad "kill: the uninterrupted run failed: $(tail -2 "$tmp/k-ref.err")"; row "kill -9 + resume" FAIL "reference run failed"; return; }
  tref=$(($(now_ms) - t0))
  ref="$tmp/k-ref/checkpoint-$steps"
  while [ $i -lt "$kills" ]; do
    round=$((round + 1))
    local dir="$tmp/k-$round" finished=0
    while [ $finished = 0 ]; do
      lives=$((lives + 1))
      if [ $i -ge "$kills" ]; then # the kills are spent: let this round end
        train --output_dir="$dir" "${common[@]}" >"$tmp/k.out" 2>"$tmp/k.err" || {
          bad "kill round $round: the final resume failed: $(tail -2 "$tmp/k.err")"; problems+=" final resume failed;"; }
        finished=1
        break
      fi
      local delay="" pid rc="" last
      if [ $((lives % 5)) = 2 ]; then # die inside the next checkpoint's write (lives 2, 7, 12, ...)
        last=$(ls -d "$dir"/checkpoint-*/.guard 2>/dev/null | sed 's/.*checkpoint-//; s/\/.guard//' | sort -n | tail -1)
        CTUNER_FAULT_KILL_AT_CHECKPOINT=$(( ${last:-0} + 3 )) train --output_dir="$dir" "${common[@]}" \
          >"$tmp/k.out" 2>"$tmp/k.err"
        rc=$?
        [ $rc -gt 128 ] && { i=$((i + 1)); inckpt=$((inckpt + 1)); } || finished=1
      else
        delay=$((100 + RANDOM % (tref + 200))) # ms: start-up, steps, checkpoints, the end
        local m0 m1
        m0=$(cat "$dir/metrics.jsonl" 2>/dev/null | wc -l)
        # ctuner itself in the background (not a function's subshell), so that $! is its pid
        "$CT" train "${base[@]}" --output_dir="$dir" "${common[@]}" >"$tmp/k.out" 2>"$tmp/k.err" &
        pid=$!
        cleanup_pids+=("$pid")
        sleep "$(printf '%d.%03d' $((delay / 1000)) $((delay % 1000)))"
        m1=$(cat "$dir/metrics.jsonl" 2>/dev/null | wc -l)
        if kill -9 "$pid" 2>/dev/null; then
          wait "$pid" 2>/dev/null
          i=$((i + 1))
          # a resume rewrites metrics.jsonl up to its checkpoint: lines past m0 mean steps ran
          if [ "$m1" -gt "$m0" ]; then mid=$((mid + 1)); else startup=$((startup + 1)); fi
        else
          wait "$pid"
          rc=$?
          [ $rc = 0 ] || { bad "kill round $round: a run ended by itself with exit $rc: $(tail -2 "$tmp/k.err")"; problems+=" exit $rc;"; }
          finished=1
        fi
      fi
      # one line per life in the round's log: how it ended, what it left
      echo "life $lives: ${delay:+killed at ${delay} ms}${rc:+exit $rc}; $(grep -a -o '"from_step": [0-9]*' "$tmp/k.out" | head -1);" \
        "guarded: $(cd "$dir" 2>/dev/null && ls -d checkpoint-*/.guard 2>/dev/null | sed 's|/.guard||' | tr '\n' ' ');" \
        "dirs: $(cd "$dir" 2>/dev/null && ls -d checkpoint-* 2>/dev/null | tr '\n' ' '); metrics steps: $(grep -o '"step": [0-9]*' "$dir/metrics.jsonl" 2>/dev/null | sed 's/"step": //' | tr '\n' ',')" >> "$tmp/k-$round.log"
      local w
      if ! w=$(whole_ckpts "$dir"); then
        bad "kill round $round, life $lives: a guarded checkpoint is not whole: $w"
        problems+=" torn checkpoint;"
      fi
    done
    if [ -f "$dir/checkpoint-$steps/.guard" ] && d=$(same_ckpt "$ref" "$dir/checkpoint-$steps") &&
      diff <(losses "$tmp/k-ref/metrics.jsonl") <(losses "$dir/metrics.jsonl") >/dev/null; then
      done_rounds=$((done_rounds + 1))
      rm -rf "$dir"
    else
      bad "kill round $round: final state differs from the uninterrupted run (${d:-no checkpoint-$steps or losses differ}); its lives:"
      sed 's/^/    /' "$tmp/k-$round.log"
      problems+=" round $round differs;"
    fi
  done
  local msg="$i kills ($inckpt inside a checkpoint write, $mid during training, $startup during start-up) over $lives lives, $round round(s) of $steps steps; $done_rounds/$round rounds bit-identical (model, EMA, optimizer, losses)"
  if [ -z "$problems" ]; then ok "kill: $msg"; row "kill -9 + resume (seed $seed)" pass "$msg"
  else row "kill -9 + resume (seed $seed)" FAIL "$msg;$problems"; fi
}

# ---- (b) ENOSPC while writing a checkpoint ----
# mounted DIR SIZE_KB CMD...: runs CMD with a SIZE_KB tmpfs on DIR that only it sees
mounted() {
  local dir=$1 kb=$2
  shift 2
  if [ "$(id -u)" = 0 ]; then
    unshare -m --propagation private bash -c 'mount -t tmpfs -o size="$1"k tmpfs "$2" && shift 2 && "$@"' _ "$kb" "$dir" "$@"
  else
    unshare -rm bash -c 'mount -t tmpfs -o size="$1"k tmpfs "$2" && shift 2 && "$@"' _ "$kb" "$dir" "$@"
  fi
}
case_enospc() {
  mkdir -p "$tmp/mnt"
  if ! mounted "$tmp/mnt" 1024 true 2>"$tmp/mnt.err"; then
    skip "enospc: cannot mount a tmpfs in a private mount namespace ($(head -1 "$tmp/mnt.err")): run as root or where unshare -m / -rm is allowed"
    row "ENOSPC during a checkpoint" skipped "no tmpfs mount allowed: $(head -1 "$tmp/mnt.err")"
    return
  fi
  local common=(--max_train_steps=6 --checkpoint_step_interval=3) kb ck base_kb frac problems="" n=0 where=""
  # sizes: a full run on disk says how much one checkpoint and the rest take
  train --output_dir="$tmp/e-ref" "${common[@]}" >/dev/null 2>"$tmp/e-ref.err" || {
    bad "enospc: the reference run failed: $(tail -2 "$tmp/e-ref.err")"; row "ENOSPC during a checkpoint" FAIL "reference run failed"; return; }
  ck=$(du -sk "$tmp/e-ref/checkpoint-3" | cut -f1)
  base_kb=$(($(du -sk "$tmp/e-ref" | cut -f1) - 2 * ck))
  for frac in 15 50 85; do # percent of a second checkpoint that fits
    n=$((n + 1))
    kb=$((base_kb + ck + ck * frac / 100 + 64))
    rm -rf "$tmp/e-$frac"
    mkdir -p "$tmp/e-$frac"
    # inside the namespace: train into the tmpfs, then copy what is left out
    mounted "$tmp/mnt" "$kb" bash -c '"$@" >"'"$tmp/e-$frac"'/train.out" 2>"'"$tmp/e-$frac"'/train.err"; echo $? > "'"$tmp/e-$frac"'/rc"; cp -a "'"$tmp/mnt"'/out" "'"$tmp/e-$frac"'/out"' \
      _ "$CT" train "${base[@]}" "${common[@]}" --output_dir="$tmp/mnt/out"
    local rc err d
    rc=$(cat "$tmp/e-$frac/rc" 2>/dev/null || echo "?")
    err=$(grep -v '^\[ctuner\] INFO' "$tmp/e-$frac/train.err" | tail -1)
    d="$tmp/e-$frac/out"
    if [ "$rc" = 0 ]; then
      bad "enospc at ${kb} KB (${frac}% of a checkpoint free): the run succeeded"
      problems+=" ${frac}%: exit 0;"
      continue
    fi
    echo "$err" | grep -qi "no space left" && echo "$err" | grep -q "checkpoint-6" ||
      { bad "enospc ${frac}%: the error does not say 'No space left' and name checkpoint-6: $err"; problems+=" ${frac}%: message;"; }
    if [ -f "$d/checkpoint-6/.guard" ]; then bad "enospc ${frac}%: checkpoint-6 is guarded"; problems+=" ${frac}%: guarded;"; fi
    if ! w=$(whole_ckpts "$d"); then bad "enospc ${frac}%: $w"; problems+=" ${frac}%: torn;"; fi
    [ -f "$d/checkpoint-3/.guard" ] || { bad "enospc ${frac}%: checkpoint-3 lost"; problems+=" ${frac}%: checkpoint-3 lost;"; }
    # the survivor resumes on a large disk and ends as the uninterrupted run
    if train --output_dir="$d" "${common[@]}" >"$tmp/e.out" 2>"$tmp/e.err" && grep -q '"from_step": 3' "$tmp/e.out" &&
      same_ckpt "$tmp/e-ref/checkpoint-6" "$d/checkpoint-6" >/dev/null; then
      ok "enospc with ${frac}% of checkpoint-6's room: exit $rc, '$(echo "$err" | cut -c1-150)'; checkpoint-3 resumed to a bit-identical checkpoint-6"
    else
      bad "enospc ${frac}%: resume from checkpoint-3 on a large disk: $(tail -2 "$tmp/e.err")"
      problems+=" ${frac}%: resume;"
    fi
    where=$(echo "$err" | grep -o 'checkpoint-6[^ :]*/[a-z_.]*' | head -1)
    [ -n "$where" ] && where=" (at $where)"
  done
  if [ -z "$problems" ]; then
    row "ENOSPC during a checkpoint" pass "3 fill levels (15/50/85% of a checkpoint free): exit 1, 'No space left on device' naming checkpoint-6; checkpoint-3 intact, resumed bit-identical; nothing half-written guarded"
  else
    row "ENOSPC during a checkpoint" FAIL "$problems"
  fi
}

# ---- (c) corrupt and truncated cache entries and checkpoints ----
case_corrupt() {
  local common=(--max_train_steps=6 --checkpoint_step_interval=3) problems="" d="$tmp/c-run" v t nwarn
  train --output_dir="$tmp/c-ref" "${common[@]}" >/dev/null 2>"$tmp/c-ref.err" || {
    bad "corrupt: the reference run failed"; row "corrupt cache / checkpoint" FAIL "reference run failed"; return; }
  # cache entries: header damaged, truncated, empty (latent); truncated, header damaged (text)
  mkdir -p "$d"
  cp -a "$tmp/c-ref/cache" "$d/"
  v=($(ls "$d"/cache/vae/shapes/*.st | head -3))
  t=($(ls "$d"/cache/text/*.st | head -2))
  printf 'XXXXXXXX' | dd of="${v[0]}" bs=1 seek=10 conv=notrunc 2>/dev/null
  truncate -s $(($(stat -c %s "${v[1]}") / 2)) "${v[1]}"
  : > "${v[2]}"
  truncate -s 20 "${t[0]}"
  printf '\xff\xff\xff\xff\xff\xff\xff\xff' | dd of="${t[1]}" bs=1 seek=0 conv=notrunc 2>/dev/null
  if train --output_dir="$d" "${common[@]}" >/dev/null 2>"$tmp/c.err"; then
    # each latent entry is named; the text cache re-encodes from its first
    # unusable entry on and names that one
    local nv=0 nt=0 same=0
    for f in "${v[@]}"; do
      grep -i "unusable\|cannot be read" "$tmp/c.err" | grep -q "$(basename "$f" .st)" && nv=$((nv + 1))
    done
    for f in "${t[@]}"; do
      grep -i "unusable\|cannot be read" "$tmp/c.err" | grep -q "$(basename "$f" .st)" && nt=$((nt + 1))
    done
    for f in "${v[@]}" "${t[@]}"; do
      cmp -s "$f" "$tmp/c-ref/${f#"$d"/}" && same=$((same + 1))
    done
    if [ $nv = 3 ] && [ $nt -ge 1 ] && [ $same = 5 ] &&
      diff <(losses "$tmp/c-ref/metrics.jsonl") <(losses "$d/metrics.jsonl") >/dev/null &&
      same_ckpt "$tmp/c-ref/checkpoint-6" "$d/checkpoint-6" >/dev/null; then
      ok "corrupt cache: 3 latent entries (header damaged, truncated, empty) named in a warning each, 2 text entries (truncated, bad length) re-encoded ($nt named); all 5 rebuilt byte-identical; same losses and weights"
    else
      bad "corrupt cache: $nv/3 latent and $nt/2 text entries named, $same/5 rebuilt identical; $(grep -i 'unusable\|rebuild' "$tmp/c.err" | head -2)"
      problems+=" cache entries;"
    fi
  else
    bad "corrupt cache: the run failed: $(tail -2 "$tmp/c.err")"
    problems+=" cache run failed;"
  fi
  # bytes flipped after the header of an uncompressed latent entry (no checksum)
  rm -rf "$d" && mkdir -p "$d" && cp -a "$tmp/c-ref/cache" "$d/"
  v=($(ls "$d"/cache/vae/shapes/*.st))
  local sz
  for f in "${v[@]}"; do
    sz=$(stat -c %s "$f")
    printf '\x7f\x7f\x7f\x7f' | dd of="$f" bs=1 seek=$((sz - 8)) conv=notrunc 2>/dev/null
  done
  train --output_dir="$d" "${common[@]}" >/dev/null 2>"$tmp/c2.err"
  if diff <(losses "$tmp/c-ref/metrics.jsonl") <(losses "$d/metrics.jsonl") >/dev/null ||
    grep -qi "unusable\|checksum\|digest" "$tmp/c2.err"; then
    ok "latent entries with flipped data bytes: detected and rebuilt"
    local flip="detected"
  else
    bad "latent entries with flipped data bytes (after the header) are used as they are: $(losses "$d/metrics.jsonl" | sed -n 3p | cut -c1-80)"
    problems+=" flipped data bytes in latent entries go unnoticed (no checksum);"
  fi
  # checkpoints: truncated, header damaged, a bad header length
  local kind f ok_n=0
  for kind in truncated header length; do
    rm -rf "$d" && cp -a "$tmp/c-ref" "$d"
    f="$d/checkpoint-6/model.safetensors"
    case $kind in
    truncated) truncate -s $(($(stat -c %s "$f") * 2 / 3)) "$f" ;;
    header) printf 'garbage!' | dd of="$f" bs=1 seek=8 conv=notrunc 2>/dev/null ;;
    length) f="$d/checkpoint-6/optimizer.safetensors"
      printf '\xff\xff\xff\xff' | dd of="$f" bs=1 seek=0 conv=notrunc 2>/dev/null ;;
    esac
    if train --output_dir="$d" --max_train_steps=9 --checkpoint_step_interval=3 >/dev/null 2>"$tmp/c3.err"; then
      bad "corrupt checkpoint ($kind): the resume went ahead"
      problems+=" checkpoint $kind accepted;"
    elif grep -v INFO "$tmp/c3.err" | tail -1 | grep -q "$(basename "$f")"; then
      ok_n=$((ok_n + 1))
      ok "checkpoint $(basename "$f") $kind: resume refused: $(tail -1 "$tmp/c3.err" | cut -c1-160)"
    else
      bad "corrupt checkpoint ($kind): message does not name the file: $(tail -1 "$tmp/c3.err")"
      problems+=" checkpoint $kind message;"
    fi
  done
  if [ -z "$problems" ]; then
    row "corrupt / truncated cache entries and checkpoints" pass "3 latent entries (damaged header, truncated, empty) rebuilt with a warning naming each, 2 text entries re-encoded (the first named); same losses and weights; flipped data bytes ${flip:-?}; 3 damaged checkpoints refused naming the file"
  else
    row "corrupt / truncated cache entries and checkpoints" FAIL "$problems"
  fi
}

# ---- (d) a rank killed or stopped under ZeRO-3 ----
rank_pids() { # the processes of $CT whose command line holds $1
  local p name
  name=$(basename "$CT" | cut -c1-15)
  for p in $(pgrep -f -- "$1"); do [ "$(ps -o comm= -p "$p" 2>/dev/null)" = "$name" ] && echo "$p"; done
}
case_rank() {
  command -v mpirun >/dev/null || { skip "rank: mpirun not found"; row "rank killed / stopped (ZeRO-3, 2 ranks)" skipped "no mpirun"; return; }
  local M=(mpirun --oversubscribe --allow-run-as-root -np 2 -x OMP_NUM_THREADS=1) z=(--zero_stage=3 --train_batch_size=2)
  local common=(--max_train_steps=60 --checkpoint_step_interval=10) problems="" kdir="$tmp/r-kill" mpid victim t0 dt krc left
  "${M[@]}" "$CT" train "${base[@]}" "${z[@]}" "${common[@]}" --output_dir="$tmp/r-ref" >/dev/null 2>"$tmp/r-ref.err" || {
    bad "rank: the uninterrupted 2-rank run failed: $(tail -2 "$tmp/r-ref.err")"; row "rank killed (ZeRO-3, 2 ranks)" FAIL "reference run failed"; return; }
  "${M[@]}" "$CT" train "${base[@]}" "${z[@]}" "${common[@]}" --output_dir="$kdir" >/dev/null 2>"$tmp/r-kill.err" &
  mpid=$!
  cleanup_pids+=("$mpid")
  for _ in $(seq 1 600); do [ -f "$kdir/checkpoint-20/.guard" ] && break; sleep 0.05; done
  victim=$(rank_pids "--output_dir=$kdir" | tail -1)
  if [ -z "$victim" ]; then
    bad "rank kill: no rank process found (the run ended before checkpoint-20?)"
    problems+=" no rank to kill;"
  else
    kill -9 "$victim"
    t0=$(date +%s)
    wait $mpid
    krc=$?
    dt=$(($(date +%s) - t0))
    left=$(rank_pids "--output_dir=$kdir" | wc -l)
    if [ "$krc" -ne 0 ] && [ "$dt" -le 60 ] && [ "$left" = 0 ] && grep -q "signal 9" "$tmp/r-kill.err"; then
      ok "a rank killed: the job ended in ${dt}s, exit $krc, the rank named"
    else
      bad "rank kill: exit $krc after ${dt}s, $left processes left: $(tail -3 "$tmp/r-kill.err")"
      problems+=" kill: exit $krc after ${dt}s;"
    fi
    if "${M[@]}" "$CT" train "${base[@]}" "${z[@]}" "${common[@]}" --output_dir="$kdir" >"$tmp/r-res.out" 2>"$tmp/r-res.err" &&
      d=$(same_ckpt "$tmp/r-ref/checkpoint-60" "$kdir/checkpoint-60"); then
      ok "rank kill: resumed on 2 ranks ($(grep -o '"from_step": [0-9]*' "$tmp/r-res.out")) to a checkpoint-60 bit-identical to the uninterrupted run"
    else
      bad "rank kill: resume: ${d:-$(tail -2 "$tmp/r-res.err")}"
      problems+=" kill: resume differs;"
    fi
  fi
  local krow="a rank killed -9 after checkpoint-20: job ended in ${dt:-?} s naming the rank; resumed on 2 ranks bit-identical"
  [ -z "$problems" ] && row "rank killed (ZeRO-3, 2 ranks)" pass "$krow" || row "rank killed (ZeRO-3, 2 ranks)" FAIL "$problems"
  # SIGSTOP: needs the collective watchdog (distributed_timeout)
  if ! "$CT" train --help-keys 2>/dev/null | grep -Eq '^ *distributed_timeout '; then
    skip "rank stopped (SIGSTOP): ctuner does not know distributed_timeout yet (the collective watchdog); expected to fail until it lands"
    row "rank stopped, SIGSTOP (ZeRO-3, 2 ranks)" skipped "expected to fail until the collective watchdog (distributed_timeout) lands: without it the job hangs"
    return
  fi
  local sdir="$tmp/r-stop" srow problems2=""
  "${M[@]}" "$CT" train "${base[@]}" "${z[@]}" --max_train_steps=100000 --checkpoint_step_interval=10 \
    --distributed_timeout=15 --output_dir="$sdir" >/dev/null 2>"$tmp/r-stop.err" &
  mpid=$!
  cleanup_pids+=("$mpid")
  for _ in $(seq 1 600); do [ -f "$sdir/checkpoint-20/.guard" ] && break; sleep 0.05; done
  local pids
  pids=$(rank_pids "--output_dir=$sdir")
  victim=$(echo "$pids" | tail -1)
  cleanup_pids+=($pids)
  if [ -z "$victim" ]; then
    bad "rank stop: no rank process found"
    problems2+=" no rank;"
  else
    kill -STOP "$victim"
    t0=$(date +%s)
    while kill -0 $mpid 2>/dev/null && [ $(($(date +%s) - t0)) -lt 60 ]; do sleep 0.5; done
    dt=$(($(date +%s) - t0))
    if kill -0 $mpid 2>/dev/null; then
      bad "rank stopped: the job still runs after ${dt}s (distributed_timeout 15)"
      problems2+=" hung > 60 s;"
      kill -CONT "$victim" 2>/dev/null
      for p in $pids $mpid; do kill -9 "$p" 2>/dev/null; done
      wait $mpid 2>/dev/null
    else
      wait $mpid
      krc=$?
      kill -CONT "$victim" 2>/dev/null
      kill -9 "$victim" 2>/dev/null
      local msg
      msg=$(grep -v INFO "$tmp/r-stop.err" | grep -i -m1 "timeout\|rank" | cut -c1-160)
      [ "$krc" -ne 0 ] && ok "rank stopped (SIGSTOP): the job ended in ${dt}s, exit $krc: $msg" ||
        { bad "rank stopped: exit 0"; problems2+=" exit 0;"; }
      whole_ckpts "$sdir" >/dev/null || { bad "rank stopped: a torn checkpoint"; problems2+=" torn checkpoint;"; }
    fi
  fi
  srow="SIGSTOP of one rank after checkpoint-20 with distributed_timeout 15: job ended in ${dt:-?} s (limit 60)"
  [ -z "$problems2" ] && row "rank stopped, SIGSTOP (ZeRO-3, 2 ranks)" pass "$srow" || row "rank stopped, SIGSTOP (ZeRO-3, 2 ranks)" FAIL "$problems2"
}

# ---- (e) the S3 endpoint failing mid-upload ----
case_s3() {
  command -v node >/dev/null || { skip "s3: node not found (s3rver): scripts/deps.sh --golden"; row "S3 failing mid-upload" skipped "no node"; return; }
  (
    . "$root/tests/lib/s3_env.sh"
    srv="$tmp/s3"
    trap 's3_stop "$srv"' EXIT
    echo "mode=none" > "$tmp/proxy.ctl"
    s3_start "$srv" soak && s3_proxy "$srv" --log "$tmp/proxy.log" --control "$tmp/proxy.ctl" \
      --credentials S3RVER:S3RVER --max-seconds 900 || { echo "FAIL - s3rver and the fault proxy did not start"; exit 3; }
    ep="http://127.0.0.1:$S3_PROXY_PORT"
    export AWS_ENDPOINT_URL="$ep"
    problems=""
    common=(--max_train_steps=9 --checkpoint_step_interval=3)
    # every upload attempt of checkpoint-3's optimizer state is reset mid-way (first=-1: always)
    echo "mode=reset first=-1 match=^PUT.*/run/checkpoint-3/optimizer" > "$tmp/proxy.ctl"
    if "$CT" train "${base[@]}" "${common[@]}" --output_dir=s3://soak/run --output_dir_local="$tmp/s3a" >/dev/null 2>"$tmp/s3a.err"; then
      keys=$("$CT" storage ls s3://soak/run --endpoint "$ep" | awk '{print $2}')
      nf=$(grep -c 'fault=reset' "$tmp/proxy.log")
      if grep -q "WARN.*checkpoint-3.*local copy is intact" "$tmp/s3a.err" && ! echo "$keys" | grep -qx 'checkpoint-3/.guard' &&
        echo "$keys" | grep -qx 'checkpoint-9/.guard'; then
        echo "ok - s3: checkpoint-3's upload reset mid-way $nf times: a warning, training went on, checkpoint-3 unguarded in the bucket, checkpoint-9 uploaded"
      else
        echo "FAIL - s3 mid-run: $(grep -m1 WARN "$tmp/s3a.err") keys: $(echo $keys)"
        problems+=" mid-run failure;"
      fi
    else
      echo "FAIL - s3: a failed mid-run upload ended the run: $(tail -2 "$tmp/s3a.err")"
      problems+=" mid-run upload ended the run;"
    fi
    # the last checkpoint's upload fails: the run ends with an error, the bucket keeps the previous one
    echo "mode=none" > "$tmp/proxy.ctl"
    "$CT" train "${base[@]}" "${common[@]}" --max_train_steps=6 --resume_from_checkpoint=none \
      --output_dir=s3://soak/run2 --output_dir_local="$tmp/s3b0" >/dev/null 2>"$tmp/s3b0.err" ||
      { echo "FAIL - s3: a clean run to checkpoint-6: $(tail -2 "$tmp/s3b0.err")"; problems+=" clean run;"; }
    echo "mode=500 first=-1 match=^PUT.*/run2/checkpoint-9/" > "$tmp/proxy.ctl"
    if "$CT" train "${base[@]}" "${common[@]}" --output_dir=s3://soak/run2 --output_dir_local="$tmp/s3b0" \
      >/dev/null 2>"$tmp/s3b.err"; then
      echo "FAIL - s3: the last checkpoint failed to upload and the run exited 0"
      problems+=" exit 0 with the last checkpoint local only;"
    else
      keys=$("$CT" storage ls s3://soak/run2 --endpoint "$ep" | awk '{print $2}')
      msg=$(grep -v INFO "$tmp/s3b.err" | tail -1)
      if echo "$msg" | grep -q "only local" && ! echo "$keys" | grep -qx 'checkpoint-9/.guard' &&
        echo "$keys" | grep -qx 'checkpoint-6/.guard'; then
        echo "ok - s3: the last upload fails: exit 1, '$(echo "$msg" | cut -c1-150)'; checkpoint-6 stays the newest guarded one"
      else
        echo "FAIL - s3 end of run: '$msg'; keys: $(echo $keys)"
        problems+=" end-of-run failure;"
      fi
      echo "mode=none" > "$tmp/proxy.ctl"
      if "$CT" train "${base[@]}" "${common[@]}" --output_dir=s3://soak/run2 --output_dir_local="$tmp/s3c" \
        >"$tmp/s3c.out" 2>"$tmp/s3c.err" && grep -q "pulled checkpoint-6" "$tmp/s3c.err"; then
        echo "ok - s3: a resume on an empty directory pulls checkpoint-6 (the newest complete one) and finishes"
      else
        echo "FAIL - s3: resume after the failed upload: $(grep -m1 pulled "$tmp/s3c.err") $(tail -1 "$tmp/s3c.err")"
        problems+=" resume;"
      fi
    fi
    [ -z "$problems" ] && exit 0
    echo "$problems" > "$tmp/s3.problems"
    exit 1
  )
  case $? in
  0) row "S3 endpoint failing mid-upload" pass "uploads reset mid-way: a warning and the run goes on; the last upload failing: exit 1 'the last checkpoint is only local'; no .guard on a partial upload; a resume pulls the newest complete checkpoint" ;;
  3) fail=1; row "S3 endpoint failing mid-upload" FAIL "s3rver / proxy did not start" ;;
  *) fail=1; row "S3 endpoint failing mid-upload" FAIL "$(cat "$tmp/s3.problems" 2>/dev/null)" ;;
  esac
}

t_all=$(date +%s)
for c in kill enospc corrupt rank s3; do
  has_case $c || continue
  t=$(date +%s)
  "case_$c"
  echo "soak.sh: case $c took $(($(date +%s) - t)) s"
done
{
  echo "| case | result | details |"
  echo "|---|---|---|"
  printf '%s\n' "${rows[@]}"
} > "$out_dir/results.md"
echo
cat "$out_dir/results.md"
echo "soak.sh: $(($(date +%s) - t_all)) s in all; table in $out_dir/results.md"
echo "soak.sh: $([ $fail = 0 ] && echo passed || echo FAILED), $nskip case(s) skipped"
exit $fail
