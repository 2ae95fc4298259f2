"""The linear-attention scans' Triton kernels per tile choice, checked and timed on a task's cases.

The chunked and recurrent scans (kernels_reference/ops/mamba_ssd, gla, rwkv7, gated_delta) spend a
long prefill in a few kernels whose tile sizes, warps, pipeline stages, grid order and prefetching
(and, for RWKV-7, whether prefill is chunked at all) are module-level settings. For one task, every
choice of ``SWEEPS[task]`` (the shipped one first; a choice sets what it names over the shipped
settings) is set on the kernel modules, checked against
the float64 recurrence (``forward_native``) on the task's short varlen batch with carried states,
plus the sweep's extra check batches (the worst relative error of output and states is printed),
then its kernels are timed under torch.profiler on the task's full-profile cases named by
``--cases`` (GPU time per call summed over the kernels: eager event timing of these calls measures
the host's launches), with the slowest case's kernels beside:

    python3 -m benchmarks scan_tiles mamba_chunk_scan [--cases long-zero,mixed-zero]
    python3 -m benchmarks scan_tiles gated_linear_attention
    python3 -m benchmarks scan_tiles rwkv7
    python3 -m benchmarks scan_tiles gated_delta_rule
"""
import argparse
import dataclasses
import json

import torch

from fk_pytest.registry import get_task


def _varlen_case(task):
    """The task's short variable-length batch whose sequences carry initial states: every sweep's
    check batch, and the one the extra checks below vary."""
    return next(c for c in task.cases("full") if "varlen" in c.id and ("state" in c.id or "carried" in c.id))


def _mamba_groups_check(task, module, gen, device):
    """8 groups of heads, state 64, chunk 128: two C.B tiles per chunk side, heads sharing a table."""
    from tasks.linear_inputs import Mamba2Dims
    from tasks.mamba_ssd import prefill_inputs
    dims = dataclasses.replace(Mamba2Dims(**_varlen_case(task)["dims"]), n_groups=8, state_size=64, chunk_size=128)
    return type(module)(chunk_size=128).to(device), prefill_inputs(dims, [1, 127, 128, 129, 700], True, gen, device,
                                                                    torch.bfloat16)


def _rwkv7_strong_decay_check(task, module, gen, device):
    """The varlen batch with decays 30x the layer's (up to ~18 nats a token): the chunked prefill's
    exact elementwise fallback, on chunks next to ones that take the products."""
    inputs = task.make_inputs(_varlen_case(task), gen, device)
    strong = inputs["w"].clone()
    strong[:, : strong.shape[1] // 2] *= 30  # the first half of the tokens only
    return module, dict(inputs, w=strong)


def _rwkv7_repeated_key_check(task, module, gen, device):
    """The varlen batch with every token's a and b along one key direction (a repeated token):
    T ~ 0.9 for every pair of a chunk, where (I - T)^{-1} needs all its powers and amplifies T's
    rounding most."""
    inputs = task.make_inputs(_varlen_case(task), gen, device)
    a = inputs["a"]
    kk = torch.nn.functional.normalize(torch.randn(a.shape[-1], generator=gen, device=device)
                                       + 0.05 * torch.randn(a.shape, generator=gen, device=device), dim=-1)
    return module, dict(inputs, a=(-kk).to(a.dtype), b=(0.9 * kk).to(a.dtype))


# task -> (kernel modules, comma-separated; default --cases; extra checks; [settings per choice], each
# setting made on the module that has it)
SWEEPS = {
    "mamba_chunk_scan": ("kernels_reference.ops.mamba_ssd.chunk_scan", "long-zero,mixed-zero,one-zero",
                         [_mamba_groups_check], [
        # (2-warp, 4-5 stage, (64, 64, 2, 4) and (128, 32, 8, 3) tiles were slower on an H100 on 2026-12-05,
        # (64, 32, 4, 2), (64, 32, 8, 2), (128, 32, 4, 2) and (32, 32, 2, 3) on 2026-12-06:
        # docs/perf/h100-scan-tiles.md. With the output kernel's unmasked table loads, (128, 32, 4, 4),
        # (128, 64, 4, 4) and (32, 32, 2, 5) from mamba-ssm's tile list were slower on 2026-12-07:
        # docs/perf/h100-2026-12-07e.md.)
        dict(HEADS_FIRST=True, OUTPUT_TILES=(64, 32, 4, 3)),
        dict(OUTPUT_TILES=(64, 32, 4, 4)),
        dict(OUTPUT_TILES=(64, 64, 4, 3)),
        dict(HEADS_FIRST=False),
    ]),
    "gated_delta_rule": ("kernels_reference.ops.gated_delta.chunk", "long-carried,mixed-fresh", [], [
        # (the WY kernel's whole-chunk products were 1971-3192 us against 1432 on an H100 on
        # 2026-12-06 and are gone: docs/perf/h100-2026-12-06.md)
        # (the state pass's prefetch: 2590 against 1538 us on 32768 tokens, 2026-12-06; on 2026-12-07
        # at 64 / 64 V blocks: 8 warps in the WY kernel 2804 against 1423 us, in the output kernel
        # 1387 against 805, in the state pass 1562 against 1548; 32-wide state blocks with 2 warps
        # 2527: docs/perf/h100-2026-12-07b.md)
        dict(STATE_PREFETCH=False, WY_WARPS=4, STATE_WARPS=4, STATE_STAGES=2, OUTPUT_WARPS=4,
             STATE_BLOCK_V=32, OUTPUT_BLOCK_V=128),
        dict(STATE_BLOCK_V=64, OUTPUT_BLOCK_V=64),
        dict(STATE_STAGES=3),
        dict(OUTPUT_BLOCK_V=64),
    ]),
    "gated_linear_attention": ("kernels_reference.ops.gla.chunk", "long-carried,mixed-fresh", [], [
        dict(STATE_TILES=(32, 64, 4, 2), ROWS_BK=32, STATE_PREFETCH=True),
        dict(STATE_TILES=(32, 64, 4, 2), ROWS_BK=32, STATE_PREFETCH=False),
        dict(STATE_TILES=(64, 64, 4, 2), ROWS_BK=32, STATE_PREFETCH=True),
        dict(STATE_TILES=(32, 64, 4, 3), ROWS_BK=32, STATE_PREFETCH=True),
        dict(STATE_TILES=(32, 64, 4, 2), ROWS_BK=64, STATE_PREFETCH=True),
    ]),
    "rwkv7": ("kernels_reference.ops.rwkv7.recurrent,kernels_reference.ops.rwkv7.chunk",
              "long-carried,varlen-carried", [_rwkv7_strong_decay_check, _rwkv7_repeated_key_check], [
        dict(PREFILL_CHUNKED=True, PREP_PRECISION="tf32", INVERSE_BY_POWERS=True, WALK_PREFETCH=True),
        dict(PREFILL_CHUNKED=True, PREP_PRECISION="tf32", INVERSE_BY_POWERS=True, WALK_PREFETCH=False),
        dict(PREFILL_CHUNKED=True, PREP_PRECISION="ieee", INVERSE_BY_POWERS=False, WALK_PREFETCH=True),
        # slower on an H100 on 2026-12-06 (6644-8782 against 6082 us without prefetching on 32k
        # tokens, errors equal): tf32 with substitution, ieee and tf32x3 with powers
    ]),
}


def _label(settings):
    return " ".join(f"{k}={str(v).replace(' ', '')}" for k, v in settings.items())


def _rel(x, truth):
    return float((x.double() - truth.double()).norm() / truth.double().norm())


def _float64(inputs):
    return {k: (v.double() if torch.is_tensor(v) and v.is_floating_point() else v) for k, v in inputs.items()}


def main():
    import importlib

    from benchmarks.kernel_breakdown import kernel_times

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("task", choices=sorted(SWEEPS))
    parser.add_argument("--cases", help="only cases whose id contains one of these (comma-separated)")
    args = parser.parse_args()
    module_names, default_cases, extra_checks, choices = SWEEPS[args.task]
    kernel_modules = [importlib.import_module(name) for name in module_names.split(",")]
    task = get_task(args.task)
    wanted = (args.cases or default_cases).split(",")
    full = task.cases("full")
    cases = [c for c in full if "decode" not in c.id and any(w in c.id for w in wanted)]
    device = torch.device("cuda")
    gen = lambda: torch.Generator(device=device).manual_seed(0)
    module = task.reference(**task.init_args(cases[0])).to(device)
    checks = [(module, task.make_inputs(_varlen_case(task), gen(), device))]
    checks += [check(task, module, gen(), device) for check in extra_checks]
    truths = [m.forward_native(**_float64(inputs)) for m, inputs in checks]
    case_inputs = {c.id: task.make_inputs(c, gen(), device) for c in cases}
    short = lambda case_id: case_id.split("-prefill-")[-1]
    width = max(len(_label(settings)) for settings in choices)  # whole labels: truncated ones read alike
    print(f"{'choice':>{width}s}  {'rel out':>8s}  {'rel state':>9s}  "
          + "  ".join(f"{short(c.id):>20s}" for c in cases))
    home = {name: next(m for m in kernel_modules if hasattr(m, name)) for settings in choices for name in settings}
    shipped = {name: getattr(m, name) for name, m in home.items()}
    for settings in choices:  # each choice is the shipped settings with its own changed
        for name, value in {**shipped, **settings}.items():
            setattr(home[name], name, value)
        label = _label(settings)
        try:
            rels = []
            for (m, inputs), truth in zip(checks, truths):
                out, state = m.forward_triton(**inputs)
                rels.append((_rel(out, truth[0]), _rel(state, truth[1])))
            times = {}
            for c in cases:
                kernels = kernel_times(lambda: module.forward_triton(**case_inputs[c.id]))
                times[c.id] = (sum(us for _, us in kernels), {k[:32]: round(us, 1) for k, us in kernels[:5]})
        except Exception as exc:  # a choice that fails to compile or run costs its row only
            print(f"{label:>{width}s}  failed: {type(exc).__name__}: {str(exc)[:120]}", flush=True)
            continue
        print(f"{label:>{width}s}  {max(r[0] for r in rels):8.5f}  {max(r[1] for r in rels):9.5f}  "
              + "  ".join(f"{times[c.id][0]:20.1f}" for c in cases), flush=True)
        slowest = max(cases, key=lambda c: times[c.id][0])
        print(f"    {slowest.id}: " + json.dumps(times[slowest.id][1]), flush=True)


if __name__ == "__main__":
    main()
