#!/usr/bin/env bash
# Quick check on a CUDA machine: environment, then a small slice of the suite on the GPU.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD/src:$PWD  # the device machine has no registry: run from the checkout
python3 -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())"
python3 -m pytest -p fk_pytest.plugin tasks -q --maxfail=10 --fk-device=cuda -k "T32-bf16 or T8192-bf16 or fuzz" \
  --fk-fuzz-examples=5 --fk-candidate=examples/candidates/triton --fk-report="$OUT/smoke.json" \
  --benchmark-columns=median,iqr,rounds 2>&1 | tee "$OUT/smoke.log" | tail -60
