#!/usr/bin/env bash
# Configures and builds Largo (Release) into build/ (or $LARGO_BUILD_DIR). Extra
# arguments go to CMake's configure step, e.g. -DLARGO_SANITIZE=ON.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir="${LARGO_BUILD_DIR:-build}"
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release "$@"
start=$(date +%s)
cmake --build "$build_dir" -j "$(nproc)"
echo "build.sh: built $build_dir in $(( $(date +%s) - start )) s"
