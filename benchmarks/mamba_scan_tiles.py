"""Mamba-2's chunked prefill scan per tile choice of its two long-sequence kernels.

At one long sequence the scan's time goes to the serial state pass (one program per (head, block
of state elements) walking every chunk in order) and to the output kernel (one program per (chunk,
head, row block)): ``kernels_reference.ops.mamba_ssd.chunk_scan.PASSING_BLOCK`` and ``OUTPUT_TILES``
(rows, tokens per inner step, warps, pipeline stages), and whether the heads or the chunks lead
the grid (``HEADS_FIRST``). Each choice is checked against the float64 recurrence on two short
varlen batches with carried states (the worse relative error of the two is printed), then its
kernels are timed under torch.profiler (GPU time per call, summed over the scan's kernels: eager
event timing of these calls is dominated by the host's launches) on the mamba_chunk_scan task's
full-profile cases named by ``--cases``, with the slowest case's kernels beside:

    python3 -m benchmarks mamba_scan_tiles [--cases long-zero,mixed-zero,one-zero]
"""
import argparse
import dataclasses
import json

import torch

from fk_pytest.registry import get_task
from tasks.linear_inputs import Mamba2Dims
from tasks.mamba_ssd import prefill_inputs

# (HEADS_FIRST, OUTPUT_TILES): the shipped choice first
CHOICES = [
    (True, (64, 32, 4, 3)),
    (False, (64, 32, 4, 3)),
    (True, (64, 32, 4, 2)),
    (True, (32, 32, 4, 2)),
    (True, (64, 64, 4, 3)),
    (True, (128, 32, 4, 3)),
]


def _rel(x, truth):
    return float((x.double() - truth.double()).norm() / truth.double().norm())


def main():
    from benchmarks.kernel_breakdown import kernel_times
    from kernels_reference.ops.mamba_ssd import chunk_scan

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="long-zero,mixed-zero,one-zero")
    args = parser.parse_args()
    task = get_task("mamba_chunk_scan")
    wanted = args.cases.split(",")
    cases = [c for c in task.cases("full") if any(w in c.id for w in wanted)]
    device = torch.device("cuda")
    gen = lambda: torch.Generator(device=device).manual_seed(0)
    module = task.reference(**task.init_args(cases[0])).to(device)
    # the checks: the task's varlen batch with carried states, and one with 8 groups, state 64 and
    # chunk 128 (two C . B tiles per chunk side, heads sharing a group's table)
    varlen = next(c for c in task.cases("full") if "varlen-state" in c.id)
    dims = dataclasses.replace(Mamba2Dims(**varlen["dims"]), n_groups=8, state_size=64, chunk_size=128)
    checks = [(module, task.make_inputs(varlen, gen(), device)),
              (type(module)(chunk_size=128).to(device),
               prefill_inputs(dims, [1, 127, 128, 129, 700], True, gen(), device, torch.bfloat16))]
    up = lambda inputs: {k: (v.double() if torch.is_tensor(v) and v.is_floating_point() else v)
                         for k, v in inputs.items()}
    truths = [m.forward_native(**up(check)) for m, check in checks]
    case_inputs = {c.id: task.make_inputs(c, gen(), device) for c in cases}
    print(f"{'heads first':>11s}  {'output tiles':>16s}  {'rel y':>8s}  {'rel state':>9s}  "
          + "  ".join(f"{c.id.split('-prefill-')[1]:>18s}" for c in cases))
    for heads_first, tiles in CHOICES:
        chunk_scan.HEADS_FIRST, chunk_scan.OUTPUT_TILES = heads_first, tiles
        row = {"heads_first": heads_first, "output_tiles": tiles}
        try:
            rels = []
            for (m, check), truth in zip(checks, truths):
                y, states = m.forward_triton(**check)
                rels.append((_rel(y, truth[0]), _rel(states, truth[1])))
            row["rel_y"], row["rel_state"] = max(r[0] for r in rels), max(r[1] for r in rels)
            for c in cases:
                kernels = kernel_times(lambda: module.forward_triton(**case_inputs[c.id]))
                row[c.id] = sum(us for _, us in kernels)
                row[c.id + " kernels"] = {k[:40]: round(us, 1) for k, us in kernels[:5]}
        except Exception as exc:  # a choice that fails to compile or run costs its row only
            print(f"{str(heads_first):>11s}  {str(tiles):>16s}  failed: {type(exc).__name__}: {str(exc)[:120]}")
            continue
        print(f"{str(heads_first):>11s}  {str(tiles):>16s}  {row['rel_y']:8.5f}  {row['rel_state']:9.5f}  "
              + "  ".join(f"{row[c.id]:18.1f}" for c in cases), flush=True)
        slowest = max(cases, key=lambda c: row[c.id])
        print(f"    {slowest.id}: " + json.dumps(row[slowest.id + " kernels"]), flush=True)


if __name__ == "__main__":
    main()
