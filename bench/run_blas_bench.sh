#!/usr/bin/env bash
# Which BLAS Debian's libtorch should run on: every BLAS build Debian packages for
# libblas.so.3, side by side in one run, by loading each in turn (LD_LIBRARY_PATH put before
# the libblas.so.3 alternative; the machine report printed for each run names the object
# that actually defines sgemm_, so a BLAS that did not load shows up).
#
# Per BLAS: the float32 GEMM peak (bench/peak_bench, best of its shapes), the MLP's training
# step with 2 threads in one process (bench/train_throughput_bench mlp: all Linear layers),
# and the same MLP step in 2 concurrent processes x 1 thread (the default job's 2 ranks x 1
# thread; a BLAS that keeps its own thread pool oversubscribes the cores there). Ratios are
# to OpenBLAS's OpenMP build, which scripts/install_deps.sh installs and selects.
# A BLAS that is not installed is skipped (apt-get install libopenblas0-pthread
# libblis4-openmp libblis4-pthread to compare all five). Builds nothing.
#
# Usage: bench/run_blas_bench.sh [BUILD_DIR] [ROUNDS]   defaults: build 2
set -euo pipefail
build="${1:-build}"; rounds="${2:-2}"
for bin in peak_bench train_throughput_bench; do
  [ -x "$build/bench/$bin" ] || { echo "no $build/bench/$bin: build the target $bin" >&2; exit 1; }
done
lib="/usr/lib/$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)"
candidates=(openblas-openmp openblas-pthread blis-openmp blis-pthread blas)

median() { sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
json_field() { sed -n "s/.*\"$1\": *\([0-9.e+-]*\).*/\1/p"; }

declare -A gemm mlp2 mlp1x2 loaded
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg); $(nproc) cores; rounds $rounds"
for (( round = 0; round < rounds; ++round )); do
  for blas in "${candidates[@]}"; do
    [ -e "$lib/$blas/libblas.so.3" ] || continue
    export LD_LIBRARY_PATH="$lib/$blas"
    peak="$("$build/bench/peak_bench" --threads 2 --min-seconds 0.3)"
    loaded[$blas]="$(sed -n 's/.*"machine":"BLAS \([^;]*\);.*/\1/p' <<< "$peak")"
    gemm[$blas]+="$(grep '"peaks"' <<< "$peak" | sed 's/.*"gemm_float32":\([0-9.e+-]*\).*/\1/') "
    mlp2[$blas]+="$("$build/bench/train_throughput_bench" mlp --threads 2 | json_field images_per_sec) "
    # Two single-threaded processes at once: their images/s summed.
    "$build/bench/train_throughput_bench" mlp --threads 1 > /tmp/largo_blas_a.$$ &
    "$build/bench/train_throughput_bench" mlp --threads 1 > /tmp/largo_blas_b.$$
    wait
    sum="$(cat /tmp/largo_blas_a.$$ /tmp/largo_blas_b.$$ | json_field images_per_sec |
      awk '{s += $1} END {print s}')"
    mlp1x2[$blas]+="$sum "
    unset LD_LIBRARY_PATH
    echo "  round $((round + 1))/$rounds $blas done; load $(cut -d' ' -f1 /proc/loadavg)"
  done
done
rm -f /tmp/largo_blas_a.$$ /tmp/largo_blas_b.$$
echo "load average after:  $(cut -d' ' -f1-3 /proc/loadavg)"

per() { tr ' ' '\n' <<< "$1" | grep . | median; }
base_gemm="$(per "${gemm[openblas-openmp]}")"; base_mlp2="$(per "${mlp2[openblas-openmp]}")"
base_mlp1x2="$(per "${mlp1x2[openblas-openmp]}")"
printf '%-17s %12s %8s %16s %8s %19s %8s  %s\n' BLAS "GEMM GFLOP/s" ratio "mlp 1x2 img/s" ratio \
  "mlp 2x1 img/s (sum)" ratio "loaded"
for blas in "${candidates[@]}"; do
  [ -n "${gemm[$blas]:-}" ] || continue
  g="$(per "${gemm[$blas]}")"; m2="$(per "${mlp2[$blas]}")"; m1="$(per "${mlp1x2[$blas]}")"
  printf '%-17s %12.1f %7.2fx %16.1f %7.2fx %19.1f %7.2fx  %s\n' "$blas" "$g" \
    "$(echo "$g / $base_gemm" | bc -l)" "$m2" "$(echo "$m2 / $base_mlp2" | bc -l)" \
    "$m1" "$(echo "$m1 / $base_mlp1x2" | bc -l)" "${loaded[$blas]}"
done
