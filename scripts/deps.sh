#!/usr/bin/env bash
# Installs every Debian package ctuner's build, tests and benchmarks need.
#   scripts/deps.sh          install what is missing (apt-get as root; otherwise
#                            print the exact sudo line and fail)
#   scripts/deps.sh --check  only report; exit 1 if something is missing
# Idempotent: installed packages are skipped.
set -euo pipefail

BUILD_PKGS=(build-essential cmake pkg-config libopenblas-openmp-dev libpng-dev libjpeg62-turbo-dev libwebp-dev libgif-dev
            zlib1g-dev libzstd-dev libsnappy-dev libssl-dev libcurl4-openssl-dev libopenmpi-dev openmpi-bin
            libyaml-dev libmicrohttpd-dev)
TEST_PKGS=(python3 python3-torch python3-numpy python3-pil clang clang-format libclang-rt-14-dev libomp-dev iproute2 util-linux
           chromium)
PKGS=("${BUILD_PKGS[@]}" "${TEST_PKGS[@]}")

check_only=0
[ "${1:-}" = "--check" ] && check_only=1

missing=()
for p in "${PKGS[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

# Node.js and npm run the independent parquet writers of the tests (DuckDB,
# parquet-wasm; scripts/npm_deps.sh). A machine may have them from elsewhere
# (NodeSource); only a missing command pulls in Debian's packages.
if ! command -v npm >/dev/null 2>&1 || ! command -v node >/dev/null 2>&1; then
  missing+=(nodejs npm)
fi

if [ ${#missing[@]} -eq 0 ]; then
  echo "deps: all ${#PKGS[@]} packages present"
  exit 0
fi

echo "deps: missing: ${missing[*]}"
if [ $check_only -eq 1 ]; then
  exit 1
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "deps: not root; run:"
  echo "  sudo apt-get install -y ${missing[*]}"
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "deps: installed ${missing[*]}"
