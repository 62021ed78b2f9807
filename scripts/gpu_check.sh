#!/usr/bin/env bash
# The one prepared script that runs every GPU check of Largo on a machine with a CUDA GPU:
# configure against that machine's own PyTorch, build only what the checks need, run the CUDA
# tests and the GPU benchmark, and write one report. Made for the GPU image (PyTorch 2.11 +
# CUDA 13 in its python3, CMake, ninja, nvcc, no package registry) and for any user with a GPU.
#
# The libraries such an image lacks come in .gpu_deps/, prepared on a Debian 12 machine with
# network access by scripts/gpu_deps.sh; it must travel with the working tree (the device
# tool's `carry: [".gpu_deps"]`). docs/gpu.md says how to run it; --plan prints what it does.
#
# The whole run stays under a time budget (default 540 s, inside the device tool's 600 s per
# call; a second, shorter run with --skip-bench fits in the rest of a 15-minute slot): every
# step has a timeout, capped by what is left of the budget.
#
# Exit status: 0 every check passed; 1 a check failed or timed out; 2 no CUDA GPU here (one
# line, nothing built); 64 a usage error.
set -euo pipefail
invoked_from=$PWD
cd "$(dirname "$0")/.."
repo=$PWD

usage() {
  cat <<'EOF'
usage: scripts/gpu_check.sh [--plan] [--report PATH] [--build-dir DIR] [--deps DIR]
                            [--python PYTHON] [--jobs N] [--budget SECONDS] [--skip-bench]
                            [--build-only] [--prebuilt DIR] [--precision-sweep] [--list-layers]
                            [--benches LIST] [--filter PATTERN]
  --plan          print what would be built and run, and exit (needs no GPU)
  --report PATH   the report file (default $OUT/gpu_check_report.txt when $OUT is set,
                  else BUILD_DIR/gpu_check_report.txt)
  --build-dir DIR build folder (default build-gpu)
  --deps DIR      the unpacked libraries from scripts/gpu_deps.sh (default .gpu_deps)
  --python PY     the Python whose PyTorch is built against and runs the benchmark's
                  PyTorch side (default $LARGO_PYTHON, else python3)
  --jobs N        parallel compile jobs (default: the number of cores)
  --budget S      the whole run's time limit in seconds (default 540)
  --skip-bench    run the CUDA tests only
  --build-only    configure and build only, on any machine (no GPU needed): tries the build
                  part before spending GPU time
  --prebuilt DIR  run the programs scripts/gpu_prebuild.sh built and packed into DIR on
                  another machine instead of configuring and building here
  --precision-sweep  also run bench/run_precision_bench.sh --device cuda (ResNet-50 in fp32,
                  tf32 and O1/O2 float16/bfloat16, Largo against PyTorch)
  --list-layers   print the test layers that hold CUDA tests, and exit
  --benches LIST  which benchmarks run, of "train loader memory" (default all three)
  --profile       the train bench also profiles 3 steps of Largo and of PyTorch eager per
                  model (Kineto traces under \$OUT/profile or <build>/gpu_check_logs/profile)
                  and reports where each side's GPU time goes (bench/kernel_profile_table.py)
  --filter PAT    a GoogleTest filter for the CUDA tests (default '*Cuda*'), e.g. to rerun
                  the ones that failed
EOF
}

plan=0 build_only=0 skip_bench=0 list_layers=0 precision_sweep=0 prebuilt="" profile=0
benches="train loader memory" test_filter='*Cuda*' 
report=""
build_dir="$repo/build-gpu"
deps="$repo/.gpu_deps"
python="${LARGO_PYTHON:-python3}"
jobs=$(nproc)
budget=540
while [ $# -gt 0 ]; do
  case "$1" in
    --plan) plan=1 ;;
    --build-only) build_only=1 ;;
    --skip-bench) skip_bench=1 ;;
    --list-layers) list_layers=1 ;;
    --benches) benches="${2?--benches needs a list}"; shift ;;
    --filter) test_filter="${2:?--filter needs a pattern}"; shift ;;
    --precision-sweep) precision_sweep=1 ;;
    --profile) profile=1 ;;
    --prebuilt) prebuilt="${2:?--prebuilt needs a folder}"; shift ;;
    --report) report="${2:?--report needs a path}"; shift ;;
    --build-dir) build_dir="${2:?--build-dir needs a folder}"; shift ;;
    --deps) deps="${2:?--deps needs a folder}"; shift ;;
    --python) python="${2:?--python needs a program}"; shift ;;
    --jobs) jobs="${2:?--jobs needs a number}"; shift ;;
    --budget) budget="${2:?--budget needs seconds}"; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "gpu_check: unknown argument $1" >&2; usage >&2; exit 64 ;;
  esac
  shift
done
# Paths given on the command line are relative to where the script was started from.
absolute() { case "$1" in /*) echo "$1" ;; *) echo "$invoked_from/$1" ;; esac; }
build_dir=$(absolute "$build_dir")
if [ -n "$prebuilt" ]; then
  prebuilt=$(absolute "$prebuilt")
  build_dir=$prebuilt # the packed programs lie where a build folder's would
fi
deps=$(absolute "$deps")
if [ -n "$report" ]; then report=$(absolute "$report"); fi
if [ -z "$report" ]; then
  if [ -n "${OUT:-}" ]; then report="$OUT/gpu_check_report.txt"; else report="$build_dir/gpu_check_report.txt"; fi
fi
arch_dir=x86_64-linux-gnu
deps_lib="$deps/usr/lib/$arch_dir"

# ---- what is checked ------------------------------------------------------------------------
# The CUDA tests: every GoogleTest test whose suite or name contains "Cuda" (each skips with a
# reason where no GPU is visible, so CI never runs them). Listed from the sources, so a new
# CUDA test in any layer is built and run without touching this script; a CUDA test must
# carry "Cuda" in its name to be selected.
cuda_tests() { # prints "layer Suite.Name" for each selected test
  grep -EHo '^(TYPED_)?TEST(_F|_P)?\( *[A-Za-z0-9_]+ *, *[A-Za-z0-9_]+ *\)' "$repo"/tests/*/*_test.cpp |
    sed -E 's#^.*/tests/([a-z_]+)/[^:]*:[A-Z_]+\( *([A-Za-z0-9_]+) *, *([A-Za-z0-9_]+) *\)$#\1 \2.\3#' |
    grep -E '^[a-z_]+ [^ ]*Cuda' || true
}
mapfile -t selected < <(cuda_tests)
# --filter: only the listed tests that match one of its ':'-separated patterns (* and ?).
matches_filter() { # Suite.Name
  local pattern
  IFS=':' read -ra patterns <<< "$test_filter"
  for pattern in "${patterns[@]}"; do
    # shellcheck disable=SC2053 # the pattern is a glob on purpose
    [[ $1 == $pattern ]] && return 0
  done
  return 1
}
if [ "$test_filter" != '*Cuda*' ]; then
  filtered=()
  for entry in "${selected[@]}"; do
    if matches_filter "${entry#* }"; then filtered+=("$entry"); fi
  done
  selected=("${filtered[@]}")
fi
if [ ${#selected[@]} -eq 0 ]; then
  echo "gpu_check: no test with Cuda in its name under tests/: nothing to check" >&2
  exit 1
fi
mapfile -t layers < <(printf '%s\n' "${selected[@]}" | cut -d' ' -f1 | sort -u)
if [ "$list_layers" = 1 ]; then
  printf '%s\n' "${layers[@]}"
  exit 0
fi
# The GPU benchmarks (all Largo against PyTorch in the same run, on the same GPU):
#   train bench: bench/run_gpu_train_bench.sh: ResNet-50 (bf16, channels-last, batch 256) and
#     ViT-B/16 (bf16, batch 128) training img/s and MFU, Largo vs PyTorch eager and
#     torch.compile; 5 warm-up and 20 timed steps per run.
#   loader bench: bench/run_gpu_loader_bench.sh: `largo train` of ResNet-50 from a JPEG folder
#     made on the spot (7680 images, 30 steps of 256), the loader on every core: how long the
#     GPU loop waits for data.
#   memory bench: bench/run_gpu_memory_bench.sh: `largo train` of ResNet-50 at 2 ranks sharing
#     the GPU over Gloo in DDP, ZeRO-1, ZeRO-2 and FSDP: each rank's model state against
#     `largo estimate`.
#   precision sweep (--precision-sweep): bench/run_precision_bench.sh --device cuda,
#     ResNet-50 batch 128 in all six precisions, one round, 5 warm-up + 20 timed steps.
bench_model=resnet50 bench_threads=16 bench_rounds=1 bench_warmup=5 bench_steps=20
loader_images=7680
targets=()
for layer in "${layers[@]}"; do targets+=("largo_${layer}_tests"); done
if [ "$skip_bench" = 0 ]; then targets+=(precision_bench largo); fi
# The reference values the CUDA mixed-precision tests compare with: PyTorch on this GPU.
reference_script=tests/precision/cuda_mixed_precision_reference.py
# Each step's own limit in seconds; the budget's remainder caps them in turn.
limit_probe=60 limit_configure=120 limit_build=330 limit_suite=120 limit_bench=170
limit_reference=90 limit_train_bench=330 limit_loader_bench=200 limit_memory_bench=150

configure_args() { # $1: TORCH_CUDA_ARCH_LIST
  local args=(-S "$repo" -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release
              "-DLARGO_PYTHON=$python" -DLARGO_BUILD_TESTS=ON -DLARGO_BUILD_BENCH=ON
              -DLARGO_WITH_NCCL=ON "-DCMAKE_PREFIX_PATH=$deps/usr" "-DTORCH_CUDA_ARCH_LIST=$1")
  # Debian 12's CMake packages were written for CMake 3.25; CMake 4 refuses package files that
  # ask for policies older than 3.5 unless told this.
  if [ "$(cmake --version 2>/dev/null | head -1 | grep -Eo '[0-9]+' | head -1)" -ge 4 ] 2>/dev/null; then
    args+=(-DCMAKE_POLICY_VERSION_MINIMUM=3.5)
  fi
  printf '%s\n' "${args[@]}"
}

if [ "$plan" = 1 ]; then
  echo "gpu_check plan (nothing is built or run by --plan)"
  echo "  budget: ${budget} s end to end; step limits: probe ${limit_probe}, configure ${limit_configure}," \
       "build ${limit_build}, each test suite ${limit_suite}, bench ${limit_bench} s"
  echo "  needs: a CUDA GPU (nvidia-smi, and torch.cuda.is_available() in $python), cmake, ninja, a C++ compiler;"
  if [ -f "$deps/MANIFEST" ]; then
    echo "         $deps ($(du -sk "$deps" | cut -f1) KiB, $(grep -vc -e '^#' -e '^layout' "$deps/MANIFEST") packages): present"
  else
    echo "         $deps: MISSING - run scripts/gpu_deps.sh on a Debian 12 machine with network first"
  fi
  echo "  device tool: run(command=\"bash scripts/gpu_check.sh\", carry=[\"${deps#"$repo"/}\"], timeout_s=600)"
  echo "    or, built here first by scripts/gpu_prebuild.sh: run(command=\"bash scripts/gpu_check.sh --prebuilt" \
       ".gpu_prebuilt\", carry=[\"${deps#"$repo"/}\", \".gpu_prebuilt\"], timeout_s=600)"
  echo "  1. probe: nvidia-smi, $python (torch, CUDA, cuDNN, NCCL, compute capability); no GPU: exit 2"
  echo "  2. configure: cmake $(configure_args '<compute capability>' | tr '\n' ' ')"
  echo "  3. build: cmake --build ${build_dir#"$repo"/} -j $jobs --target ${targets[*]}"
  echo "  4. runtime libraries: ldd on the built programs (the bundled .so files must resolve)"
  echo "  5. CUDA tests (--gtest_filter='$test_filter', LD_LIBRARY_PATH=${deps_lib#"$repo"/}), ${#selected[@]} tests:"
  printf '%s\n' "${selected[@]}" | sed -E 's/^([a-z_]+) /       largo_\1_tests: /'
  echo "     (first: $python $reference_script <logs>/cuda_reference --device cuda, LARGO_CUDA_REFERENCE_DIR set to it)"
  if [ "$skip_bench" = 0 ]; then
    [[ " $benches " != *" train "* ]] ||
      echo "  6. train bench: bench/run_gpu_train_bench.sh: ResNet-50 and ViT-B/16, Largo vs PyTorch eager and torch.compile$( ((profile)) && echo ", 3 steps of each profiled (Kineto)")"
    [[ " $benches " != *" loader "* ]] ||
      echo "  7. loader bench: bench/run_gpu_loader_bench.sh: largo train ResNet-50 from $loader_images JPEGs"
    [[ " $benches " != *" memory "* ]] ||
      echo "  8. memory bench: bench/run_gpu_memory_bench.sh: ResNet-50 at 2 ranks on the GPU, DDP/ZeRO-1/ZeRO-2/FSDP"
    if [ "$precision_sweep" = 1 ]; then
      echo "  9. precision sweep: bench/run_precision_bench.sh --device cuda ${build_dir#"$repo"/} $bench_threads" \
           "$bench_rounds $bench_model (LARGO_BENCH_WARMUP=$bench_warmup LARGO_BENCH_STEPS=$bench_steps)"
    fi
  else
    echo "  6. benchmarks: skipped (--skip-bench)"
  fi
  echo "  report: $report (a skipped CUDA test counts as a failure: a GPU is present)"
  exit 0
fi

no_gpu() {
  echo "gpu_check: no CUDA GPU on this machine ($1)"
  exit 2
}

# ---- bookkeeping ----------------------------------------------------------------------------
start_time=$(date +%s)
deadline=$(( start_time + budget ))
logs="$build_dir/gpu_check_logs"
profile_dir="${OUT:-$logs}/profile" # --profile's traces; under $OUT they come back with the report
step_names=() step_status=() step_secs=() step_notes=()
record() { # name status seconds note
  step_names+=("$1"); step_status+=("$2"); step_secs+=("$3"); step_notes+=("${4:-}")
}
seconds_left() { echo $(( deadline - $(date +%s) )); }
# run_step NAME LIMIT LOG COMMAND...: runs COMMAND under a timeout (LIMIT, or what is left of
# the budget if less), its output into LOG; records PASS, FAIL or TIMEOUT and returns its status.
run_step() {
  local name=$1 limit=$2 log=$3 left began rc=0
  shift 3
  left=$(seconds_left)
  if (( left < 10 )); then
    record "$name" TIMEOUT 0 "not started: the ${budget} s budget is spent"
    return 1
  fi
  (( limit <= left )) || limit=$left
  echo "gpu_check: $name (limit ${limit} s)"
  began=$(date +%s)
  timeout --kill-after=10 "$limit" "$@" > "$log" 2>&1 || rc=$?
  if (( rc == 0 )); then
    record "$name" PASS $(( $(date +%s) - began ))
  elif (( rc == 124 || rc == 137 )); then
    record "$name" TIMEOUT $(( $(date +%s) - began )) "timed out after ${limit} s"
  else
    record "$name" FAIL $(( $(date +%s) - began )) "exit status $rc, see its log below"
  fi
  return $rc
}
failed_logs=()

# ---- 1. probe -------------------------------------------------------------------------------
probe_log=$(mktemp)
trap 'rm -f "$probe_log"' EXIT
probe_began=$(date +%s)
device_arch=9.0
if [ "$build_only" = 0 ]; then
  command -v nvidia-smi > /dev/null || no_gpu "nvidia-smi not found"
  timeout 30 nvidia-smi -L > /dev/null 2>&1 || no_gpu "nvidia-smi finds no device"
  command -v "$python" > /dev/null || no_gpu "no $python"
  timeout "$limit_probe" "$python" - > "$probe_log" 2>&1 <<'PY' || no_gpu "$python cannot import torch: $(tail -1 "$probe_log")"
import torch
available = torch.cuda.is_available()
print("available", available)
print("torch", torch.__version__)
print("cuda", torch.version.cuda)
if available:
    major, minor = torch.cuda.get_device_capability(0)
    print("arch", f"{major}.{minor}")
    print("device", torch.cuda.get_device_name(0))
    for name, version in (("cudnn", lambda: torch.backends.cudnn.version()),
                          ("nccl", lambda: ".".join(map(str, torch.cuda.nccl.version())))):
        try:
            print(name, version())
        except Exception as error:  # a missing library is reported, not fatal here
            print(name, "unavailable:", error)
PY
  grep -qx 'available True' "$probe_log" ||
    no_gpu "torch.cuda.is_available() is False in $python, torch $(awk '$1 == "torch" {print $2}' "$probe_log")"
  device_arch=$(awk '$1 == "arch" {print $2}' "$probe_log")
fi
# From here on a report is written, whatever happens.
python=$(command -v "$python" || echo "$python")
export LARGO_PYTHON="$python"
mkdir -p "$logs" "$(dirname "$report")"
rm -f "$logs"/*
if [ "$build_only" = 1 ]; then
  record probe SKIP 0 "--build-only: no GPU asked for"
else
  record probe PASS $(( $(date +%s) - probe_began )) "$(awk '$1 == "device" {$1 = ""; print}' "$probe_log" | xargs), sm $device_arch"
fi
# Results of an earlier run must not pass for this one's.
rm -f "$build_dir/bench/precision_results.jsonl" "$build_dir/gpu_check_logs/gpu_train_results.jsonl"

write_report() {
  local verdict=$1 i
  {
    echo "Largo GPU check - $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "result: $verdict"
    echo
    echo "== machine"
    echo "host: $(hostname); $(nproc) cores; $(uname -r)"
    echo "commit: $(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo unknown)$(
      git -C "$repo" diff --quiet HEAD 2>/dev/null || echo ' (with local changes)')"
    if command -v nvidia-smi > /dev/null; then
      echo "gpu: $(nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader 2>&1 | head -1)"
    fi
    sed 's/^/pytorch: /' "$probe_log"
    echo "python: $python"
    echo "nvcc: $(nvcc --version 2>/dev/null | grep -o 'release [0-9.]*' || echo 'not found')"
    echo "cmake: $(cmake --version 2>/dev/null | head -1)"
    echo "c++: $(c++ --version 2>/dev/null | head -1)"
    echo "glibc: $(getconf GNU_LIBC_VERSION 2>/dev/null)"
    echo "bundled: $(grep -v '^#' "$deps/MANIFEST" 2>/dev/null | grep -v '^layout' | tr '\n' ';' | sed 's/;/; /g')"
    echo
    echo "== steps (budget ${budget} s, used $(( $(date +%s) - start_time )) s)"
    for i in "${!step_names[@]}"; do
      printf '%-22s %-8s %5s s  %s\n' "${step_names[$i]}" "${step_status[$i]}" "${step_secs[$i]}" "${step_notes[$i]}"
    done
    if [ -s "$logs/libraries.log" ]; then
      echo
      echo "== runtime libraries (ldd of the first program: bundled, CUDA and NCCL libraries)"
      cat "$logs/libraries.log"
    fi
    if [ -s "$logs/tests.txt" ]; then
      echo
      echo "== CUDA tests (--gtest_filter='$test_filter')"
      cat "$logs/tests.txt"
    fi
    if [ -s "$logs/train_bench.log" ]; then
      echo
      echo "== train bench (bench/run_gpu_train_bench.sh, $bench_warmup warm-up + $bench_steps timed steps per run)"
      sed -n '/measured bf16 matrix peak/,$p' "$logs/train_bench.log"
      echo "-- raw results"
      cat "$logs/gpu_train_results.jsonl" 2>/dev/null || true
      for table in "$profile_dir"/*_table.md; do
        [ -s "$table" ] || continue
        echo
        echo "-- where the GPU time goes, $(basename "$table" _table.md): Largo against PyTorch eager, per step (bench/kernel_profile_table.py)"
        cat "$table"
      done
    fi
    if [ -s "$logs/loader_bench.log" ]; then
      echo
      echo "== loader bench (bench/run_gpu_loader_bench.sh, $loader_images JPEGs, $(nproc) loader threads)"
      grep -E "JPEGs written|model resnet|img/s|^window|^ +[0-9]+ |steady" "$logs/loader_bench.log" || true
    fi
    if [ -s "$logs/memory_bench.log" ]; then
      echo
      echo "== memory bench (bench/run_gpu_memory_bench.sh)"
      cat "$logs/memory_bench.log"
    fi
    if [ -s "$logs/bench.log" ]; then
      echo
      echo "== precision sweep: $bench_model, precision_bench against precision_reference.py, $bench_rounds round(s)," \
           "$bench_warmup warm-up + $bench_steps timed steps per run"
      cat "$logs/bench.log"
      if [ -s "$build_dir/bench/precision_results.jsonl" ]; then
        echo "-- raw results (bench/precision_results.jsonl)"
        cat "$build_dir/bench/precision_results.jsonl"
      fi
    fi
    for log in "${failed_logs[@]}"; do
      [ -s "$log" ] || continue # a step that never started has no log
      echo
      echo "== last 60 lines of $(basename "$log")"
      tail -n 60 "$log"
    done
    echo
    echo "gpu_check: $verdict"
  } > "$report"
}

finish() { # prints the summary, writes the report, exits
  local verdict=PASS problems=() i
  # A skipped step is not a problem of its own: it follows a failed one, or an option.
  for i in "${!step_names[@]}"; do
    case "${step_status[$i]}" in
      FAIL|TIMEOUT) problems+=("${step_names[$i]} ${step_status[$i]}") ;;
    esac
  done
  if [ ${#problems[@]} -gt 0 ]; then
    verdict=$(printf '%s, ' "${problems[@]}")
    verdict="FAIL (${verdict%, })"
  fi
  write_report "$verdict"
  echo
  printf '%-22s %-8s %7s  %s\n' step result seconds note
  for i in "${!step_names[@]}"; do
    printf '%-22s %-8s %7s  %s\n' "${step_names[$i]}" "${step_status[$i]}" "${step_secs[$i]}" "${step_notes[$i]}"
  done
  if [ -s "$logs/tests.txt" ]; then echo; cat "$logs/tests.txt"; fi
  if [ -s "$logs/train_bench.log" ]; then echo; sed -n '/measured bf16 matrix peak/,$p' "$logs/train_bench.log"; fi
  if [ -s "$logs/loader_bench.log" ]; then echo; sed -n '/^window/,$p' "$logs/loader_bench.log"; fi
  if [ -s "$logs/bench.log" ]; then echo; sed -n '/^model /,$p' "$logs/bench.log"; fi
  echo
  echo "gpu_check: $verdict"
  echo "gpu_check: report $report"
  if [ "$verdict" = PASS ]; then exit 0; fi
  exit 1
}

# Skips every step not yet run, with a reason, then finishes.
give_up() { # reason steps...
  local reason=$1 name
  shift
  for name in "$@"; do record "$name" SKIP 0 "$reason"; done
  finish
}
later_steps=(configure build "runtime libraries" "CUDA tests")
if [ "$build_only" = 1 ]; then later_steps=(configure build "runtime libraries"); fi
if [ "$skip_bench" = 0 ] && [ "$build_only" = 0 ]; then
  for bench in $benches; do later_steps+=("$bench bench"); done
  if [ "$precision_sweep" = 1 ]; then later_steps+=("precision sweep"); fi
fi

# ---- 2. what the image lacks: .gpu_deps ----------------------------------------------------
missing_tools=()
build_tools=(cmake ninja c++)
if [ -n "$prebuilt" ]; then build_tools=(ldd); fi
for tool in "${build_tools[@]}"; do command -v "$tool" > /dev/null || missing_tools+=("$tool"); done
if [ ${#missing_tools[@]} -gt 0 ]; then
  record tools FAIL 0 "not found: ${missing_tools[*]}"
  give_up "no build tools" "${later_steps[@]}"
fi
if [ ! -f "$deps/MANIFEST" ]; then
  record "bundled libraries" FAIL 0 "no $deps/MANIFEST: run scripts/gpu_deps.sh on Debian 12 and carry ${deps#"$repo"/}"
  give_up "no bundled libraries" "${later_steps[@]}"
fi
# The bundled libraries are Debian 12's: they need the glibc they were built against.
glibc_needed=$(sed -n 's/^# glibc needed: //p' "$deps/MANIFEST")
glibc_here=$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{print $2}')
glibc_here=${glibc_here:-unknown}
if [ -n "$glibc_needed" ] && [ "$glibc_needed" != unknown ] &&
   [ "$(printf '%s\n%s\n' "$glibc_needed" "$glibc_here" | sort -V | head -1)" != "$glibc_needed" ]; then
  record "bundled libraries" FAIL 0 "they need glibc >= $glibc_needed; this machine has $glibc_here"
  give_up "the bundled libraries cannot run here" "${later_steps[@]}"
fi
record "bundled libraries" PASS 0 "$(du -sk "$deps" | cut -f1) KiB, glibc >= ${glibc_needed:-?} needed, $glibc_here here"

# ---- 3. (--prebuilt) the packed programs ----------------------------------------------------
# They were built elsewhere against the same PyTorch release, found in the MANIFEST's
# torch_site (a site-packages folder: libtorch finds its CUDA libraries in nvidia/ beside it,
# from the path it was loaded through), with the test data at its source_dir: both paths are
# linked to this machine's.
link_path() { # path-on-the-build-machine path-here
  [ -e "$1" ] && return 0
  mkdir -p "$(dirname "$1")" && ln -s "$2" "$1"
}
use_prebuilt() {
  local manifest="$prebuilt/MANIFEST" built_torch here_torch here_site
  [ -f "$manifest" ] || { echo "no $manifest: run scripts/gpu_prebuild.sh and carry its folder"; return 1; }
  cat "$manifest"
  built_torch=$(awk '$1 == "torch" {print $2}' "$manifest")
  here_torch=$(awk '$1 == "torch" {print $2}' "$probe_log")
  if [ "$built_torch" != "$here_torch" ]; then
    echo "built against torch $built_torch, this machine has $here_torch: build here instead (no --prebuilt)"
    return 1
  fi
  here_site=$("$python" -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')
  link_path "$(awk '$1 == "torch_site" {print $2}' "$manifest")" "$here_site" &&
    link_path "$(awk '$1 == "source_dir" {print $2}' "$manifest")" "$repo" ||
    { echo "cannot link the build machine's paths (needs write access to them)"; return 1; }
}
if [ -n "$prebuilt" ]; then
  later_steps=("${later_steps[@]:2}") # no configure, no build
  if ! use_prebuilt > "$logs/prebuilt.log" 2>&1; then
    record prebuilt FAIL 0 "$(tail -1 "$logs/prebuilt.log")"
    failed_logs+=("$logs/prebuilt.log")
    give_up "the prebuilt programs cannot run here" "${later_steps[@]}"
  fi
  record prebuilt PASS 0 "$(awk '$1 == "commit" {print "built from " $2}' "$prebuilt/MANIFEST")"
else

# ---- 3. configure ---------------------------------------------------------------------------
# A build folder configured from another checkout path (the device machine keeps ignored
# folders between calls, but the path may differ) is refused by CMake: start it afresh.
if [ -f "$build_dir/CMakeCache.txt" ] &&
   ! grep -qx "CMAKE_HOME_DIRECTORY:INTERNAL=$repo" "$build_dir/CMakeCache.txt"; then
  rm -rf "$build_dir/CMakeCache.txt" "$build_dir/CMakeFiles"
fi
mapfile -t cmake_args < <(configure_args "$device_arch")
if ! run_step configure "$limit_configure" "$logs/configure.log" cmake "${cmake_args[@]}"; then
  failed_logs+=("$logs/configure.log")
  give_up "configure failed" "${later_steps[@]:1}"
fi

# ---- 4. build -------------------------------------------------------------------------------
if ! run_step build "$limit_build" "$logs/build.log" cmake --build "$build_dir" -j "$jobs" --target "${targets[@]}"; then
  failed_logs+=("$logs/build.log")
  give_up "build failed" "${later_steps[@]:2}"
fi
later_steps=("${later_steps[@]:2}")
fi # --prebuilt

# ---- 5. runtime libraries -------------------------------------------------------------------
# The programs find the bundled .so files through the RUNPATH CMake gives them (the tests also
# get LD_LIBRARY_PATH); a library ldd cannot resolve here would fail every test the same way.
programs=()
for layer in "${layers[@]}"; do programs+=("$build_dir/tests/largo_${layer}_tests"); done
if [ "$skip_bench" = 0 ]; then programs+=("$build_dir/bench/precision_bench" "$build_dir/largo"); fi
check_libraries() {
  local program status=0
  for program in "$@"; do
    if [ ! -x "$program" ]; then echo "$program: not built"; status=1; continue; fi
    if ldd "$program" | grep 'not found'; then echo "  in $program"; status=1; fi
  done
  # Where the first program's bundled and CUDA libraries come from, for the report.
  ldd "$1" | grep -E "$deps_lib|libtorch_cuda|libcudart|libnccl" || true
  return $status
}
libraries_began=$(date +%s)
if check_libraries "${programs[@]}" > "$logs/libraries.log" 2>&1; then
  record "runtime libraries" PASS $(( $(date +%s) - libraries_began ))
else
  record "runtime libraries" FAIL $(( $(date +%s) - libraries_began )) "ldd: see its log below"
  give_up "libraries missing at run time" "${later_steps[@]:1}"
fi
if [ "$build_only" = 1 ]; then finish; fi

# ---- 6. reference values, then the CUDA tests --------------------------------------------------
# PyTorch's own autocast + GradScaler runs on this GPU, which the mixed-precision CUDA tests
# compare Largo's with (they skip without LARGO_CUDA_REFERENCE_DIR, so a failure here shows as
# skipped tests too).
if [ -f "$repo/$reference_script" ]; then
  if run_step reference "$limit_reference" "$logs/reference.log" \
       "$python" "$repo/$reference_script" "$logs/cuda_reference" --device cuda; then
    export LARGO_CUDA_REFERENCE_DIR="$logs/cuda_reference"
  else
    failed_logs+=("$logs/reference.log")
  fi
fi
# One run of each layer's suite with the filter, its results as gtest's JSON. A test skipped
# here is a failure: the GPU is present, so a skip means the build or the device is wrong.
tests_began=$(date +%s)
tests_status=PASS tests_note=""
for layer in "${layers[@]}"; do
  left=$(seconds_left)
  if (( left < 10 )); then tests_status=TIMEOUT; tests_note="budget spent before suite $layer"; break; fi
  limit=$limit_suite
  (( limit <= left )) || limit=$left
  echo "gpu_check: CUDA tests of largo_${layer}_tests (limit ${limit} s)"
  rc=0
  (cd "$build_dir" &&
   LD_LIBRARY_PATH="$deps_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" timeout --kill-after=10 "$limit" \
     "tests/largo_${layer}_tests" "--gtest_filter=$test_filter" --gtest_color=no \
     "--gtest_output=json:$logs/tests_${layer}.json") > "$logs/tests_${layer}.log" 2>&1 || rc=$?
  if (( rc == 124 || rc == 137 )); then
    tests_status=TIMEOUT; tests_note+="largo_${layer}_tests timed out after ${limit} s; "
    failed_logs+=("$logs/tests_${layer}.log")
  elif (( rc != 0 )); then
    # 1 is GoogleTest's "a test failed"; anything else is a crash (134 abort, 139 segfault).
    if (( rc != 1 )); then tests_note+="largo_${layer}_tests exit status $rc; "; fi
    failed_logs+=("$logs/tests_${layer}.log")
  fi
done
# Every selected test must have run and passed; the JSON says which did.
printf '%s\n' "${selected[@]}" > "$logs/selected.txt"
parse_rc=0
"$python" - "$logs/selected.txt" "$logs" > "$logs/tests.txt" 2>&1 <<'PY' || parse_rc=$?
import json, pathlib, re, sys

selected = [line.split()[1] for line in open(sys.argv[1]) if line.strip()]
logs = pathlib.Path(sys.argv[2])
results = {}
for path in sorted(logs.glob("tests_*.json")):
    for suite in json.load(open(path)).get("testsuites", []):
        for test in suite.get("testsuite", []):
            name = f"{suite['name']}.{test['name']}"
            if test.get("failures"):
                result = "FAIL"
                note = [" ".join(test["failures"][0].get("failure", "").split())[:300]]
            elif test.get("result") == "SKIPPED":
                result, note = "SKIPPED", ["skipped on a GPU machine"]
            elif test.get("result") == "COMPLETED":
                result, note = "PASS", []
            else:
                result, note = test.get("result", "?"), []
            results[name] = (result, test.get("time", "?"), " ".join(note))
# A suite that crashed or was killed wrote no JSON: its console log says how far it got.
progress = {}
for path in sorted(logs.glob("tests_*.log")):
    for line in open(path, errors="replace"):
        match = re.match(r"^\[\s*(RUN|OK|FAILED|SKIPPED)\s*\] (\S+)", line)
        if match:
            progress[match.group(2)] = (match.group(1), path.name)
verdicts = {"OK": "PASS", "FAILED": "FAIL", "SKIPPED": "SKIPPED", "RUN": "CRASHED"}
for name in selected:
    if name in results:
        continue
    state, log = progress.get(name, (None, None))
    if state is None:
        results[name] = ("NOT RUN", "-", "did not start (an earlier test crashed or hung, or no build)")
    elif state == "RUN":
        results[name] = ("CRASHED", "-", f"started, never finished: crashed or timed out ({log})")
    else:
        results[name] = (verdicts[state], "-", f"from {log}: the suite did not finish")
bad = 0
for name, (result, time, note) in results.items():
    extra = "" if name in selected else "  (not listed from the sources)"
    print(f"{result:8} {time:>8} {name}{extra}  {note}".rstrip())
    bad += result != "PASS"
print(f"{len(results) - bad} of {len(results)} CUDA tests passed")
sys.exit(1 if bad else 0)
PY
if (( parse_rc != 0 )) && [ "$tests_status" = PASS ]; then tests_status=FAIL; fi
record "CUDA tests" "$tests_status" $(( $(date +%s) - tests_began )) "${tests_note}$(tail -1 "$logs/tests.txt")"

# ---- 7. GPU benchmarks ----------------------------------------------------------------------
# Without LD_LIBRARY_PATH: the PyTorch side is the image's Python, which must keep the image's
# own zlib and libpng; the C++ side finds the bundled ones through its RUNPATH.
if [ "$skip_bench" = 0 ]; then
  if [[ " $benches " == *" train "* ]] && ! run_step "train bench" "$limit_train_bench" "$logs/train_bench.log" \
       env "LARGO_BENCH_WARMUP=$bench_warmup" "LARGO_BENCH_STEPS=$bench_steps" \
       "LARGO_GPU_BENCH_PROFILE=$( ((profile)) && echo "$profile_dir")" \
       bash "$repo/bench/run_gpu_train_bench.sh" "$build_dir" "$logs/gpu_train_results.jsonl"; then
    failed_logs+=("$logs/train_bench.log")
  fi
  if [[ " $benches " == *" loader "* ]] && ! run_step "loader bench" "$limit_loader_bench" "$logs/loader_bench.log" \
       bash "$repo/bench/run_gpu_loader_bench.sh" "$build_dir" "$logs/loader" "$loader_images"; then
    failed_logs+=("$logs/loader_bench.log")
  fi
  if [[ " $benches " == *" memory "* ]] && ! run_step "memory bench" "$limit_memory_bench" "$logs/memory_bench.log" \
       bash "$repo/bench/run_gpu_memory_bench.sh" "$build_dir" "$logs/memory"; then
    failed_logs+=("$logs/memory_bench.log")
  fi
  if [ "$precision_sweep" = 1 ] &&
     ! run_step "precision sweep" "$limit_bench" "$logs/bench.log" \
       env "LARGO_BENCH_WARMUP=$bench_warmup" "LARGO_BENCH_STEPS=$bench_steps" \
       bash "$repo/bench/run_precision_bench.sh" --device cuda "$build_dir" \
       "$bench_threads" "$bench_rounds" "$bench_model"; then
    failed_logs+=("$logs/bench.log")
  fi
else
  record benchmarks SKIP 0 "--skip-bench"
fi
finish
