#!/usr/bin/env bash
# Builds, on this (CPU) machine, the programs scripts/gpu_check.sh runs on a GPU machine, and
# packs them into .gpu_prebuilt/ to travel with the working tree, so that no device time goes
# into compiling (a clean build there takes minutes of a short slot). `gpu_check.sh
# --prebuilt .gpu_prebuilt` then runs them instead of configuring and building.
#
# What is packed: every test suite that holds a CUDA test (the same list gpu_check.sh builds),
# precision_bench, batch_norm_relu_bench, transformer_fusions_bench, attention_backend_bench and
# the largo program, stripped, their RUNPATH pointing first at ../.gpu_deps (scripts/gpu_deps.sh: yaml-cpp, spdlog, fmt, libjpeg, libpng of Debian 12) and
# then where this machine's libtorch is; gpu_check.sh links that site-packages folder to the GPU
# machine's own (whose nvidia/ folder holds the CUDA libraries libtorch loads from $ORIGIN/../..) (the same release, 2.11 with CUDA 13: MANIFEST records what they were built
# against, and gpu_check.sh refuses another version). The programs were also compiled with
# this checkout's path for the test data (tests/CMakeLists.txt); gpu_check.sh links it too.
#
# Usage: scripts/gpu_prebuild.sh [OUT_DIR]     (default .gpu_prebuilt; needs scripts/build.sh's
#        dependencies and patchelf, which it installs with apt-get when missing)
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
out="${1:-.gpu_prebuilt}"
source scripts/torch_env.sh
if ! command -v patchelf > /dev/null; then
  apt-get install -y patchelf > /dev/null 2>&1 || { apt-get update > /dev/null && apt-get install -y patchelf > /dev/null; }
fi

mapfile -t layers < <(bash scripts/gpu_check.sh --list-layers)
targets=(largo precision_bench batch_norm_relu_bench transformer_fusions_bench attention_backend_bench)
for layer in "${layers[@]}"; do targets+=("largo_${layer}_tests"); done
# The targets need LARGO_BUILD_TESTS and LARGO_BUILD_BENCH, which another configure of this
# folder (the default job's) may have turned off.
LARGO_BUILD_TARGETS="${targets[*]}" bash scripts/build.sh -DLARGO_WITH_NCCL=ON -DLARGO_BUILD_BENCH=ON -DLARGO_BUILD_TESTS=ON > /dev/null
build=${LARGO_BUILD_DIR:-build}

rm -rf "$out"
mkdir -p "$out/tests" "$out/bench"
pack() { # built program -> its place under $out; depth: how far below $out it lies
  local from=$1 to=$2 up=$3 runpath
  cp "$from" "$out/$to"
  strip "$out/$to"
  runpath=$(patchelf --print-rpath "$out/$to")
  patchelf --set-rpath "\$ORIGIN/${up}.gpu_deps/usr/lib/x86_64-linux-gnu:$runpath" "$out/$to"
}
pack "$build/largo" largo "../"
pack "$build/bench/precision_bench" bench/precision_bench "../../"
pack "$build/bench/batch_norm_relu_bench" bench/batch_norm_relu_bench "../../"
pack "$build/bench/transformer_fusions_bench" bench/transformer_fusions_bench "../../"
pack "$build/bench/attention_backend_bench" bench/attention_backend_bench "../../"
for layer in "${layers[@]}"; do
  pack "$build/tests/largo_${layer}_tests" "tests/largo_${layer}_tests" "../../"
done
# The folder that holds torch/ and the nvidia/ CUDA libraries libtorch finds from $ORIGIN.
torch_site=$("$LARGO_PYTHON" -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')
{
  echo "# scripts/gpu_prebuild.sh, $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo '+local-changes')"
  echo "torch $("$LARGO_PYTHON" -c 'import torch; print(torch.__version__)')"
  echo "torch_site $torch_site"
  echo "source_dir $repo"
  echo "glibc $(getconf GNU_LIBC_VERSION | awk '{print $2}')"
  echo "layers ${layers[*]}"
} > "$out/MANIFEST"
echo "gpu_prebuild: $out is $(du -sk "$out" | cut -f1) KiB ($(git rev-parse --short HEAD)); carry it with .gpu_deps:"
echo "  run(command=\"bash scripts/gpu_check.sh --prebuilt $out\", carry=[\".gpu_deps\", \"$out\"], timeout_s=600)"
