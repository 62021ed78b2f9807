#!/usr/bin/env bash
# Runs GoogleTest executables, each as two processes at once, and prints the log of every
# process that fails. Usage:
#   scripts/run_test_shards.sh <directory of the executables> <executable>...
# CI uses it instead of ctest's process per test: a process spends ~1 s loading libtorch
# (~2 s sanitized), nearly half of what the suite cost over ~1100 tests.
# The two processes take alternate tests of the executable's list, named in --gtest_filter
# (not GoogleTest's GTEST_SHARD_* variables, which the ranks a multi-process test spawns
# from its executable would inherit and obey). LARGO_SHARD_TIMEOUT (seconds, default 2400)
# stops a process that hangs.
set -uo pipefail
timeout_s="${LARGO_SHARD_TIMEOUT:-2400}"
dir="$1"
shift
logs=$(mktemp -d)
# The peaks the trainer measures for its MFU (core/peak_flops.h), measured here beside other
# tests, go to a cache of the suite's own, not the one users' runs read.
export LARGO_CACHE_DIR="${LARGO_CACHE_DIR:-$logs/cache}"
failed=()
for executable in "$@"; do
  # --gtest_list_tests prints "Suite." lines, each followed by its tests indented by two.
  if ! tests=$(cd "$dir" && "./$executable" --gtest_list_tests |
      awk '/^[A-Za-z0-9_\/]+\.$/ { suite = $1 } /^  [A-Za-z0-9_\/]/ { print suite $1 }'); then
    failed+=("$executable (could not list its tests)")
    continue
  fi
  pids=()
  for half in 0 1; do
    filter=$(echo "$tests" | awk -v half=$half 'NR % 2 == half' | paste -sd:)
    if [ -z "$filter" ]; then # an empty filter would run every test
      echo "[  PASSED  ] 0 tests." > "$logs/$executable.$half.log"
      true &
      pids+=($!)
      continue
    fi
    (cd "$dir" && timeout --kill-after=30 "$timeout_s" \
      "./$executable" --gtest_brief=1 "--gtest_filter=$filter" \
      > "$logs/$executable.$half.log" 2>&1) &
    pids+=($!)
  done
  for half in 0 1; do
    log="$logs/$executable.$half.log"
    if wait "${pids[$half]}"; then
      echo "$executable, half $half: $(grep -E '^\[  PASSED  \]' "$log" | tail -1)"
    else
      failed+=("$executable, half $half")
      echo "$executable, half $half FAILED (a test, or the $timeout_s s limit); its log:"
      cat "$log"
    fi
  done
done
rm -rf "$logs"
if [ "${#failed[@]}" -ne 0 ]; then
  printf 'run_test_shards.sh: failed: %s\n' "${failed[@]}"
  exit 1
fi
echo "run_test_shards.sh: $# executables passed"
