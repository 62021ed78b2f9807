#!/usr/bin/env bash
# Installs Largo from a build tree into a temporary prefix, builds
# examples/custom_training_loop against it with find_package(largo), and trains it at 2 ranks
# (started by the installed `largo launch`) in each mode: DDP, ZeRO-2, FSDP and a pipeline of
# 2 stages, all with bfloat16 autocast and activation checkpointing; and at 4 ranks on a 2-D
# mesh, tensor parallelism 2 x DDP 2. Each run's loss must fall.
# Usage: custom_training_loop_test.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
source_dir="$1"; build_dir="$2"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --install "$build_dir" --prefix "$work/prefix" > "$work/install.log"
cmake -S "$source_dir/examples/custom_training_loop" -B "$work/build" -G Ninja \
  -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$work/prefix" > "$work/configure.log" 2>&1 \
  || { cat "$work/configure.log"; exit 1; }
cmake --build "$work/build" > "$work/build.log" 2>&1 || { cat "$work/build.log"; exit 1; }
for run in ddp:2 zero2:2 fsdp:2 pipeline:2 tp:4; do
  mode=${run%:*} procs=${run#*:}
  OMP_NUM_THREADS=1 "$work/prefix/bin/largo" launch --nproc_per_node "$procs" -- \
    "$work/build/custom_training_loop" "$mode" > "$work/$mode.log" 2>&1 \
    || { cat "$work/$mode.log"; exit 1; }
  cat "$work/$mode.log"
  # "loss 2.3010 -> 1.2000 (...)": the mean of the last steps must be below the first's.
  read -r before after < <(sed -n 's/^loss \([0-9.]*\) -> \([0-9.]*\) .*/\1 \2/p' "$work/$mode.log")
  if [ -z "${before:-}" ] || ! awk -v a="$after" -v b="$before" 'BEGIN { exit !(a < 0.8 * b) }'; then
    echo "custom_training_loop $mode: the loss did not fall by 20 % (${before:-?} -> ${after:-?})"
    exit 1
  fi
done
