#!/usr/bin/env bash
# WebDataset shards against image files, and Largo's shard loader against the `webdataset`
# package's (issue 45): an ImageNet-like folder of JPEGs is made at bench time
# (bench/make_image_folder.py, from the photographs scikit-image and scikit-learn ship) and
# packed into shards (scripts/pack_webdataset.py); then, in alternating rounds, at 1 and 2
# loader workers, batch 32, the training transform (RandomResizedCrop 224 + flip + ToTensor +
# Normalize):
#   - Largo disk_folder: the files, DistributedSampler's order (bench/webdataset_loader_bench.cpp)
#   - Largo webdataset: the shards, WebDatasetSampler's order (shuffle buffer SHUFFLE_BUFFER)
#   - webdataset (PyPI): its WebDataset + WebLoader with the same shuffle buffer, PIL decode
#     and torchvision's transforms (bench/webdataset_reference.py)
# Prints every round, then per loader and worker count the median images/s, the range, and
# the ratios of the medians; and the start-up cost of indexing the shards' headers.
#
# Usage: bench/run_loader_webdataset.sh [BUILD_DIR] [NUM_IMAGES] [ROUNDS] [SHARD_SIZE]
#   defaults: build 3000 3 250. Installs the bench packages (scripts/install_deps.sh --bench).
set -euo pipefail
build="${1:-build}"; count="${2:-3000}"; rounds="${3:-3}"; shard_size="${4:-250}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
bin="$build/bench/webdataset_loader_bench"
source "$here/../scripts/torch_env.sh"
python="$LARGO_PYTHON"
batch=32
buffer=1000
[ -x "$bin" ] || { echo "no $bin: build the target webdataset_loader_bench first" >&2; exit 1; }
bash "$here/../scripts/install_deps.sh" --bench

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
"$python" "$here/make_image_folder.py" "$tmp/images" "$count"
pack="$("$python" "$here/../scripts/pack_webdataset.py" "$tmp/images" "$tmp/shards/train" \
  --shard-size "$shard_size")"
echo "$pack"
last=$(( (count + shard_size - 1) / shard_size - 1 ))
shards="$tmp/shards/train-{000000..$(printf '%06d' "$last")}.tar"
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); load: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "images: $count JPEGs ($(du -sh "$tmp/images" | cut -f1)), $((last + 1)) shards of $shard_size; batch $batch, shuffle buffer $buffer"

rate() { sed -E 's/.*: ([0-9.]+) images\/s.*/\1/'; }
results="$tmp/results"
: > "$results"
for round in $(seq 1 "$rounds"); do
  for w in 1 2; do
    for loader in folder webdataset python; do
      case "$loader" in
        folder) line="$("$bin" folder "$tmp/images" "$w" "$batch")" ;;
        webdataset) line="$("$bin" webdataset "$shards" "$w" "$batch" "$buffer")" ;;
        python) line="$("$python" "$here/webdataset_reference.py" "$shards" "$w" "$batch" "$buffer")" ;;
      esac
      echo "  round $round: $line"
      echo "$loader $w $(echo "$line" | rate)" >> "$results"
    done
  done
done

# Median and range of one loader's rates at one worker count.
stats() { awk -v l="$1" -v w="$2" '$1 == l && $2 == w { print $3 }' "$results" | sort -g |
  awk '{ v[NR] = $1 } END { m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2;
         printf "%.1f %.1f %.1f\n", m, v[1], v[NR] }'; }
echo
printf '%-8s %-26s %-26s %-26s %9s %9s\n' workers "largo disk_folder" "largo webdataset" \
  "webdataset (PyPI)" "wds/fold" "wds/PyPI"
for w in 1 2; do
  read -r f fl fh <<< "$(stats folder "$w")"
  read -r s sl sh <<< "$(stats webdataset "$w")"
  read -r p pl ph <<< "$(stats python "$w")"
  printf '%-8s %-26s %-26s %-26s %8.2fx %8.2fx\n' "$w" "$f ($fl-$fh)" "$s ($sl-$sh)" \
    "$p ($pl-$ph)" "$(awk -v a="$s" -v b="$f" 'BEGIN { print a / b }')" \
    "$(awk -v a="$s" -v b="$p" 'BEGIN { print a / b }')"
done
echo "(median images/s over $rounds rounds, range in brackets)"
"$bin" index "$shards"
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
