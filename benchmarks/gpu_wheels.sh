#!/usr/bin/env bash
# The wheels benchmarks/gpu_check.sh installs on a bare GPU machine with no network (Python 3.12,
# manylinux x86_64), downloaded here into benchmarks/.gpu-wheels/ (git-ignored; `carry` it to the run).
#
# Only what that machine lacks for cryocube's GPU path (its image already holds torch, timm, numpy,
# pandas, pyarrow, fsspec, pyyaml, rich, click, jinja2, msgpack, psutil, toolz, cloudpickle,
# sortedcontainers, urllib3, packaging, typing-extensions, nvidia-ml-py and cuda-core; see the device
# kinds' package list). Versions: .ci/constraints.txt where it pins them (tested together), else DEFAULT.
# netCDF4, s3fs, bokeh are left out: the GPU path (synthetic cubes, evaluate) never imports them.
#
#   benchmarks/gpu_wheels.sh            # prints each wheel and the total size
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=benchmarks/.gpu-wheels
PY=${PY:-.venv/bin/python}
PACKAGES=(dask distributed dask-cuda zarr numcodecs donfig google-crc32c partd locket tblib tornado zict xarray
          rasterio affine cligj click-plugins)  # rasterio: the vqa section converts synthetic GeoTIFF interferograms
declare -A DEFAULT=([dask-cuda]=26.10.0)  # matches dask/distributed 2026.7.1 (rapids-dask-dependency 26.10)

pin() {  # NAME -> NAME==VERSION
  local v
  v=$(grep -i -m1 -E "^$(echo "$1" | sed 's/[-_]/[-_]/g')==" .ci/constraints.txt | cut -d= -f3 || true)
  v=${v:-${DEFAULT[$1]:-}}
  [[ -n $v ]] || { echo "gpu_wheels: no version for $1 in .ci/constraints.txt or DEFAULT" >&2; exit 1; }
  echo "$1==$v"
}

rm -rf "$DEST"
mkdir -p "$DEST"
specs=()
for p in "${PACKAGES[@]}"; do specs+=("$(pin "$p")"); done
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux1_x86_64 --platform any -d "$DEST" "${specs[@]}"
# Installed there only if its own cuda-core lacks cuda.core.Device, which dask-cuda 26.10 imports (cuda-core >= 0.5.1).
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 -d "$DEST/fallback" "cuda-core==${CUDA_CORE:-1.2.2}"
ls -1 "$DEST" "$DEST/fallback"
total=$(du -cb "$DEST"/*.whl "$DEST"/fallback/*.whl | tail -1 | cut -f1)
echo "gpu_wheels: ${#specs[@]} wheels and a fallback cuda-core, $((total / 1024)) KiB in $DEST (the run's limit is 64 MiB with the tree)"
