"""Whether a random-weight end-to-end model can decide at another cut: the evaluator's own
calibration of every scenario of the model (targets, noise runs, built-in mutants) per variant,
and the verdict a reference-equivalent tree would get from it.

``python -m benchmarks e2e_calibration --model qwen3-30b-a3b [--scale 0.1] [--json PATH]
LAYERS[:QK_SCALE[:ROUTER_SCALE]] ...`` builds the full-profile case's reference as ``tasks.e2e`` does
(``build_reference``), with LAYERS layers (``FULL_LAYERS``) and the q/k norm scale QK_SCALE
(``QK_NORM_SCALE``; default the model's own), every MoE router's weight times ROUTER_SCALE
(``tasks.e2e.sharp_routers``, before the cast to the serving dtype; default 1), runs ``fk_pytest.e2e_run.calibrate`` on the device
(CUDA: decode graphs, the plain-PyTorch and, for the MoE models, rounded noise runs), and judges
the reference's own top-1 as the candidate (``_judge``: d = 0). Per scenario it prints the
status, the stable tokens, each path's floor and each mutant's d with the margin past its catch
line. A variant worth shipping has every scenario PASSED (enough stable tokens, every mutant
caught); the margins say by how much. ``--config KEY=VALUE`` overrides the model's config
further (``hidden_size=512 moe_intermediate_size=192``: a narrower stand-in that fits a CPU).
"""
import argparse
import json
import time
from unittest import mock

import torch

from fk_pytest.build import release_memory
from fk_pytest.e2e import PATHS, E2EResult
from fk_pytest.e2e_run import _judge, calibrate
from tasks import e2e as tasks_e2e
from tasks.configs import load_config
from tasks.e2e import E2E as SPEC, shaped_attention


def judged(scenarios) -> dict:
    """Each scenario's verdict with the reference's own top-1 as the candidate."""
    out = {}
    for sid, run in scenarios.items():
        result = E2EResult(sid, SPEC.name, SPEC.family, "", "")
        result.output_tokens = sum(map(len, run.expected))
        _judge(result, scenarios, sid, {p: run.expected for p in PATHS})
        out[sid] = result
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("variants", nargs="+", help="LAYERS[:QK_SCALE[:ROUTER_SCALE]], e.g. 8:2 12:2 24:1.4 24:2:4")
    ap.add_argument("--model", default="qwen3-30b-a3b")
    ap.add_argument("--scale", type=float, default=0.1, help="the scenarios' scale (--fk-e2e-scale)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--json", help="write every scenario's judged result here")
    ap.add_argument("--config", nargs="*", default=[], metavar="KEY=VALUE",
                    help="config overrides (numbers), e.g. hidden_size=512 for a CPU stand-in")
    args = ap.parse_args()
    case = next((c for c in SPEC.cases("full", args.scale) if c["model"] == args.model), None)
    if case is None or case["weights"] != "random":
        ap.error(f"{args.model}: not a random-weight model of the full profile's end-to-end cases")
    overrides = {}
    for kv in args.config:
        key, _, value = kv.partition("=")
        try:
            overrides[key] = float(value) if any(c in value for c in ".e") else int(value)
        except ValueError:
            ap.error(f"--config {kv!r}: expected KEY=NUMBER")
    variants = []
    for variant in args.variants:
        parts = variant.split(":")
        try:
            layers = int(parts[0])
            qk = float(parts[1]) if len(parts) > 1 else tasks_e2e.qk_norm_scale(args.model, "full")
            router = float(parts[2]) if len(parts) > 2 else 1.0
        except ValueError:
            ap.error(f"variant {variant!r}: expected LAYERS[:QK_SCALE[:ROUTER_SCALE]] (an integer, then numbers)")
        if len(parts) > 3 or layers < 1:
            ap.error(f"variant {variant!r}: expected LAYERS[:QK_SCALE[:ROUTER_SCALE]] with at least one layer")
        variants.append((variant, layers, qk, router))
    device = torch.device(args.device)
    started = time.time()

    def progress(line: str) -> None:
        print(f"  ... {line} ({time.time() - started:.0f} s)", flush=True)

    rows, dump = [], {}
    for variant, layers, qk, router in variants:
        t0 = time.time()
        with mock.patch.dict(tasks_e2e.FULL_LAYERS, {args.model: layers}), \
                mock.patch.dict(tasks_e2e.QK_NORM_SCALE, {args.model: {"full": qk}}), \
                mock.patch.object(tasks_e2e, "shaped_attention",
                                  lambda m, scale: tasks_e2e.sharp_routers(shaped_attention(m, scale), router)), \
                mock.patch.object(tasks_e2e, "load_config", lambda m: dict(load_config(m), **overrides)):
            reference = SPEC.build_reference(case, device)
            results = judged(calibrate(SPEC, case, reference, device, progress))
        del reference
        release_memory()
        for sid, r in results.items():
            mutants = " ".join(f"{n}={m.d:.2f}{'' if m.caught else '!'}" for n, m in r.mutants.items()
                               if m.d is not None)
            margin = r.min_mutant_margin
            rows.append(f"| {layers} | {qk} | {router} | {sid} | {r.status} | {r.compared_tokens}/{r.output_tokens} | "
                        f"{r.paths[PATHS[0]]['g']:.3f} / {r.paths[PATHS[1]]['g']:.3f} | "
                        f"{'-' if margin is None else f'{margin:+.2f}'} | {mutants} | {time.time() - t0:.0f} |")
            dump[f"{variant}/{sid}"] = r.as_json()
        print("\n".join(rows[-len(results):]), flush=True)
    print(f"\n{args.model}{''.join(f', {k}={v}' for k, v in overrides.items())}, scale {args.scale}, {device}: d of each mutant on its worse path ('!': not caught)")
    print("| layers | q/k scale | router scale | scenario | status | stable/all | g pre / dec | min margin | mutants | s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dump, f, indent=1)


if __name__ == "__main__":
    main()
