"""Paged decode's configuration per batch shape: the reference's decode kernel under each
``DecodeConfig`` of ``CHOICES``, checked and timed by the peer benchmark on the attention task's
own serving decode cases (the captured contexts, 4 and 8 KV heads), one configuration after the
other in one process. The table gives microseconds and the fraction of the copy bandwidth measured
at the start of each run (the issue's bar: >= 0.85 at batch >= 32).

    python3 -m benchmarks decode_configs [-k "decode-B32 or decode-B139"] [--grid small-batch|large-batch]
"""
import argparse
import dataclasses
import io
import json
import os

import torch

import kernels_reference.ops.paged_decode.decode as decode
from benchmarks.markdown import md_table
from kernels_reference.ops.paged_decode.config import ONE_PASS_CONFIG, TWO_PASS_CONFIG
from fk_pytest.peers.contract import suite_ops
from fk_pytest.peers.measure import Options
from fk_pytest.peers.run import benchmark

R = dataclasses.replace
CHOICES = {
    "shipped (two-pass)": TWO_PASS_CONFIG,
    "unsplit tile off": R(TWO_PASS_CONFIG, unsplit_tile_tokens=None),  # the shipped config before 2026-12-06
    "small-batch 2/SM": R(TWO_PASS_CONFIG, small_batch_programs_per_sm=2),
    "small-batch 8/SM": R(TWO_PASS_CONFIG, small_batch_programs_per_sm=8),
    "2 blocks/iter": R(TWO_PASS_CONFIG, blocks_per_iter=2),
    "8 blocks/iter": R(TWO_PASS_CONFIG, blocks_per_iter=8),
    "3 stages": R(TWO_PASS_CONFIG, num_stages=3),
    "8 warps": R(TWO_PASS_CONFIG, num_warps=8),
    "8 warps, 8 blocks/iter": R(TWO_PASS_CONFIG, num_warps=8, blocks_per_iter=8),
    "3 stages, 2/SM": R(TWO_PASS_CONFIG, num_stages=3, programs_per_sm=3, small_batch_programs_per_sm=3),
    "one-pass": ONE_PASS_CONFIG,
    # more programs than the pairs fill at large batches (B139's captured lengths run from 232 to
    # 7680 tokens: split, the long sequences no longer finish last alone), on every decode case
    "large-batch 9/SM": R(TWO_PASS_CONFIG, programs_per_sm=9),
    "large-batch 9/SM 8 blocks/iter": R(TWO_PASS_CONFIG, programs_per_sm=9, blocks_per_iter=8),
    "large-batch 17/SM 8 blocks/iter": R(TWO_PASS_CONFIG, programs_per_sm=17, blocks_per_iter=8),
}

# --grid small-batch: a batch whose pairs do not fill the SMs (Qwen2.5-7B B32: 128 pairs of 4 kv
# heads on 132 SMs), splits x tile x pipeline depth for both kernels
SMALL_BATCH_GRID = {
    f"{kernel} {per_sm}/SM, {bpi} blocks/iter, {stages} stages":
        R(base, small_batch_programs_per_sm=per_sm, blocks_per_iter=bpi, num_stages=stages)
    for kernel, base in (("two-pass", TWO_PASS_CONFIG), ("one-pass", ONE_PASS_CONFIG))
    for per_sm in (1, 2, 3, 4) for bpi in (4, 8)
    # (the one-pass kernel's 5 stages of 8-block K/V tiles would not fit in shared memory)
    for stages in ((2, 3) if kernel == "two-pass" else (5,) if bpi == 4 else (3,))}

# --grid large-batch: a batch that fills the SMs unsplit (B139: 556 or 1112 pairs), split anyway into
# more programs (programs_per_sm 5 and 9 give 2 splits at 556 pairs, 9 gives 2 at 1112) x the tile
LARGE_BATCH_GRID = {f"{per_sm}/SM, {bpi} blocks/iter": R(TWO_PASS_CONFIG, programs_per_sm=per_sm, blocks_per_iter=bpi)
                    for per_sm in (2, 5, 9, 17) for bpi in (4, 8)}
GRIDS = {"small-batch": SMALL_BATCH_GRID, "large-batch": LARGE_BATCH_GRID}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-k", default="decode-B32 or decode-B139 or decode-B128", help="peer-benchmark case keyword")
    parser.add_argument("--only", help="CHOICES names separated by ';' (names hold commas; default: all)")
    parser.add_argument("--grid", choices=sorted(GRIDS), help="a grid's configurations instead of CHOICES")
    args = parser.parse_args()
    if args.grid:
        CHOICES.clear()
        CHOICES.update(GRIDS[args.grid])
    spec = suite_ops()["attention"]
    ops = {"attention": dataclasses.replace(spec, peers=(), ceilings=())}
    names = [n.strip() for n in args.only.split(";")] if args.only else list(CHOICES)
    unknown = [n for n in names if n not in CHOICES]
    if unknown:
        parser.error(f"--only: no configuration named {', '.join(map(repr, unknown))}; known: {'; '.join(CHOICES)}")
    rows, docs = [], {}
    for name in names:
        decode.DECODE_CONFIG = CHOICES[name]
        doc = benchmark(Options(torch.device("cuda"), "full"), ["attention"], keyword=args.k, max_cases=0, ops=ops,
                        progress=io.StringIO())
        docs[name] = doc
        for case in doc["ops"][0]["cases"]:
            ref = case["impls"]["reference"]
            rows.append((name, case["case"], ref.get("us"), ref.get("bw_frac"), ref.get("reason")))
        print(f"{name}: done", flush=True)
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "decode_configs.json"), "w") as f:
            json.dump({n: d for n, d in docs.items()}, f, indent=1, default=str)
    rows = [(name, case, us, frac, "" if note is None else str(note)[:80])
            for name, case, us, frac, note in sorted(rows, key=lambda r: (r[1], r[2] or 1e9))]
    print(md_table(["config", "case", "reference us", "of copy", "note"], rows, ["", "", ".2f", ".3f", ""]))


if __name__ == "__main__":
    main()
