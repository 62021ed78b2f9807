#!/usr/bin/env bash
# Installs everything Largo needs to build, test and benchmark on Debian 12, from
# Debian's archive only (`--bench` adds what only the image-pipeline benchmark needs).
# Idempotent: when every package is present it does nothing (and needs no network).
set -euo pipefail

packages=(
  build-essential cmake ninja-build ccache pkg-config
  libtorch-dev libgloo-dev            # libtorch 1.13 (CPU) and the Gloo headers
  libyaml-cpp-dev libcli11-dev libspdlog-dev libfmt-dev nlohmann-json3-dev zlib1g-dev
  libjpeg62-turbo-dev libpng-dev     # image decoding (data layer)
  libgtest-dev libgmock-dev libbenchmark-dev
  dataset-fashion-mnist               # the default job's data
  python3-torch python3-torchvision python3-pil python3-yaml  # reference numerics, benchmarks, docs
  clang-format
)
# bench/run_image_pipeline_bench.sh only: the photographs its image folder is cut from.
if [ "${1:-}" = "--bench" ]; then
  packages+=(python3-skimage python3-sklearn)
fi

missing=()
for package in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$package")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install_deps: all ${#packages[@]} packages present"
  exit 0
fi

echo "install_deps: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
