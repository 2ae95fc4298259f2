"""RMSNormGated's launch on decode-sized steps: warps per program, swept against mamba-ssm's kernel.

A Mamba-2 decode step normalises a few rows of one 5120-wide group: one program per row, fewer
programs than SMs, each reading its row with the warps the size rule gives (8). For each value of
``kernels_reference.L1.rms_norm_gated.FEW_PROGRAM_WARPS`` (None: that rule) the peer benchmark
checks and times the reference on the op's decode cases (Mamba-2 and Qwen3-Next) beside mamba-ssm's gated norm (the
kernel vLLM ported), interleaved in one loop under CUDA graphs; the table gives both times and the
ratio (peer / reference, > 1: the reference faster). The mamba-ssm source must be importable
(``gpu_steps.sh norm-launch`` unpacks its sdist from .whl).

    python3 -m benchmarks norm_launch
"""
import dataclasses
import io

import torch

import kernels_reference.L1.rms_norm_gated as norm
from benchmarks.markdown import md_table
from fk_pytest.peers.contract import suite_ops
from fk_pytest.peers.measure import Options
from fk_pytest.peers.run import benchmark

SETTINGS = (None, 16, 32, 4)
PEER = "mamba-ssm"


def main():
    spec = suite_ops()["rms_norm_gated"]
    ops = {"rms_norm_gated": dataclasses.replace(spec, peers=tuple(p for p in spec.peers if p.name == PEER))}
    rows = []
    for warps in SETTINGS:
        norm.FEW_PROGRAM_WARPS = warps
        doc = benchmark(Options(torch.device("cuda"), "full"), ["rms_norm_gated"], keyword="decode",
                        max_cases=0, ops=ops, progress=io.StringIO())
        for case in doc["ops"][0]["cases"]:
            ref, peer = case["impls"]["reference"], case["impls"].get(PEER, {})
            rows.append((str(warps), case["case"], ref.get("us"), peer.get("us"), case.get("ratio")))
    print(md_table(["FEW_PROGRAM_WARPS", "case", "reference us", f"{PEER} us", "ratio"], rows,
                   ["", "", ".2f", ".2f", ".3f"]))


if __name__ == "__main__":
    main()
