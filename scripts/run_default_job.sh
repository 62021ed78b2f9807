#!/usr/bin/env bash
# README command 1: install, build, and train the default job (a small CNN on
# Fashion-MNIST, 2 worker processes, >= 91 % test top-1 in about 2 minutes of training on 2 CPU cores).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
# AUTO: the NCCL backend when libtorch has it, whatever scripts/run_tests.sh (which insists
# on it) left in build/'s CMake cache; the default job trains over Gloo.
bash scripts/build.sh -DLARGO_BUILD_TESTS=OFF -DLARGO_BUILD_BENCH=OFF -DLARGO_WITH_NCCL=AUTO
exec ./build/largo train "$@"
