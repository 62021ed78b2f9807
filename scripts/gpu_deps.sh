#!/usr/bin/env bash
# Prepares .gpu_deps/: the libraries Largo builds against that a GPU machine's image lacks
# (yaml-cpp, spdlog, fmt, CLI11, nlohmann-json, GoogleTest, libjpeg-turbo, libpng, zlib, and
# Gloo's headers), as Debian 12 packages unpacked into one folder that travels with the
# working tree to a machine with no package registry. scripts/gpu_check.sh builds there with
# CMAKE_PREFIX_PATH=.gpu_deps/usr and runs with the libraries in .gpu_deps/usr/lib.
#
# Run it on a Debian 12 (bookworm, amd64) machine with network access; it needs no root
# (`apt-get download` and `dpkg -x` write only here). Idempotent: when .gpu_deps/MANIFEST
# already lists the versions apt would download, it only prints the size.
#
# Usage: scripts/gpu_deps.sh [--force] [DIR]     (DIR defaults to .gpu_deps in the checkout)
set -euo pipefail
cd "$(dirname "$0")/.."

force=0
if [ "${1:-}" = "--force" ]; then
  force=1
  shift
fi
deps="${1:-.gpu_deps}"
# The device tool moves at most 64 MiB per call: the checkout's files and this folder together.
budget_bytes=$(( 64 * 1024 * 1024 ))
arch=x86_64-linux-gnu

# Headers, CMake package files and link-time libraries (-dev), and the shared libraries the
# programs load at run time. libgloo-dev is there for its headers only: c10d's
# ProcessGroupGloo.hpp includes <gloo/...>, the wheel ships none, and the Gloo that runs is
# the one compiled into libtorch. No Google Benchmark: bench/ does not use it.
packages=(
  libyaml-cpp-dev libyaml-cpp0.7
  libspdlog-dev libspdlog1.10
  libfmt-dev libfmt9
  libcli11-dev
  nlohmann-json3-dev
  libgtest-dev libgmock-dev
  libjpeg62-turbo-dev libjpeg62-turbo
  libpng-dev libpng16-16
  zlib1g-dev zlib1g
  libgloo-dev
)

if ! command -v apt-get >/dev/null || ! command -v dpkg >/dev/null; then
  echo "gpu_deps: needs apt-get and dpkg (a Debian 12 machine)" >&2
  exit 1
fi
if [ "$(dpkg --print-architecture)" != amd64 ]; then
  echo "gpu_deps: this is $(dpkg --print-architecture); the GPU machines are amd64" >&2
  exit 1
fi

# The versions apt would download now, one "package version" a line, after the layout's
# version (raise it when the pruning below changes): the manifest's key.
layout=1
wanted=$(echo "layout $layout"; for package in "${packages[@]}"; do
  version=$(apt-cache policy "$package" | awk '/Candidate:/ {print $2}')
  if [ -z "$version" ] || [ "$version" = "(none)" ]; then
    echo "gpu_deps: apt knows no candidate for $package (run apt-get update; Debian 12 only)" >&2
    exit 1
  fi
  echo "$package $version"
done)

size_report() {
  local deps_bytes tree_bytes
  deps_bytes=$(du -sb "$deps" | cut -f1)
  # What else travels: tracked files and untracked files git does not ignore.
  tree_bytes=$({ git ls-files -z; git ls-files -z --others --exclude-standard; } |
                 du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1)
  echo "gpu_deps: $deps is $(( deps_bytes / 1024 )) KiB; with the checkout's" \
       "$(( tree_bytes / 1024 )) KiB, $(( (deps_bytes + tree_bytes) / 1024 )) KiB travel" \
       "(limit $(( budget_bytes / 1024 )) KiB)"
  if (( deps_bytes + tree_bytes > budget_bytes )); then
    echo "gpu_deps: over the 64 MiB a device call carries" >&2
    return 1
  fi
}

if [ "$force" = 0 ] && [ -f "$deps/MANIFEST" ] &&
   [ "$(grep -v '^#' "$deps/MANIFEST")" = "$wanted" ]; then
  echo "gpu_deps: $deps holds the ${#packages[@]} packages already"
  size_report
  exit 0
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "gpu_deps: downloading ${#packages[@]} packages"
# As root, apt hands downloads to its _apt user, which cannot write into a private temp dir;
# it then warns and downloads as root anyway: say so up front.
apt_options=()
if [ "$(id -u)" -eq 0 ]; then apt_options=(-o APT::Sandbox::User=root); fi
(cd "$work" && apt-get download -q "${apt_options[@]}" "${packages[@]}" >/dev/null) || {
  echo "gpu_deps: apt-get download failed (network? stale lists: run apt-get update)" >&2
  exit 1
}
root="$work/root"
mkdir -p "$root"
for deb in "$work"/*.deb; do
  dpkg -x "$deb" "$root"
done

# ---- make the tree relocatable and small ----------------------------------------------------
# zlib1g ships its library under /lib (Debian 12 is /usr-merged on disk, not in its
# packages): move it beside the others, so one lib folder holds every library.
if [ -d "$root/lib/$arch" ]; then
  mkdir -p "$root/usr/lib/$arch"
  mv "$root/lib/$arch"/* "$root/usr/lib/$arch/"
  rm -rf "${root:?}/lib"
fi
# -dev packages link libX.so to absolute paths (/lib/x86_64-linux-gnu/libz.so.1.2.13), which
# would point into the GPU image's own /lib: re-point each at the file of that name here.
while IFS= read -r -d '' link; do
  target=$(readlink "$link")
  case "$target" in
    /*)
      if [ -e "$(dirname "$link")/$(basename "$target")" ]; then
        ln -sfn "$(basename "$target")" "$link"
      else
        rm -f "$link"
      fi
      ;;
  esac
done < <(find "$root" -type l -print0)
# libjpeg's jconfig.h sits in the multiarch include folder, which compilers search under
# /usr/include only; FindJPEG names .gpu_deps/usr/include, so put it there.
if [ -d "$root/usr/include/$arch" ]; then
  cp -a "$root/usr/include/$arch"/. "$root/usr/include/"
  rm -rf "${root:?}/usr/include/$arch"
fi
# Gloo: headers only. Its library link would dangle (libgloo0 is not bundled) and its CMake
# package would name that library.
rm -f "$root"/usr/lib/libgloo.so* "$root/usr/lib/$arch"/libgloo.so*
rm -rf "$root/usr/share/cmake/Gloo" "$root/usr/lib/cmake/Gloo"
# Static archives that nothing links (Largo links the shared libraries; FindJPEG, FindPNG and
# FindZLIB would find either). GoogleTest's stay: its CMake package names them.
rm -f "$root/usr/lib/$arch"/{libyaml-cpp,libjpeg,libpng,libpng16,libz}.a
# Documentation, manuals, pkg-config files (they name /usr; CMake does not read them here)
# and the like.
rm -rf "${root:?}/usr/share/doc" "$root/usr/share/doc-base" "$root/usr/share/man" \
       "${root:?}/usr/share/lintian" "${root:?}/usr/share/bug" "${root:?}/usr/bin" "${root:?}/usr/src" \
       "$root/usr/share/pkgconfig" "$root/usr/lib/$arch/pkgconfig"
find "$root" -depth -type d -empty -delete

# The newest glibc symbol version the bundled libraries need: the GPU image's glibc must be
# at least that (scripts/gpu_check.sh checks it before building).
glibc_needed=$(for lib in "$root/usr/lib/$arch"/*.so.*; do
                 [ -L "$lib" ] || objdump -T "$lib" 2>/dev/null
               done | grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//' | sort -V | tail -1)
{
  echo "# Written by scripts/gpu_deps.sh on $(date -u +%Y-%m-%dT%H:%M:%SZ) from Debian $(cat /etc/debian_version)"
  echo "# glibc needed: ${glibc_needed:-unknown}"
  echo "$wanted"
} > "$root/MANIFEST"

rm -rf "$deps"
mv "$root" "$deps"
echo "gpu_deps: unpacked ${#packages[@]} packages into $deps (glibc >= ${glibc_needed:-?} needed)"
size_report
