"""GLA's chunked prefill per tile choice of its serial state walk.

``kernels_reference.ops.gla.chunk._chunk_states_kernel`` runs one program per (sequence, head, K
block, V block) and walks the sequence's chunks in order: at one long GLA-1.3B sequence (4 heads of
256 x 512) 64 x 64 tiles make 128 programs for the GPU's 132 SMs, each waiting on its loads chunk
after chunk. ``STATE_TILES`` (K block, V block, warps, pipeline stages) trades tile size for
programs. Each choice is checked against the float64 recurrence on the task's varlen case with
carried states, then its kernels are timed under torch.profiler (GPU time per call, summed) on the
gated_linear_attention task's full-profile cases named by ``--cases``:

    python3 -m benchmarks gla_state_tiles [--cases long-carried,mixed-fresh]
"""
import argparse
import json

import torch

from fk_pytest.registry import get_task

CHOICES = [  # the shipped choice first
    (32, 64, 4, 2),
    (64, 64, 4, 2),
    (64, 32, 4, 2),
    (32, 32, 4, 2),
    (32, 32, 2, 2),
    (32, 32, 4, 3),
    (64, 32, 4, 3),
]


def _rel(x, truth):
    return float((x.double() - truth.double()).norm() / truth.double().norm())


def main():
    from benchmarks.kernel_breakdown import kernel_times
    from kernels_reference.ops.gla import chunk

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="long-carried,mixed-fresh")
    args = parser.parse_args()
    task = get_task("gated_linear_attention")
    wanted = args.cases.split(",")
    cases = [c for c in task.cases("full") if "prefill" in c.id and any(w in c.id for w in wanted)]
    device = torch.device("cuda")
    gen = lambda: torch.Generator(device=device).manual_seed(0)
    module = task.reference(**task.init_args(cases[0])).to(device)
    check = task.make_inputs(next(c for c in task.cases("full") if "varlen-carried" in c.id), gen(), device)
    truth = module.forward_native(**{k: (v.double() if torch.is_tensor(v) and v.is_floating_point() else v)
                                     for k, v in check.items()})
    case_inputs = {c.id: task.make_inputs(c, gen(), device) for c in cases}
    print(f"{'state tiles':>16s}  {'rel o':>8s}  {'rel state':>9s}  "
          + "  ".join(f"{c.id.split('-prefill-')[1]:>24s}" for c in cases))
    for tiles in CHOICES:
        chunk.STATE_TILES = tiles
        row = {}
        try:
            o, state = module.forward_triton(**check)
            rel_o, rel_state = _rel(o, truth[0]), _rel(state, truth[1])
            for c in cases:
                kernels = kernel_times(lambda: module.forward_triton(**case_inputs[c.id]))
                row[c.id] = (sum(us for _, us in kernels), {k[:30]: round(us, 1) for k, us in kernels[:4]})
        except Exception as exc:  # a choice that fails to compile or run costs its row only
            print(f"{str(tiles):>16s}  failed: {type(exc).__name__}: {str(exc)[:120]}")
            continue
        print(f"{str(tiles):>16s}  {rel_o:8.5f}  {rel_state:9.5f}  "
              + "  ".join(f"{row[c.id][0]:24.1f}" for c in cases), flush=True)
        slowest = max(cases, key=lambda c: row[c.id][0])
        print(f"    {slowest.id}: " + json.dumps(row[slowest.id][1]), flush=True)


if __name__ == "__main__":
    main()
