"""Capture the serving scenarios of the Llama-family models into tasks/workloads/<model>.json.

    python tools/capture_workloads.py                    # every model, every scenario (CPU, minutes)
    python tools/capture_workloads.py --models qwen3-0.6b --scale 0.1 --out /tmp/wl   # a quick look

Shape-only captures on the meta device (see kernels_reference/engine/capture.py): no GPU needed, and
the output is deterministic for a given seed, so the committed files can be re-made and diffed.
"""
import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kernels_reference.engine.capture import capture_model  # noqa: E402
from kernels_reference.engine.scenarios import SCENARIOS  # noqa: E402
from tasks.configs import load_config  # noqa: E402
from tasks.workload import LLAMA_FAMILY  # noqa: E402

SMALL_MODELS = ("qwen3-0.6b", "qwen2.5-0.5b")
DEFAULT_OUT = ROOT / "tasks" / "workloads"


def dump(obj, indent: int = 0, inline_below: int = 3) -> str:
    """JSON with the structure indented and the leaves (histograms, signatures) on one line each."""
    pad = " " * indent
    if isinstance(obj, dict) and obj and inline_below > 0:
        items = [f'{pad} {json.dumps(k)}: {dump(v, indent + 1, inline_below - 1).lstrip()}' for k, v in obj.items()]
        return pad + "{\n" + ",\n".join(items) + "\n" + pad + "}"
    if isinstance(obj, list) and obj and inline_below > 0 and any(isinstance(v, (dict, list)) for v in obj):
        items = [dump(v, indent + 1, inline_below - 1) for v in obj]
        return pad + "[\n" + ",\n".join(items) + "\n" + pad + "]"
    return pad + json.dumps(obj, separators=(", ", ": "))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="*", default=list(LLAMA_FAMILY) + list(SMALL_MODELS))
    ap.add_argument("--scenarios", nargs="*", default=list(SCENARIOS))
    ap.add_argument("--layers", type=int, default=2, help="layers to run (layer 1 stands for the rest)")
    ap.add_argument("--scale", type=float, default=1.0, help="< 1 shrinks request lengths and counts")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(DEFAULT_OUT))
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    began = time.time()
    for k, model in enumerate(args.models):
        start = time.time()

        def progress(text, k=k):  # one line per scenario: a full capture runs for minutes
            print(f"[{k + 1}/{len(args.models)} models, {time.time() - began:.0f} s] {text}", flush=True)
        data = capture_model(load_config(model), [SCENARIOS[s] for s in args.scenarios], model_name=model,
                             layers=args.layers, seed=args.seed, scale=args.scale, progress=progress)
        path = out / f"{model}.json"
        path.write_text(dump(data, inline_below=5) + "\n")
        steps = {name: s["steps"] for name, s in data["scenarios"].items()}
        rows.append((model, time.time() - start, os.path.getsize(path), steps))
        print(f"{model}: {rows[-1][1]:.0f} s, {rows[-1][2] // 1024} KiB -> {path}", flush=True)
    print("| model | seconds | KiB | steps per scenario |\n|---|---|---|---|")
    for model, secs, size, steps in rows:
        print(f"| {model} | {secs:.0f} | {size // 1024} | {', '.join(f'{k} {v}' for k, v in steps.items())} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
