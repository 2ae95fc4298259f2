"""Capture the serving scenarios of models into tasks/workloads/<model>.json.

    python tools/capture_workloads.py                    # the Llama family, every scenario (CPU, minutes)
    python tools/capture_workloads.py --models mamba2-2.7b qwen3-next-80b-a3b   # the state models
    python tools/capture_workloads.py --models qwen3-0.6b --scale 0.1 --out /tmp/wl   # a quick look

Every model serves the scenarios of ``BASE_SCENARIOS``; a model that carries a recurrent state per
sequence (Mamba-2, Qwen3-Next) also ``long-prefill``, the 64k-token prompts it is served for. A
depth cut runs the fewest layers that hold every kind of layer (2 for a plain stack, 4 for
Qwen3-Next's 3 : 1 pattern) unless ``--layers`` says more.

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

from kernels_reference.engine.capture import capture_model, carries_states, layer_kinds, layers_needed  # noqa: E402
from kernels_reference.engine.scenarios import SCENARIOS  # noqa: E402
from tasks.configs import load_config  # noqa: E402
from tasks.workload import LLAMA_FAMILY  # noqa: E402

SMALL_MODELS = ("qwen3-0.6b", "qwen2.5-0.5b")
BASE_SCENARIOS = ("chat", "long-context", "batch-1", "batch-32")
STATE_SCENARIOS = BASE_SCENARIOS + ("long-prefill",)
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
    ap.add_argument("--scenarios", nargs="*", choices=list(SCENARIOS),
                    help="default: BASE_SCENARIOS, and long-prefill for a model with recurrent states")
    ap.add_argument("--layers", type=int, help="layers to run (default: the fewest holding every kind of "
                    "layer; each run layer after layer 0 stands for the rest of its kind)")
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
        config = load_config(model)
        names = args.scenarios or (STATE_SCENARIOS if carries_states(config) else BASE_SCENARIOS)
        layers = args.layers or layers_needed(layer_kinds(config))
        data = capture_model(config, [SCENARIOS[s] for s in names], model_name=model,
                             layers=layers, seed=args.seed, scale=args.scale, progress=progress)
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
