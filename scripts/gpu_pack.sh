#!/usr/bin/env bash
# Builds ctuner with the CUDA backend HERE (no GPU needed) and packs it for the
# GPU machine, whose image has nvcc and CUDA's libraries but not ctuner's Debian
# ones (OpenBLAS, libpng, libmicrohttpd, ...) and no network to fetch them:
#   scripts/gpu_pack.sh            -> .gpu-pack/ctuner-gpu.tar.xz (about 15 MB)
# The tarball holds build-gpu/{ctuner,ct_tests,libnvidia-ml-fake.so} (stripped,
# generic x86-64: CT_NATIVE=OFF) and build-gpu/lib/ with every shared library
# they need except glibc's own and CUDA's (libcudart, libcublas(Lt): the GPU
# machine's, found by scripts/gpu_check.sh), and the source directory the
# tests were compiled with (they read tests/data through it).
# Then a device run carries .gpu-pack (see scripts/gpu_check.sh, docs/cuda.md).
# .gpu-pack is listed in .git/info/exclude so that git ignores it.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(scripts/cuda_deps.sh)
B=build-gpu
cmake -S . -B $B -DCMAKE_BUILD_TYPE=Release -DCT_WERROR=ON -DCT_CUDA=ON -DCT_NATIVE=OFF \
  -DCMAKE_CUDA_COMPILER="$root/bin/nvcc" >/dev/null
cmake --build $B -j "$(nproc)" --target ctuner_cli ct_tests ct_fake_nvml
rm -rf .gpu-pack && mkdir -p .gpu-pack/build-gpu/lib
grep -qx '/.gpu-pack/' .git/info/exclude 2>/dev/null || echo '/.gpu-pack/' >>.git/info/exclude
cp $B/ctuner $B/ct_tests $B/libnvidia-ml-fake.so .gpu-pack/build-gpu/
strip .gpu-pack/build-gpu/ctuner .gpu-pack/build-gpu/ct_tests
skip='^(libc|libm|libdl|librt|libpthread|ld-linux-x86-64|libgcc_s|libstdc\+\+|libcudart|libcublas|libcublasLt)\.so'
ldd $B/ctuner $B/ct_tests | awk '/=> \//{print $1, $3}' | sort -u | while read -r name path; do
  [[ $name =~ $skip ]] && continue
  cp -L "$path" ".gpu-pack/build-gpu/lib/$name"
done
echo "$PWD" >.gpu-pack/build-gpu/source_dir
tar -C .gpu-pack -cJf .gpu-pack/ctuner-gpu.tar.xz build-gpu
rm -rf .gpu-pack/build-gpu
ls -la .gpu-pack/ctuner-gpu.tar.xz
