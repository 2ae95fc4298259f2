#!/usr/bin/env bash
# The L1 suite on a CUDA machine, full profile. Usage: tools/gpu_l1.sh examples|identity
# Writes $OUT/<which>.json (FastKernels report) and $OUT/<which>.log.
set -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src:$PWD  # run from the checkout (no registry there)
OUT=${OUT:-out}; mkdir -p "$OUT"
case "$1" in
  examples) cand=examples/candidates/triton ;;
  identity) cand=kernels_reference ;;  # the reference against an identical copy: timing noise check
  *) echo "usage: $0 examples|identity" >&2; exit 2 ;;
esac
python3 -m pytest -p fk_pytest.plugin tasks -q --fk-device=cuda --fk-profile=full \
  --fk-candidate="$cand" --fk-report="$OUT/$1.json" --benchmark-columns=median,iqr,rounds \
  2>&1 | tee "$OUT/$1.log" | grep -v "^test_speed" | tail -40
