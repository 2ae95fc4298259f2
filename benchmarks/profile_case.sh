#!/usr/bin/env bash
# Where the host time of a few kernel-level tests goes: cProfile of one in-process pytest run, with
# CUDA launches blocking so GPU work is billed to the Python call that launched it.
#   OUT=/tmp/out bash benchmarks/profile_case.sh tasks/L4/test_mixtral_for_causal_lm.py "decode-B1-C1344"
set -u
export PYTHONPATH=$PWD/src:$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/fk_out}; mkdir -p "$OUT"
name=$(basename "$1" .py)
CUDA_LAUNCH_BLOCKING=1 python3 -m cProfile -o "$OUT/$name.prof" -m pytest -p fk_pytest.plugin -p no:cacheprovider -q \
  "$1" -k "$2" --fk-device=cuda --fk-isolation=none --fk-candidate=examples/candidates/triton \
  --fk-report="$OUT/$name.json" 2>&1 | tail -3
python3 - "$OUT/$name.prof" <<'PY'
import pstats, sys
s = pstats.Stats(sys.argv[1]); s.sort_stats("tottime").print_stats(25); s.sort_stats("cumtime").print_callees("build.py.*(master_state|instantiate)")
PY
