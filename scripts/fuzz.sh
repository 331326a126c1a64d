#!/usr/bin/env bash
# Runs every libFuzzer target in fuzz/ (ASan + UBSan) for SECONDS each.
#   scripts/fuzz.sh [SECONDS]      default 60
# Builds into build-fuzz/ with clang (-DCT_FUZZ=ON), seeds fuzz-corpus/<target>/
# (fuzz_safetensors: tests/data/*.safetensors plus a few small generated files;
# fuzz_image and fuzz_image_header: the PNG/JPEG/WebP/BMP/GIF fixtures in
# tests/data/images/; fuzz_bpe: the test
# merges.txt plus a caption; fuzz_config_toml: tests/data/toml and the real
# config.env files; fuzz_parquet: tests/data/parquet/*.parquet up to
# 8 KB, the -max_len; fuzz_s3_list: a ListObjectsV2 page; fuzz_yaml: the real
# Accelerate configs of tests/data/realcfg/accelerate/), and fails if a
# target reports a crash, leak or sanitizer error. Crash inputs are kept in
# build-fuzz/artifacts/ for reproduction: build-fuzz/<target> <file>.
set -euo pipefail

secs="${1:-60}"
case "$secs" in
  ''|*[!0-9]*) echo "fuzz.sh: SECONDS must be a number, got '$secs'" >&2; exit 2 ;;
esac
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

CC_FUZZ="${CC_FUZZ:-clang}"
if ! command -v "$CC_FUZZ" >/dev/null 2>&1; then
  echo "fuzz.sh: '$CC_FUZZ' not found; fuzzing needs clang with libFuzzer" >&2
  echo "fuzz.sh: install it with scripts/deps.sh (Debian packages clang libclang-rt-14-dev libomp-dev)" >&2
  exit 1
fi
# libFuzzer ships in compiler-rt; check that clang can link a fuzz target.
probe="$(mktemp -d)"
trap 'rm -rf "$probe"' EXIT
printf '#include <stdint.h>\n#include <stddef.h>\nint LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) { (void)d; (void)n; return 0; }\n' >"$probe/p.c"
printf '#include <omp.h>\nint omp_probe(void) { return omp_get_max_threads(); }\n' >"$probe/o.c"
if ! "$CC_FUZZ" -fsanitize=fuzzer,address -fopenmp "$probe/p.c" "$probe/o.c" -o "$probe/p" \
    >"$probe/log" 2>&1; then
  echo "fuzz.sh: $CC_FUZZ cannot link an OpenMP libFuzzer target (needs the Debian packages" \
       "libclang-rt-14-dev and libomp-dev; run scripts/deps.sh):" >&2
  sed 's/^/  /' "$probe/log" >&2
  exit 1
fi

jobs="${JOBS:-2}"
CC="$CC_FUZZ" cmake -S . -B build-fuzz -DCT_FUZZ=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
targets=()
for f in fuzz/*.c; do
  targets+=("$(basename "$f" .c)")
done
cmake --build build-fuzz -j "$jobs" --target "${targets[@]}"

seed_image() {
  local s
  for s in tests/data/images/*.png tests/data/images/*.jpg tests/data/images/*.webp \
           tests/data/images/*.bmp tests/data/images/*.gif; do
    [ -f "$s" ] && cp -f "$s" "$1/seed-$(basename "$s")"
  done
  return 0
}

seed_parquet() {
  local s
  # The committed fixtures of at most 8 KB (-max_len): DuckDB and parquet-wasm files.
  for s in tests/data/parquet/*.parquet; do
    [ -f "$s" ] && [ "$(wc -c < "$s")" -le 8192 ] && cp -f "$s" "$1/seed-$(basename "$s")"
  done
  return 0
}

seed_safetensors() {
  local corpus="$1" s
  # Seeds: committed test files and a few small generated ones.
  for s in tests/data/*.safetensors; do
    [ -f "$s" ] && cp -f "$s" "$corpus/seed-$(basename "$s")"
  done
  hdr='{"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},"b":{"dtype":"BF16","shape":[3],"data_offsets":[16,22]},"__metadata__":{"format":"pt"}}'
  python3 - "$corpus" "$hdr" <<'PY'
import struct, sys
corpus, hdr = sys.argv[1], sys.argv[2].encode()
def st(h, data):
    return struct.pack("<Q", len(h)) + h + data
open(f"{corpus}/seed-gen-basic.safetensors", "wb").write(st(hdr, bytes(range(22))))
open(f"{corpus}/seed-gen-empty.safetensors", "wb").write(st(b"{}      ", b""))
h2 = b'{"h":{"dtype":"F16","shape":[4],"data_offsets":[0,8]},"z":{"dtype":"F32","shape":[0],"data_offsets":[8,8]}}'
open(f"{corpus}/seed-gen-f16.safetensors", "wb").write(st(h2, b"\x00\x3c\x00\xbc\xff\x7b\x01\x00"))
# Header-mode seeds (byte 0 = data size / 4, then header JSON).
open(f"{corpus}/seed-gen-hdr.bin", "wb").write(bytes([6]) + hdr)
open(f"{corpus}/seed-gen-json.json", "wb").write(b'{"a": [1, -2.5e3, "\\u00e9\\ud83d\\ude00", true, null, {}]}')
PY
}

mkdir -p build-fuzz/artifacts
status=0
for t in "${targets[@]}"; do
  corpus="fuzz-corpus/$t"
  mkdir -p "$corpus"
  case "$t" in
    fuzz_image|fuzz_image_header) seed_image "$corpus" ;;
    fuzz_bpe)
      { cat tests/data/bpe/merges.txt; printf '\0A Small RED circle, it'"'"'s 3.14 <|endoftext|> caf\xc3\xa9!'; } > "$corpus/seed-merges-text"
      printf 'a b\nab c\0abc abcabc ab!c' > "$corpus/seed-small" ;;
    fuzz_parquet) seed_parquet "$corpus" ;;
    fuzz_yaml) cp -f tests/data/realcfg/accelerate/* "$corpus/" ;;
    fuzz_s3_list)
      printf 'p<?xml version="1.0"?><ListBucketResult><Name>b</Name><Prefix>p/</Prefix><Contents><Key>p/a/1.png</Key><Size>12</Size></Contents><Contents><Key>p/caf&#233; &amp; x.txt</Key><Size>3</Size></Contents><IsTruncated>true</IsTruncated><NextContinuationToken>tok=</NextContinuationToken></ListBucketResult>' > "$corpus/seed-page" ;;
    fuzz_config_toml) # byte 0: even = config.toml, odd = config.env
      for s in tests/data/toml/*/*.toml; do { printf '\x00'; cat "$s"; } > "$corpus/seed-$(basename "$s")"; done
      for s in tests/data/realcfg/simpletuner/*.env; do { printf '\x01'; cat "$s"; } > "$corpus/seed-$(basename "$s")"; done ;;
    *) seed_safetensors "$corpus" ;;
  esac
  dict=()
  [ -f "fuzz/${t#fuzz_}.dict" ] && dict=(-dict="fuzz/${t#fuzz_}.dict")
  echo "fuzz.sh: running $t for ${secs}s (corpus $corpus)"
  log="build-fuzz/$t.log"
  if OMP_NUM_THREADS=1 ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1}" \
      "build-fuzz/$t" -max_total_time="$secs" -max_len=8192 -timeout=10 -rss_limit_mb=2048 \
      -print_final_stats=1 -artifact_prefix=build-fuzz/artifacts/ "${dict[@]}" "$corpus" \
      >"$log" 2>&1; then
    runs="$(grep -Eo 'Done [0-9]+ runs in [0-9]+ second' "$log" | tail -1 || true)"
    echo "fuzz.sh: $t: no crash (${runs:-see $log})"
  else
    echo "fuzz.sh: $t: FAILED; last lines of $log:" >&2
    tail -40 "$log" >&2
    status=1
  fi
done
exit $status
