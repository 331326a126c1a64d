#!/usr/bin/env bash
# The one script for a GPU window (make gpu-check; docs/cuda.md): everything
# the CUDA backend is checked by on a GPU, in one call of about 7 minutes on an
# H100, ending with a short summary. Run from the repository root on the GPU
# machine; writes $OUT (default gpu-check-out/): summary.txt, build.log,
# ops.log, parity.log, bench.log.
#   1. binaries: the pack carried from a CPU machine (scripts/gpu_pack.sh:
#      .gpu-pack/ctuner-gpu.tar.xz, built with the pinned CUDA 13.0 wheels; the
#      GPU image lacks ctuner's Debian libraries), else a build here
#   2. every op of cuda and cuda-bf16 against the references (ct_tests
#      backend), and against the CPU at model-sized shapes, twice -> same bits
#      (ct_tests device)
#   3. training parity, cpu vs cuda (scripts/gpu_parity.sh): fp32 within 1e-4
#      per step, bf16 within 2e-2, LoRA, rerun bit-identical, checkpoints
#      resumed across devices
#   4. bench step, preset bench: cuda fp32 and bf16 beside PyTorch on the same
#      card (eager fp32, eager bf16, torch.compile bf16)
# Each part has its own timeout, so one hang costs only its share.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-check-out}
mkdir -p "$OUT"
S=$OUT/summary.txt
: >"$S"
T0=$(date +%s)
say() { echo "$*" | tee -a "$S"; }
part() { say "== $1 ($(($(date +%s) - T0)) s)"; }
PY=python3
say "gpu_check $(git rev-parse --short HEAD 2>/dev/null || echo '?') $(date -u +%FT%TZ)"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader 2>&1 | tee -a "$S"

part "1 binaries"
cudalib=$(find /opt /usr/local /usr/lib -name 'libcublasLt.so.13' -print -quit 2>/dev/null)
cudalib=${cudalib%/*}
if [ -f .gpu-pack/ctuner-gpu.tar.xz ]; then
  tar -xJf .gpu-pack/ctuner-gpu.tar.xz
  src=$(cat build-gpu/source_dir)
  if [ "$src" != "$PWD" ] && [ ! -e "$src" ]; then mkdir -p "${src%/*}" && ln -s "$PWD" "$src"; fi
  export LD_LIBRARY_PATH=$PWD/build-gpu/lib:$cudalib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  say "pack: build-gpu from .gpu-pack (built $(stat -c %y build-gpu/ctuner | cut -d. -f1)); CUDA libraries: $cudalib"
else
  nvcc=$(command -v nvcc || ls /usr/local/cuda*/bin/nvcc 2>/dev/null | head -1)
  gen=$(command -v ninja >/dev/null && echo "-G Ninja")
  { cmake -S . -B build-gpu $gen -DCMAKE_BUILD_TYPE=Release -DCT_CUDA=ON -DCMAKE_CUDA_COMPILER="$nvcc" &&
    cmake --build build-gpu -j 16 --target ctuner_cli ct_tests ct_fake_nvml; } >"$OUT/build.log" 2>&1 ||
    { say "BUILD FAILED (no pack carried; the image may lack ctuner's Debian libraries): see build.log"; tail -20 "$OUT/build.log"; }
fi
B=build-gpu
"$B/ctuner" bench step --preset tiny --steps 1 --warmup 0 --backend cuda >"$OUT/build.log" 2>&1 &&
  say "cuda backend: $(grep -o '"device": "[^"]*"' "$OUT/build.log")" ||
  say "cuda backend NOT usable: $(tail -2 "$OUT/build.log")"

part "2 ops"
timeout 150 "$B/ct_tests" backend >"$OUT/ops.log" 2>&1
say "ct_tests backend rc=$?"
timeout 120 "$B/ct_tests" device >>"$OUT/ops.log" 2>&1
say "ct_tests device rc=$?"
grep -E 'FAIL|CHECK failed|REQUIRE failed|not supported|differ|^[0-9]+ test' "$OUT/ops.log" | head -25 | tee -a "$S"

part "3 parity"
timeout 170 env PYTHON=$PY scripts/gpu_parity.sh "$B/ctuner" >"$OUT/parity.log" 2>&1
say "parity rc=$?"
grep -E '^(ok|FAIL)' "$OUT/parity.log" | cut -c1-200 | tee -a "$S"

part "4 bench"
{
  timeout 60 "$B/ctuner" bench peak --backend cuda
  for mp in no bf16; do
    timeout 60 "$B/ctuner" bench step --preset bench --backend cuda --mixed_precision $mp --steps 30 --warmup 5
  done
  for args in "" "--bf16" "--bf16 --compile"; do
    PYTHONUNBUFFERED=1 timeout 120 $PY scripts/mmdit_torch.py bench --preset bench --device cuda $args --steps 30 --warmup 5
  done
  # FLUX.1-dev shaped (12B random weights, bf16 base on the device), LoRA rank 16, batch 1
  for res in 512 1024; do
    timeout 200 "$B/ctuner" bench step --preset flux-dev --lora 16 --base bf16 --res $res --batch 1 --txt_len 512 \
      --backend cuda --mixed_precision bf16 --gradient_checkpointing 1 --steps 3 --warmup 1
  done
} >"$OUT/bench.log" 2>&1
grep -E '^\{' "$OUT/bench.log" | $PY -c "$(cat <<'PY'
import json, sys
for l in sys.stdin:
    d = json.loads(l)
    if "vendor_bf16_tflops" in d:
        print("peak: cuBLASLt bf16 %.0f TFLOP/s, fp32 %.1f; ours sgemm fp32 %.1f, bf16 %.0f (%.2f of cuBLASLt); copy %.0f GB/s"
              % (d["vendor_bf16_tflops"], d["vendor_fp32_tflops"], d["sgemm_fp32_tflops"], d["sgemm_bf16_tflops"],
                 d["sgemm_bf16_over_vendor"], d["copy_gbs"]))
        continue
    who = d.get("peer", "ctuner " + d.get("backend", "")) + (" compile" if d.get("compile") else "")
    if d.get("lora_rank"):
        who += " %s lora%d %dpx" % (d["preset"], d["lora_rank"], d["latent"] * 8)
    prec = "bf16" if d.get("bf16") or d.get("mixed_precision") == "bf16" else "fp32"
    print("%-22s %s %9.3f ms/step (min %.3f), device peak %s MB" % (who, prec, d["ms_per_step_median"],
          d["ms_per_step_min"], d.get("device_peak_mb", "?")))
PY
)" | tee -a "$S"
say "total $(($(date +%s) - T0)) s"
