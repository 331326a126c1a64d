#!/usr/bin/env bash
# make test-sabotage: do the tests catch known-bad code? Copies the working tree
# (tracked and untracked, not ignored files) to build-sabotage/tree, builds it,
# runs each check on the good code (it must pass: a check that fails anyway
# proves nothing), then for each patch of tests/sabotage/ applies it, rebuilds,
# runs the checks named below (each must fail: exit status neither 0 nor 77)
# and reverts it. Prints one line per check and a closing line; exits 1 when a
# sabotage went unnoticed or a baseline failed. Never touches the working tree.
#   scripts/sabotage.sh [CASE...]   default every case below
# The cases (tests/sabotage/NAME.patch):
#   attention_nan          ct_attention_fwd writes NaN, ct_attention_bwd nothing
#   attention_dk_unwritten ct_attention_bwd leaves dk unwritten
#   loss_moved             the reported loss moves by 1e-4 (relative): the
#                          cli_losses goldens, exact and tolerance modes
#   hub_no_resume          a hub download never resumes its .incomplete blob:
#                          tests/cli_hub.sh (Range after a cut, across runs)
#   json_ub                a signed overflow in the JSON number parser: the
#                          fuzz target (clang, ASan + UBSan) must stop on it
#   lora_alpha_ignored     adapter files of other layouts merged without their
#                          .alpha (kohya, BFL, LyCORIS): the lora_files goldens
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
work="${SABOTAGE_DIR:-$root/build-sabotage}"
tree="$work/tree"
jobs="${JOBS:-2}"
if [ -n "${CT_IN_MAKE_TEST:-}${CT_UNDER_CTEST:-}" ]; then
  echo "sabotage.sh: not under make test (it rebuilds a copy of the tree; run make test-sabotage alone)" >&2
  exit 2
fi

# name | checks (';'-separated commands, run in the copy; each must fail when patched)
CASES=(
  "attention_nan|build/ct_tests kernels attention_small;build/ct_tests kernels attention_multi_tile;build/ct_tests kernels attention_threads;build/ct_tests attention dispatch"
  "attention_dk_unwritten|build/ct_tests attention dispatch;build/ct_tests kernels attention_small"
  "loss_moved|CT_LOSSES_ONLY=small_adamw_ema bash tests/cli_losses.sh build/ctuner;CT_LOSSES_MODE=tolerance CT_LOSSES_ONLY=small_adamw_ema bash tests/cli_losses.sh build/ctuner"
  "hub_no_resume|bash tests/cli_hub.sh build/ctuner"
  "json_ub|build-fuzz/fuzz_safetensors -runs=1 $work/json_ub.input"
  "lora_alpha_ignored|build/ct_tests lora_files layouts_vs_diffusers_rules;build/ct_tests lora_files lycoris_files_vs_lycoris"
)
if [ $# -gt 0 ]; then
  sel=()
  for want in "$@"; do
    found=0
    for c in "${CASES[@]}"; do [ "${c%%|*}" = "$want" ] && sel+=("$c") && found=1; done
    [ $found = 1 ] || { echo "sabotage.sh: no case $want" >&2; exit 2; }
  done
  CASES=("${sel[@]}")
fi

# ---- the copy (re-extracted over the last one, so the build directories stay warm) ----
# A run stopped while a patch was applied left objects built from it that are
# newer than the good files tar restores (with their old times): start afresh.
if [ -f "$work/patched" ]; then
  echo "sabotage.sh: the last run stopped with $(cat "$work/patched") applied: rebuilding the copy from scratch"
  rm -rf "$tree" "$work/patched"
fi
mkdir -p "$tree"
(cd "$root" && git ls-files -co --exclude-standard -z | tar --null -T - -cf -) | tar -C "$tree" -xf - ||
  { echo "sabotage.sh: copying the tree failed" >&2; exit 2; }
printf '[12345]' > "$work/json_ub.input"
need_fuzz=0
for c in "${CASES[@]}"; do [[ "$c" == *build-fuzz/* ]] && need_fuzz=1; done

build() { # [fuzz]: quiet incremental builds of what the checks run (and the fuzz target)
  cmake --build "$tree/build" -j "$jobs" --target ct_tests ctuner_cli >"$work/build.log" 2>&1 ||
    { echo "sabotage.sh: build failed: $(grep -m3 error "$work/build.log")" >&2; return 1; }
  if [ "${1:-}" = fuzz ]; then
    cmake --build "$tree/build-fuzz" -j "$jobs" --target fuzz_safetensors >"$work/build-fuzz.log" 2>&1 ||
      { echo "sabotage.sh: fuzz build failed: $(grep -m3 error "$work/build-fuzz.log")" >&2; return 1; }
  fi
}
cmake -S "$tree" -B "$tree/build" -DCMAKE_BUILD_TYPE=Release >"$work/configure.log" 2>&1 ||
  { echo "sabotage.sh: configure failed (see $work/configure.log)" >&2; exit 2; }
if [ $need_fuzz = 1 ]; then
  command -v clang >/dev/null || { echo "sabotage.sh: json_ub needs clang (scripts/deps.sh)" >&2; exit 2; }
  CC=clang cmake -S "$tree" -B "$tree/build-fuzz" -DCT_FUZZ=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    >"$work/configure-fuzz.log" 2>&1 || { echo "sabotage.sh: fuzz configure failed" >&2; exit 2; }
fi
echo "sabotage.sh: building the copy in $tree (first time: a few minutes)"
build $([ $need_fuzz = 1 ] && echo fuzz) || exit 2

run_check() { # command -> exit status (output in $work/last.log)
  (cd "$tree" && timeout 1200 bash -c "$1") >"$work/last.log" 2>&1
}

status=0
ncaught=0
nchecks=0
for c in "${CASES[@]}"; do
  name=${c%%|*}
  IFS=';' read -r -a checks <<<"${c#*|}"
  patchf="$root/tests/sabotage/$name.patch"
  [ -f "$patchf" ] || { echo "FAIL - $name: no $patchf"; status=1; continue; }
  fz=""
  [[ "$c" == *build-fuzz/* ]] && fz=fuzz
  build $fz || exit 2 # the good code (the last case's patch is reverted)
  # the checks pass on the good code
  base_ok=1
  for k in "${checks[@]}"; do
    run_check "$k"
    rc=$?
    if [ $rc != 0 ]; then
      echo "FAIL - $name: baseline '$k' does not pass on the good code (exit $rc): $(tail -3 "$work/last.log")"
      status=1 base_ok=0
    fi
  done
  [ $base_ok = 1 ] || continue
  echo "$name" > "$work/patched"
  (cd "$tree" && patch -p1 --forward --no-backup-if-mismatch -s < "$patchf") ||
    { echo "FAIL - $name: the patch does not apply (update tests/sabotage/$name.patch)"; status=1; rm -rf "$tree" "$work/patched"; exit 1; }
  if build $fz; then
    for k in "${checks[@]}"; do
      nchecks=$((nchecks + 1))
      run_check "$k"
      rc=$?
      if [ $rc != 0 ] && [ $rc != 77 ]; then
        ncaught=$((ncaught + 1))
        echo "ok - $name: caught by '$k' (exit $rc): $(grep -m1 -E 'CHECK|REQUIRE|FAIL|runtime error|SUMMARY' "$work/last.log" | cut -c1-160)"
      else
        echo "FAIL - $name: NOT caught by '$k' (exit $rc)"
        status=1
      fi
    done
  else
    echo "FAIL - $name: the sabotaged tree does not build"
    status=1
  fi
  (cd "$tree" && patch -p1 -R --no-backup-if-mismatch -s < "$patchf") ||
    { echo "sabotage.sh: reverting $name failed; the next run starts afresh" >&2; exit 2; }
  rm -f "$work/patched"
done
build >/dev/null 2>&1 # leave the copy built from the good code (the fuzz target: next time)
echo "sabotage.sh: $ncaught of $nchecks sabotaged check(s) failed as they must$([ $status = 0 ] || echo '; FAILED')"
exit $status
