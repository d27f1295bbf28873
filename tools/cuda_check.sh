#!/usr/bin/env bash
# The CUDA checks, on a GPU machine with a python3 that has torch (CUDA), scikit-learn and msgpack:
# installs what the GPU image lacks from the wheels in .whl and the checkout itself (editable, as
# the README's test command does), then runs tests/cuda, the precision benchmark on cuda, and a
# collective-topology run of two agents on the one GPU. Logs go to ${OUT:-/tmp/cuda-check}.
# Fill .whl first, on a machine with PyPI:
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux_2_28_x86_64 \
#       --platform manylinux2014_x86_64 -d .whl pyzmq crc32c cryptography cffi pycparser pydantic pydantic-core \
#       annotated-types typing-inspection fastapi starlette uvicorn pydantic-settings python-dotenv \
#       fastapi-offline mnist1d annotated-doc typing-extensions opentelemetry-api
# (2026-11-27: the GPU image had torch, scikit-learn and msgpack, and none of these.)
set -u
out=${OUT:-/tmp/cuda-check}; mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir .whl/*.whl 2>&1 | tail -3
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . 2>&1 | tail -3
nvidia-smi -L
python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name(), 'bf16', torch.cuda.is_bf16_supported())"
export PYTHONUNBUFFERED=1 HERMES_PRECISION_CACHE=off
timeout 380 python3 -m pytest -q -p no:cacheprovider -o addopts="" -s tests/cuda 2>&1 | tee "$out/cuda-tests.log" | grep -v "^$" | tail -40
timeout 100 python3 benchmarks/precision.py --device cuda --repeats 2 2>&1 | tee "$out/precision.log"
timeout 75 hermes-testbed --device cuda --topology collective --preset task-allocation --clients 2 --dataset digits \
    --target-accuracy 0.9 --max-seconds 60 --out /tmp/coll --quiet > "$out/collective.log" 2>&1
echo "collective rc $?"; tail -25 "$out/collective.log"; grep -rh "nccl\|NCCL\|Duplicate" /tmp/coll/logs 2>/dev/null | tail -5
