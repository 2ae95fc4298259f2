"""How much the suite's roofline (copy bandwidth, bf16 GEMM rate) moves between measurements in one
process: the median of ten (the estimator until 2026-12-06) against the fastest of thirty after a
warm-up (``fk_pytest.timing.measure_roofline``'s default), interleaved, ``--repeats`` times each.

    python3 -m benchmarks roofline [--repeats 8]
"""
import argparse
import json
import os

import torch

from fk_pytest.timing import measure_roofline

from benchmarks.markdown import md_table

ESTIMATORS = {"median of 10": dict(reps=10, statistic="median"), "best of 30": dict(statistic="best")}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=8)
    args = parser.parse_args()
    device = torch.device("cuda")
    runs = {name: [] for name in ESTIMATORS}
    for _ in range(args.repeats):
        for name, kwargs in ESTIMATORS.items():
            runs[name].append(measure_roofline(device, **kwargs))
    rows = []
    for name, values in runs.items():
        for key in ("copy_tbps", "bf16_gemm_tflops"):
            xs = [v[key] for v in values]
            rows.append([name, key, min(xs), max(xs), (max(xs) - min(xs)) / max(xs)])
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "roofline.json"), "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(device), "runs": runs}, f, indent=1)
    print(md_table(["estimator", "quantity", "min", "max", "spread (max-min)/max"], rows, ["", "", ".3f", ".3f", ".3f"]))


if __name__ == "__main__":
    main()
