#!/usr/bin/env bash
# Installs Largo from a build tree into a temporary prefix, then configures, builds and
# runs examples/find_package_consumer against it with find_package(largo).
# Usage: consumer_test.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
source_dir="$1"; build_dir="$2"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --install "$build_dir" --prefix "$work/prefix" > "$work/install.log"
cmake -S "$source_dir/examples/find_package_consumer" -B "$work/build" -G Ninja \
  -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$work/prefix" > "$work/configure.log" 2>&1 \
  || { cat "$work/configure.log"; exit 1; }
cmake --build "$work/build" > "$work/build.log" 2>&1 || { cat "$work/build.log"; exit 1; }
"$work/build/consumer"
