#!/usr/bin/env bash
# The GPU check of issue 20 in one command, for a bare GPU machine with no network whose python3 already
# holds torch (see benchmarks/gpu_check.py for what it measures; figures go to $OUT/gpu_check.json).
#
# Prepare here (network): benchmarks/gpu_wheels.sh   (~20 MiB of wheels into benchmarks/.gpu-wheels/)
# Then one device `run`, exactly:
#   command:   set -o pipefail; bash benchmarks/gpu_check.sh --out "$OUT" 2>&1 | tee "$OUT/gpu_check.log"
#   carry:     ["benchmarks/.gpu-wheels"]
#   timeout_s: 510      (sections are budgeted to 420 s; wheel install and imports take ~30 s)
# Read $OUT/gpu_check.json and the table at the end of the output; give the machine back unless rerunning.
#
# Dry check on a CPU (what tests/test_gpu_check.py runs):
#   PY=.venv/bin/python benchmarks/gpu_check.sh --cluster local --out /tmp/gpu-check
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
WHEELS=${CRYOCUBE_GPU_WHEELS:-benchmarks/.gpu-wheels}
SITE=${CRYOCUBE_GPU_SITE:-/tmp/cryocube-gpu-site}
if compgen -G "$WHEELS/*.whl" >/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$WHEELS"/*.whl \
    || { echo "gpu_check: installing the wheels of $WHEELS failed" >&2; exit 1; }
  export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
  if ! "$PY" -c "from cuda.core import Device" 2>/dev/null && compgen -G "$WHEELS/fallback/*.whl" >/dev/null; then
    echo "gpu_check: this machine's cuda-core has no cuda.core.Device (dask-cuda needs >= 0.5.1): installing the carried one"
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$WHEELS"/fallback/*.whl
  fi
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
"$PY" -c "import cryocube.cli, dask, distributed, zarr" \
  || { echo "gpu_check: cryocube does not import with $PY (PYTHONPATH=$PYTHONPATH); run benchmarks/gpu_wheels.sh and carry $WHEELS" >&2; exit 1; }
exec "$PY" benchmarks/gpu_check.py "$@"
