"""The kernels behind issue 12's two open gaps, launched a few times each for Nsight Compute
(hardware counters: DRAM throughput, occupancy, warp stalls), on the H200:

* the fused gate/up GEMV (kernels_reference/L1/fused_gemv.py) against cuBLAS's on the same weight
  (Llama-3.1-8B, one token): cuBLAS streams it at ~0.99 of copy, the fused kernel at ~0.93;
* the fused q/k/v GEMV;
* the paged decode at batch 1, context 8192 (split kernel + merge kernel): 0.50 of copy.

    ncu --clock-control none -k regex:'_norm_gemv|nvjet|_paged_decode|_merge_splits' \
        --section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats \
        python3 tools/h200_ncu_probe.py                     (device machine; gpu_steps.sh step "ncu")
"""
import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "src"), os.path.join(ROOT, "tools")]
from h200_fused_gemv import LLAMA_8B, Case  # noqa: E402
from kernels_reference.L1.paged_decode import paged_decode  # noqa: E402


def main():
    dev = torch.device("cuda")
    case = Case(LLAMA_8B, 2, dev, torch.bfloat16)
    for _ in range(2):  # the second round is the one to read (the first includes compilation)
        case.gate_up("fused", 0)
        case.gate_up("cublas", 1)
        case.qkv("fused", 0)
        decode_b1(dev, 8192)
    torch.cuda.synchronize()
    print("probe done", flush=True)


def decode_b1(dev, context, nq=32, nk=8, d=128, block=16):
    blocks = context // block
    g = torch.Generator(device=dev).manual_seed(0)
    k = torch.randn(blocks + 1, block, nk, d, generator=g, device=dev).to(torch.bfloat16)
    v = torch.randn(blocks + 1, block, nk, d, generator=g, device=dev).to(torch.bfloat16)
    table = torch.randperm(blocks, generator=g, device=dev).to(torch.int32)[None]
    q = torch.randn(1, nq, d, generator=g, device=dev).to(torch.bfloat16)
    return paged_decode(q, k, v, table, torch.tensor([context], dtype=torch.int32, device=dev), d ** -0.5)


if __name__ == "__main__":
    main()
