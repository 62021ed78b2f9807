#!/usr/bin/env bash
# Installs everything Largo needs to build, test and benchmark on Debian 12:
#  - build tools and libraries from Debian's archive;
#  - PyTorch 2.11.0 (CUDA 13.0 build) and torchvision 0.26.0 from PyPI into one virtual
#    environment outside the checkout ($LARGO_TORCH_ENV, default /opt/largo/torch-2.11.0), so
#    every clone on the machine (CI's too) shares it. Its libtorch is what Largo builds
#    against (found through torch.utils.cmake_prefix_path), and its Python runs the reference
#    scripts and the benchmarks' PyTorch side.
# `--bench` adds what only the benchmarks need (FairScale, the photographs the image
# pipeline bench cuts its folder from, webdataset's Python loader for the shard bench).
# Idempotent and quiet when everything is present (no network then).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/torch_env.sh

packages=(
  build-essential cmake ninja-build ccache pkg-config
  # The Gloo headers: c10d's ProcessGroupGloo.hpp includes them and the wheel ships none.
  # Largo only passes Gloo devices through that header; the Gloo compiled into libtorch is
  # the wheel's own.
  libgloo-dev
  libyaml-cpp-dev libcli11-dev libspdlog-dev libfmt-dev nlohmann-json3-dev zlib1g-dev
  libjpeg62-turbo-dev libpng-dev     # image decoding (data layer)
  libgtest-dev libgmock-dev libbenchmark-dev
  dataset-fashion-mnist               # the default job's data
  python3-venv                        # the environment PyTorch is installed into
  clang-format
)

missing=()
for package in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$package")
  fi
done

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
if [ ${#missing[@]} -eq 0 ]; then
  echo "install_deps: all ${#packages[@]} Debian packages present"
else
  echo "install_deps: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# ---- PyTorch from PyPI --------------------------------------------------------------------
# Pinned: the image fixtures and baselines depend on Pillow's encoder and NumPy's formats.
# scipy writes the MAT-files the SVHN tests read (tests/reference/gen_svhn_mat_files.py).
requirements=(torch==2.11.0 torchvision==0.26.0 numpy==2.4.6 pillow==13.0.0 pyyaml==6.0.4
  scipy==1.17.1)
if [ "${1:-}" = "--bench" ]; then
  requirements+=(fairscale==0.4.13 scikit-image scikit-learn webdataset==1.0.2)
fi
# The stamp lists what was installed; anything missing from it is installed (pip skips what
# is there). Written last, so an interrupted install is completed by the next run.
stamp="$LARGO_TORCH_ENV/.largo-installed"
wanted=()
for requirement in "${requirements[@]}"; do
  if ! grep -qxF "$requirement" "$stamp" 2>/dev/null; then
    wanted+=("$requirement")
  fi
done
if [ ${#wanted[@]} -eq 0 ]; then
  echo "install_deps: PyTorch environment $LARGO_TORCH_ENV present"
else
  echo "install_deps: installing ${wanted[*]} into $LARGO_TORCH_ENV (PyTorch's CUDA wheels: a few GiB, once per machine)"
  $SUDO mkdir -p "$(dirname "$LARGO_TORCH_ENV")"
  if [ ! -x "$LARGO_TORCH_ENV/bin/python" ]; then
    $SUDO /usr/bin/python3 -m venv "$LARGO_TORCH_ENV"
  fi
  $SUDO "$LARGO_TORCH_ENV/bin/python" -m pip install --quiet --disable-pip-version-check \
    "${requirements[@]}"
  "$LARGO_TORCH_ENV/bin/python" -c "import torch, torchvision; print('install_deps: torch', torch.__version__, 'CUDA', torch.version.cuda, '| torchvision', torchvision.__version__)"
  printf '%s\n' "${requirements[@]}" | $SUDO tee -a "$stamp" >/dev/null
fi
