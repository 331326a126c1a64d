#!/usr/bin/env bash
# Runs every libFuzzer target in fuzz/ (ASan + UBSan; every UBSan report is
# fatal: the build's -fno-sanitize-recover=all, and halt_on_error=1 below) for SECONDS each, one
# after the other, each in a single process (no -jobs; make fuzz-long: 600 s each).
#   scripts/fuzz.sh [SECONDS [TARGET...]]   default 60 s, every target
# Builds into build-fuzz/ with clang (-DCT_FUZZ=ON), seeds fuzz-corpus/<target>/
# (fuzz_safetensors: tests/data/*.safetensors plus a few small generated files;
# fuzz_image and fuzz_image_header: the PNG/JPEG/WebP/BMP/GIF fixtures in
# tests/data/images/; fuzz_bpe: the test
# merges.txt plus a caption; fuzz_config_toml: tests/data/toml and the real
# config.env files; fuzz_parquet: tests/data/parquet/*.parquet up to
# 8 KB, the -max_len; fuzz_s3_list: a ListObjectsV2 page; fuzz_yaml: the real
# Accelerate configs of tests/data/realcfg/accelerate/; fuzz_spm: the test
# T5 tokenizer's spiece.model and tokenizer.json and a text; fuzz_config: the
# demo's config.json and multidatabackend.json and a DeepSpeed JSON), and fails
# if a target reports a crash, leak or sanitizer error. Crash inputs are kept
# in build-fuzz/artifacts/ for reproduction: build-fuzz/<target> <file>. Each
# target's result (runs, exec/s, coverage, corpus) is one line of
# build-fuzz/results.txt (docs/reliability.md records them).
set -euo pipefail

secs="${1:-60}"
[ $# -gt 0 ] && shift
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
if [ $# -gt 0 ]; then
  for t in "$@"; do
    [ -f "fuzz/$t.c" ] || { echo "fuzz.sh: no target $t (fuzz/$t.c)" >&2; exit 2; }
    targets+=("$t")
  done
else
  for f in fuzz/*.c; do
    targets+=("$(basename "$f" .c)")
  done
fi
cmake --build build-fuzz -j "$jobs" --target "${targets[@]}"

# One line per target: name, seconds, runs, exec/s, coverage (edges, features),
# corpus entries, verdict.
result() {
  local last runs eps
  last="$(grep -E '^#[0-9]+' "$2" | tail -1 || true)"
  runs="$(grep -Eo 'stat::number_of_executed_units: *[0-9]+' "$2" | grep -Eo '[0-9]+$' || echo "${last%%[^#0-9]*}")"
  eps="$(grep -Eo 'stat::average_exec_per_sec: *[0-9]+' "$2" | grep -Eo '[0-9]+$' || true)"
  printf '%s\t%ss\truns %s\texec/s %s\t%s\t%s\t%s\n' "$1" "$secs" "${runs#\#}" "${eps:-?}" \
    "$(echo "$last" | grep -Eo 'cov: [0-9]+ ft: [0-9]+' || true)" "$(echo "$last" | grep -Eo 'corp: [0-9]+/[0-9]+[a-zA-Z]*' || true)" "$3"
}

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

seed_config() {
  local c="$1"
  # byte 0 picks the reader: 0 config.json, 1 multidatabackend.json, 2 inline DeepSpeed
  { printf '\0'; cat examples/demo/config.json; } > "$c/seed-config"
  { printf '\0'; cat examples/vae_latent/vae.json; } > "$c/seed-config-vae"
  { printf '\1'; cat examples/demo/multidatabackend.json; } > "$c/seed-backend"
  printf '\1[{"id": "a", "type": "local", "instance_data_dir": "d", "caption_strategy": "filename", "repeats": 2, "crop": true, "crop_style": "center", "crop_aspect": "square", "resolution": 512, "resolution_type": "pixel", "cache_dir_vae": "c/{model_family}", "text_embeds": "t"}, {"id": "t", "type": "local", "dataset_type": "text_embeds", "default": true, "cache_dir": "tc"}]' > "$c/seed-backend2"
  printf '\6"train_batch_size": 8, "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": 1, "gradient_clipping": 1.0, "zero_optimization": {"stage": 3, "reduce_bucket_size": 5000, "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "nvme", "nvme_path": "/tmp"}}, "bf16": {"enabled": true}, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.01}}, "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 10}}}' > "$c/seed-ds"
}

mkdir -p build-fuzz/artifacts
: > build-fuzz/results.txt
status=0
for t in "${targets[@]}"; do
  corpus="fuzz-corpus/$t"
  mkdir -p "$corpus"
  case "$t" in
    fuzz_image|fuzz_image_header) seed_image "$corpus" ;;
    fuzz_bpe)
      { cat tests/data/bpe/merges.txt; printf '\0A Small RED circle, it'"'"'s 3.14 <|endoftext|> caf\xc3\xa9!'; } > "$corpus/seed-merges-text"
      { cat tests/data/bpe/merges.txt; printf '\0\xce\xa3\xce\x9f\xce\xa6\xce\x99\xce\x91 e\xcc\x81 \xe4\xb8\xad\xe6\x96\x87 \xef\xac\x81 \xc4\xb0 \xcd\x85 \xf0\x9f\x98\x80\x01\xed\xa0\x80'; } > "$corpus/seed-merges-unicode"
      printf 'a b\nab c\0abc abcabc ab!c' > "$corpus/seed-small" ;;
    fuzz_parquet) seed_parquet "$corpus" ;;
    fuzz_yaml) cp -f tests/data/realcfg/accelerate/* "$corpus/" ;;
    fuzz_spm) # byte 0: 0 spiece.model, 1 tokenizer.json, 2 text for the test tokenizer
      { printf '\x00'; cat tests/data/t5/tokenizer_2/spiece.model; } > "$corpus/seed-spiece"
      { printf '\x01'; cat tests/data/t5/tokenizer_2/tokenizer.json; } > "$corpus/seed-json"
      printf '\x02A Small RED circle, it'"'"'s 3.14 </s> caf\xc3\xa9!' > "$corpus/seed-text" ;;
    fuzz_config) seed_config "$corpus" ;;
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
      UBSAN_OPTIONS="${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}" \
      "build-fuzz/$t" -max_total_time="$secs" -max_len=8192 -timeout=10 -rss_limit_mb=2048 \
      -print_final_stats=1 -artifact_prefix=build-fuzz/artifacts/ "${dict[@]}" "$corpus" \
      >"$log" 2>&1; then
    runs="$(grep -Eo 'Done [0-9]+ runs in [0-9]+ second' "$log" | tail -1 || true)"
    echo "fuzz.sh: $t: no crash (${runs:-see $log})"
    result "$t" "$log" "no crash" >> build-fuzz/results.txt
  else
    echo "fuzz.sh: $t: FAILED; last lines of $log:" >&2
    tail -40 "$log" >&2
    result "$t" "$log" "FAILED" >> build-fuzz/results.txt
    status=1
  fi
done
exit $status
