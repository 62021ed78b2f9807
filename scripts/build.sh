#!/usr/bin/env bash
# Configures and builds Largo (Release) into build/ (or $LARGO_BUILD_DIR) against the
# PyTorch of scripts/torch_env.sh. Extra
# arguments go to CMake's configure step, e.g. -DLARGO_SANITIZE=ON; LARGO_BUILD_TARGETS
# limits what is built.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/torch_env.sh
build_dir="${LARGO_BUILD_DIR:-build}"
# ccache: paths under the checkout are hashed relative to it, so every clone (CI's, a
# worktree) shares one cache; the sloppiness lets it cache compiles that use the
# precompiled header, which it otherwise refuses.
export CCACHE_BASEDIR="$PWD"
export CCACHE_NOHASHDIR=1
export CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime
# ccache also hashes the locale variables (they change the compiler's messages): one locale
# here lets CI, whatever its environment's LANG, hit what a session's build cached. (CI's
# first run after the cache-sharing change missed every object for want of this.)
export LANG=C.UTF-8
unset LC_ALL LC_CTYPE LC_MESSAGES
# And one spelling of the CUDA toolkit's path. libtorch's CMake files take the toolkit from
# the first nvcc on PATH: a session's shell finds /usr/local/cuda/bin/nvcc, CI's environment
# this machine's /usr/local/bin/nvcc (a wrapper of /usr/local/cuda-13.0's), and that include
# path in every compile made CI miss every object the sessions had cached.
if [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release "-DLARGO_PYTHON=$LARGO_PYTHON" "$@"
start=$(date +%s)
# LARGO_BUILD_TARGETS (space-separated) builds only those targets, e.g. the sanitizer pass's
# test suites.
targets=()
for target in ${LARGO_BUILD_TARGETS:-}; do
  targets+=(--target "$target")
done
cmake --build "$build_dir" -j "$(nproc)" "${targets[@]}"
echo "build.sh: built $build_dir in $(( $(date +%s) - start )) s"
