#!/usr/bin/env bash
# README command 2: install, build, and run the whole test suite, then the layer suites
# again under AddressSanitizer + UndefinedBehaviorSanitizer (skip that second part with
# LARGO_SKIP_SANITIZERS=1).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
# LARGO_WITH_NCCL=ON: configuring stops with an error unless the libtorch found has CUDA and
# c10d's NCCL process group, so the suite cannot pass on a Gloo-only build (under the default,
# AUTO, a CPU libtorch would silently give one); so does LARGO_CUDA_KERNELS=ON without Largo's
# CUDA kernels. LARGO_WITH_NCCL=AUTO in the environment lets the suite run against a CPU
# libtorch (and sets both to AUTO).
bash scripts/build.sh -DLARGO_BUILD_TESTS=ON -DLARGO_BUILD_BENCH=ON \
  "-DLARGO_WITH_NCCL=${LARGO_WITH_NCCL:-ON}" "-DLARGO_CUDA_KERNELS=${LARGO_WITH_NCCL:-ON}"
start=$(date +%s)
# One cache for the measured peaks of every suite below (scripts/run_test_shards.sh says why).
export LARGO_CACHE_DIR="${LARGO_CACHE_DIR:-$(mktemp -d)}"
# The GoogleTest suites (an executable per layer) run through scripts/run_test_shards.sh,
# which says why; ctest runs the tests that are not GoogleTest's (docs.*, install.*, train.*).
others='^(docs|install|train)\.'
# GoogleTest's names start with their suite's capital; any other test must be one of $others.
left_out=$(ctest --test-dir build -N | sed -n 's/^ *Test *#[0-9]*: //p' | grep -v '^[A-Z]' |
  grep -v -E "$others" || true)
if [ -n "$left_out" ]; then
  echo "run_tests.sh: tests this script would not run (add them to \$others): $left_out"
  exit 1
fi
bash scripts/run_test_shards.sh build/tests $(cd build/tests && ls largo_*_tests)
ctest --test-dir build --output-on-failure -j 2 -R "$others"
echo "run_tests.sh: the Release suite ran in $(( $(date +%s) - start )) s"

if [ "${LARGO_SKIP_SANITIZERS:-0}" != "1" ]; then
  # Only the layer suites run under the sanitizers (train's end-to-end runs, the program and
  # the benchmarks are covered by the Release pass), so only they are built, at -O1 with
  # line tables (file:line in reports) to keep CI's clean build well inside its time limit.
  layers="core kernels comm data models precision optim parallel checkpoint"
  LARGO_BUILD_DIR=build-sanitize LARGO_BUILD_TARGETS="$(printf 'largo_%s_tests ' $layers)" \
    bash scripts/build.sh -DLARGO_SANITIZE=ON -DLARGO_BUILD_BENCH=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1"
  start=$(date +%s)
  # libtorch itself is not instrumented; container-overflow checks need every library to be.
  ASAN_OPTIONS=detect_container_overflow=0:detect_leaks=0 UBSAN_OPTIONS=print_stacktrace=1 \
    bash scripts/run_test_shards.sh build-sanitize/tests $(printf 'largo_%s_tests ' $layers)
  echo "run_tests.sh: the sanitizer suites ran in $(( $(date +%s) - start )) s"
fi
echo "run_tests.sh: done in ${SECONDS} s (CI stops at 5400)"
