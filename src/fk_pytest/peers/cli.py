"""The command line: ``fk-peers`` (also ``python -m fk_pytest.peers``)."""
from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Optional, Sequence

import torch

from ..registry import all_tasks
from .contract import suite_ops
from .measure import Options
from .run import benchmark
from .selection import select_cases
from .text import format_summary, to_markdown


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fk-peers", description=(
        "Time the reference kernels against the peers a user could pick (torch eager, torch.compile, "
        "Liger-Kernel, FlashInfer, flash-linear-attention, mamba-ssm, SDPA backends, flex_attention) "
        "on the suite's workload cases."))
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--profile", choices=["cpu", "full"], help="workload profile (default: full on cuda, cpu on cpu)")
    p.add_argument("--ops", help="comma-separated ops (default: every op with peer definitions)")
    p.add_argument("-k", dest="keyword", help="pytest-style expression over 'op case-id', e.g. 'T16384 and not fused'")
    p.add_argument("--max-cases-per-op", type=int, default=4, help="0: all (default 4, target cases first)")
    p.add_argument("--case-budget", type=float, default=0.5, help="seconds of timing loop per case (default 0.5)")
    p.add_argument("--time-budget", type=float, default=None,
                   help="stop starting new cases after this many seconds (default 280 on cuda, none on cpu; 0: none)")
    p.add_argument("--no-compile", action="store_true",
                   help="skip the torch.compile peers (flex_attention then runs uncompiled)")
    p.add_argument("--peers", help="comma-separated peer names to run (default: every peer of each op); the "
                   "reference always runs")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="write the JSON document here (rewritten after every case)")
    p.add_argument("--md", help="write the markdown tables here")
    p.add_argument("--list", action="store_true", help="print the selected cases and peers, run nothing")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _parser().parse_args(argv)
    wants_cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    device = torch.device("cuda" if wants_cuda else "cpu")
    if device.type == "cuda" and not torch.cuda.is_available():
        print("fk-peers: --device cuda but torch sees no GPU", file=sys.stderr)
        return 2
    profile = args.profile or ("full" if device.type == "cuda" else "cpu")
    budget = args.time_budget if args.time_budget is not None else (280.0 if device.type == "cuda" else 0.0)
    op_names = [o.strip() for o in args.ops.split(",") if o.strip()] if args.ops else None
    ops = suite_ops()
    if args.peers:
        ops, unknown = only_peers(ops, op_names, [n.strip() for n in args.peers.split(",") if n.strip()])
        if unknown:
            print(f"fk-peers: --peers names no peer of the selected ops: {', '.join(unknown)}", file=sys.stderr)
            return 2
    if args.list:
        return _list(ops, op_names, profile, args.keyword, args.max_cases_per_op)
    opts = Options(device=device, profile=profile, compile=not args.no_compile, case_budget_s=args.case_budget,
                   seed=args.seed)
    command = "fk-peers " + " ".join(sys.argv[1:] if argv is None else argv)
    try:
        doc = benchmark(opts, op_names, args.keyword, args.max_cases_per_op, budget, ops, args.json,
                        run_info={"command": command})
    except KeyError as exc:
        print(f"fk-peers: {exc.args[0]}", file=sys.stderr)
        return 2
    if args.md:
        Path(args.md).parent.mkdir(parents=True, exist_ok=True)
        Path(args.md).write_text(to_markdown(doc, command))
    print(format_summary(doc))
    return 0


def only_peers(ops, op_names, wanted):
    """``ops`` with each op's peers cut to ``wanted`` (a re-measurement of some peers spends no device
    time on the rest), and the wanted names that no selected op has."""
    selected = op_names or list(ops)
    cut = {name: dataclasses.replace(spec, peers=tuple(p for p in spec.peers if p.name in wanted))
           for name, spec in ops.items()}
    known = {p.name for name in selected if name in ops for p in ops[name].peers}
    return cut, [n for n in wanted if n not in known]


def _list(ops, op_names, profile, keyword, max_cases) -> int:
    tasks = all_tasks()
    for name in op_names or list(ops):
        if name not in ops or name not in tasks:
            print(f"fk-peers: no peer definitions for {name}", file=sys.stderr)
            return 2
        spec = ops[name]
        print(f"{name}: peers {', '.join(p.name for p in spec.peers)}")
        for sel in select_cases(tasks[name], spec, profile, keyword, max_cases):
            print(f"  {sel.case.id}" + (f"  (= {', '.join(sel.same_as)})" if sel.same_as else ""))
    return 0
