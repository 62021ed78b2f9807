#!/usr/bin/env bash
# Installs Largo from a build tree into a temporary prefix, builds one of examples/ against it
# with find_package(largo), and trains it in each of the given modes at the given number of
# ranks (started by the installed `largo launch`). Each run's loss must fall by 20 %.
# Usage: training_example_test.sh SOURCE_DIR BUILD_DIR EXAMPLE MODE:RANKS...
#   e.g. training_example_test.sh . build device_mesh_loop tp_dp:4 tp_pp:4 tp_pp:8
set -euo pipefail
source_dir="$1"; build_dir="$2"; example="$3"; shift 3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --install "$build_dir" --prefix "$work/prefix" > "$work/install.log"
cmake -S "$source_dir/examples/$example" -B "$work/build" -G Ninja \
  -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$work/prefix" > "$work/configure.log" 2>&1 \
  || { cat "$work/configure.log"; exit 1; }
cmake --build "$work/build" > "$work/build.log" 2>&1 || { cat "$work/build.log"; exit 1; }
for run in "$@"; do
  mode=${run%:*} procs=${run#*:} log="$work/$mode-$procs.log"
  OMP_NUM_THREADS=1 "$work/prefix/bin/largo" launch --nproc_per_node "$procs" -- \
    "$work/build/$example" "$mode" > "$log" 2>&1 \
    || { cat "$log"; exit 1; }
  cat "$log"
  # "loss 2.3010 -> 1.2000 (...)": the mean of the last steps must be below the first's.
  read -r before after < <(sed -n 's/^loss \([0-9.]*\) -> \([0-9.]*\) .*/\1 \2/p' "$log")
  if [ -z "${before:-}" ] || ! awk -v a="$after" -v b="$before" 'BEGIN { exit !(a < 0.8 * b) }'; then
    echo "$example $mode at $procs ranks: the loss did not fall by 20 % (${before:-?} -> ${after:-?})"
    exit 1
  fi
done
