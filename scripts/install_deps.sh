#!/usr/bin/env bash
# Installs everything Largo needs to build, test and benchmark on Debian 12, from
# Debian's archive only (`--bench` adds what only the image-pipeline benchmark needs), and
# points libblas.so.3 / liblapack.so.3 at OpenBLAS's OpenMP build. Idempotent: when every
# package is present and the alternatives are set it does nothing (and needs no network).
set -euo pipefail

packages=(
  build-essential cmake ninja-build ccache pkg-config
  libtorch-dev libgloo-dev            # libtorch 1.13 (CPU) and the Gloo headers
  # Debian's libtorch sends float32 matrix multiplies to whatever libblas.so.3 is; OpenBLAS's
  # OpenMP build follows at::set_num_threads (docs/performance.md, "Which BLAS"). The
  # reference BLAS stays installed for comparisons (and the machine report's test).
  libopenblas0-openmp libblas3
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

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
if [ ${#missing[@]} -eq 0 ]; then
  echo "install_deps: all ${#packages[@]} packages present"
else
  echo "install_deps: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# Select OpenBLAS (OpenMP) explicitly: in "auto" mode the highest priority wins, and another
# BLAS package installed later (OpenBLAS's pthreads build has priority 100, above the OpenMP
# build's 95) would take over silently.
multiarch="$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)"
for name in libblas.so.3 liblapack.so.3; do
  target="/usr/lib/$multiarch/openblas-openmp/$name"
  if [ "$(readlink -f "/usr/lib/$multiarch/$name")" != "$target" ] ||
     ! update-alternatives --query "$name-$multiarch" | grep -q "^Status: manual"; then
    $SUDO update-alternatives --set "$name-$multiarch" "$target"
  fi
done
