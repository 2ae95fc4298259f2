"""The gated delta rule's chunked prefill per V block width of its serial state pass.

The state pass (``kernels_reference.ops.gated_delta.chunk._chunk_states_kernel``) runs one program
per (sequence, value head, V block): at one long Qwen3-Next sequence that is 32 heads x V / BV
programs for the H200's 132 SMs. Narrower blocks give more programs but once faulted inside
Triton 3.6's dots, so each width runs in its own process (a fault costs that width only) and is
checked against the float32 native recurrence on a short case before it is timed:

    python3 -m benchmarks gated_delta_blocks [--widths 64,32] [--tokens 32768,4096x8]
"""
import argparse
import json
import os
import subprocess
import sys

import torch

DIMS = dict(k_heads=16, v_heads=32, head_k_dim=128, head_v_dim=128)  # Qwen3-Next-80B-A3B


def _batch(spec: str):
    """"32768" -> one sequence of 32768 tokens; "4096x8" -> eight of 4096."""
    length, _, count = spec.partition("x")
    return [int(length)] * int(count or 1)


def one_width(width: int, specs):
    from benchmarks.kernel_breakdown import kernel_times
    from kernels_reference.L1.gated_delta_rule import GatedDeltaRule
    from kernels_reference.ops.gated_delta import chunk
    from tasks.gated_delta_inputs import gated_delta_inputs

    chunk.STATE_BLOCK_V = width
    layer = GatedDeltaRule()
    gen = torch.Generator(device="cuda").manual_seed(0)
    check = gated_delta_inputs([300, 65, 1000], **DIMS, with_state=True, gen=gen, device="cuda", dtype=torch.bfloat16)
    o, state = layer(**check)
    truth_o, truth_state = layer.forward_native(**check)
    rel = lambda x, t: float((x.float() - t.float()).norm() / t.float().norm())
    row = {"width": width, "check_rel_o": rel(o, truth_o), "check_rel_state": rel(state, truth_state)}
    for spec in specs:
        lengths = _batch(spec)
        inputs = gated_delta_inputs(lengths, **DIMS, with_state=False, gen=gen, device="cuda", dtype=torch.bfloat16)
        for _ in range(3):
            layer(**inputs)
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times = []
        for _ in range(10):
            start.record()
            layer(**inputs)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e3)
        row[spec] = sorted(times)[len(times) // 2]
        row[spec + " kernels"] = {k[:60]: us for k, us in kernel_times(lambda: layer(**inputs))[:6]}
    print(json.dumps(row), flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--widths", default="64,32")
    parser.add_argument("--tokens", default="32768,4096x8")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    specs = args.tokens.split(",")
    if args.one:
        return one_width(args.one, specs)
    print(f"{'width':>5s}  {'rel o':>8s}  {'rel state':>9s}  " + "  ".join(f"{s + ' us':>12s}" for s in specs))
    for width in (int(w) for w in args.widths.split(",")):
        run = subprocess.run([sys.executable, "-m", "benchmarks.gated_delta_blocks", "--one", str(width),
                              "--tokens", args.tokens], capture_output=True, text=True, env=os.environ)
        rows = [line for line in run.stdout.splitlines() if line.startswith("{")]
        if run.returncode or not rows:
            print(f"{width:5d}  failed (exit {run.returncode}): {run.stderr.strip().splitlines()[-1:] or ''}")
            continue
        row = json.loads(rows[-1])
        print(f"{width:5d}  {row['check_rel_o']:8.4f}  {row['check_rel_state']:9.4f}  "
              + "  ".join(f"{row[s]:12.1f}" for s in specs))
        for s in specs:
            print(f"       {s}: " + ", ".join(f"{k} {v:.0f} us" for k, v in row[s + " kernels"].items()))


if __name__ == "__main__":
    main()
