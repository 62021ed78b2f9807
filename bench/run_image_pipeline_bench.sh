#!/usr/bin/env bash
# Image loading, Largo against torchvision at equal workers (issue 16): an ImageNet-like
# ImageFolder of JPEGs is made at bench time from the photographs scikit-image and
# scikit-learn ship (bench/make_image_folder.py; installed by install_deps.sh --bench;
# nothing committed), then
#   - Largo's disk_folder + DataLoader (bench/image_pipeline_bench.cpp) and torchvision's
#     ImageFolder + DataLoader (bench/image_pipeline_reference.py), training transform
#     (RandomResizedCrop 224 + flip + ToTensor + Normalize) and validation transform
#     (Resize 256 + CenterCrop 224 + ToTensor + Normalize), with 1 and 2 workers, batch 32;
#   - VISSL's SwAV multi-crop recipe (2 x 224 + 6 x 96 crops, flip, colour distortion 1.0,
#     PIL Gaussian blur p 0.5, ToTensor, Normalize): Largo's MultiViewPipeline + DataLoader
#     against torchvision's transforms composed as VISSL composes them (same workers, batch);
#   - libjpeg-turbo's plain full decode of every file at the same thread counts: the limit;
#   - what DCT-scaled decoding changes (pixels, time), on full-size photographs.
# Prints images/s and the ratios. Targets: >= 2x torchvision on training, >= 1.5x on
# validation, >= 2x on multi-crop, at equal workers.
#
# Usage: bench/run_image_pipeline_bench.sh [BUILD_DIR] [NUM_IMAGES] [WORKERS...]
#   defaults: build 3000 "1 2". Installs the bench packages (scripts/install_deps.sh --bench).
set -euo pipefail
build="${1:-build}"; count="${2:-3000}"; shift $(( $# < 2 ? $# : 2 ))
workers=("$@"); [ ${#workers[@]} -gt 0 ] || workers=(1 2)
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
bin="$build/bench/image_pipeline_bench"
source "$here/../scripts/torch_env.sh"
python="$LARGO_PYTHON" # the PyTorch Largo is built against
batch=32
[ -x "$bin" ] || { echo "no $bin: build the target image_pipeline_bench first" >&2; exit 1; }
bash "$here/../scripts/install_deps.sh" --bench

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
"$python" "$here/make_image_folder.py" "$tmp/imagenet_like" "$count"
"$python" "$here/make_image_folder.py" "$tmp/large" 60 --large --classes 2
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); load: $(cut -d' ' -f1-3 /proc/loadavg)"

rate() { sed -E 's/.*: ([0-9.]+) images\/s.*/\1/'; }
printf '\n%-34s %10s %10s %8s\n' "transform / workers" "largo" "torchvision" "ratio"
for which in train val multicrop; do
  for w in "${workers[@]}"; do
    if [ "$which" = multicrop ]; then
      largo_line="$("$bin" multicrop "$tmp/imagenet_like" "$w" "$batch")"
    else
      largo_line="$("$bin" throughput "$tmp/imagenet_like" "$which" "$w" "$batch")"
    fi
    torch_line="$("$python" "$here/image_pipeline_reference.py" "$tmp/imagenet_like" "$which" "$w" "$batch")"
    echo "  $largo_line"; echo "  $torch_line"
    l="$(echo "$largo_line" | rate)"; t="$(echo "$torch_line" | rate)"
    printf '%-34s %10.1f %10.1f %7.2fx\n' "$which, $w worker(s)" "$l" "$t" "$(awk -v l="$l" -v t="$t" 'BEGIN { print l / t }')"
  done
done
echo
for w in "${workers[@]}"; do
  "$bin" decode "$tmp/imagenet_like" "$w"
done
echo
"$bin" dct "$tmp/imagenet_like" train 224
"$bin" dct "$tmp/imagenet_like" val 224
"$bin" dct "$tmp/large" val 224
"$bin" dct "$tmp/large" train 224
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
