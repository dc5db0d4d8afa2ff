#!/usr/bin/env bash
# fseb_ft on one GPU machine in one call (benchmarks/gpu/README.md):
#   bash benchmarks/gpu/run.sh [--dry-run] [--parts ...] [--budget SECONDS]
# Installs the carried wheels (.whl/, from `python -m benchmarks.gpu.prepare`) unless --dry-run,
# then runs `python -m benchmarks.gpu` with the repository first on the path.
set -euo pipefail
cd "$(dirname "$0")/../.."
python=${PYTHON:-python3}
site=${FSEB_GPU_SITE:-/tmp/fseb-gpu-site}
if [[ " $* " != *" --dry-run "* ]] && compgen -G ".whl/*.whl" >/dev/null; then
    "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$site" .whl/*.whl
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
exec "$python" -m benchmarks.gpu "$@"
