#!/usr/bin/env bash
# The GPU checks, for a machine with a CUDA device and torch but none of the
# switch's kernel tooling (no bcc, no iproute2): the CUDA halves of the unit
# tests (the quantizer on the device, the staging pipeline with CudaOps and
# CUDA streams, DDP with a CUDA model in process) and the staging benchmark.
# The switch itself is not needed: the pipeline's tests use an exact stand-in.
#
#   OUT=/some/dir scripts/gpu_check.sh
#
# Where pyroute2 and the daemon's dependencies are missing (no registry
# there), put their wheels in .whl/ (pip download --no-deps --only-binary=:all:
# --python-version 3.12 -d .whl pyroute2==0.7.2 click tqdm psutil rich
# markdown-it-py mdurl pygments prometheus-client) and they are installed
# under /tmp/site first. Logs and figures go to $OUT.
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu-check}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if compgen -G ".whl/*.whl" > /dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site
fi
{ nvidia-smi -L; python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda,
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'NO CUDA DEVICE')"; } \
    2>&1 | tee "$OUT/device.txt"

rc=0
python3 -m pytest -q -rs -p no:cacheprovider --durations=10 \
    tests/unit/test_device_quant.py tests/unit/test_staging.py 2>&1 | tee "$OUT/pytest.log" || rc=1

# The pipeline through a switch: CUDA ranks in a two-host lab, served by the
# daemon's user-space data plane (no bcc here for the XDP one). Needs root.
if [ "$(id -u)" = 0 ]; then
    device=$(python3 -c "import torch; print('cuda' if torch.cuda.is_available() else 'cpu')")
    timeout 300 python3 scripts/gpu_switch_check.py "$device" 2>&1 | tee "$OUT/switch_check.log" \
        || rc=1
fi

# One run a rate (device time is scarce): its JSON, kept and shown.
for gbps in 25 100 400; do
    python3 -m switchml_xdp.bench.gpu_staging --gbps "$gbps" --iters 5 --json \
        | tee "$OUT/gpu_staging_$gbps.json" || rc=1
done
exit $rc
