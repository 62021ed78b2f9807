# Sourced by the scripts: where the PyTorch that Largo builds against lives.
#   LARGO_TORCH_ENV  the virtual environment scripts/install_deps.sh installs PyTorch 2.11 into
#   LARGO_PYTHON     its Python: runs the reference scripts and the benchmarks' PyTorch side,
#                    and tells CMake where libtorch is (torch.utils.cmake_prefix_path)
# Either may be set beforehand, e.g. LARGO_PYTHON=python3 on a machine whose own Python has
# PyTorch (scripts/gpu_check.sh does that on the GPU image).
export LARGO_TORCH_ENV="${LARGO_TORCH_ENV:-/opt/largo/torch-2.11.0}"
export LARGO_PYTHON="${LARGO_PYTHON:-$LARGO_TORCH_ENV/bin/python}"
