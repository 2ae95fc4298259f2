"""GRN's launch forms and tiles against Inductor, side by side on the GPU.

The reference's GRN (kernels_reference.L1.grn) is a sum-of-squares reduction into per-split
partials and an apply pass, in one of two forms (``grn.FORMS``: the apply programs recompute the
factors from the partials, or a factor launch between writes them). For each case below and each
form: the autotuned path, the reduction tiles at 1x, 2x and 4x the planned pixel splits (one apply
tile), the apply tiles (one reduction tile), each checked against the float64 definition and timed
in one interleaved loop (amortised CUDA graphs, L2 flushed, a fresh input set per call) beside
``torch.compile(forward_native)``. Then the peer
benchmark's GRN comparison (every case of the task) once per ``--peer-settings`` pair, with ``FORM``
and ``REDUCTION`` set to it. Where the channels cut into rows (``grn.whole_rows_shape``), the
whole-rows reduction's tiles and splits are timed too:

    python3 -m benchmarks grn_variants [--rounds 30] [--cases stage1-B32,stage3-B32] [--no-peers]
        [--peer-settings recompute:channel-blocks,recompute:auto]
"""
import argparse
import io
import json
import os

import torch

import kernels_reference.L1.grn as grn_mod
from benchmarks.graph_timing import add_times, over_sets
from benchmarks.markdown import md_table
from fk_pytest.timing import L2Flusher

# ConvNeXt-V2-Tiny's GRN inputs at 224 px: (label, batch, side, channels = 4 x the stage's dim)
CASES = (("stage1-B32", 32, 56, 384), ("stage2-B32", 32, 28, 768), ("stage3-B32", 32, 14, 1536),
         ("stage4-B32", 32, 7, 3072), ("stage1-B1", 1, 56, 384))
SETS = 4
APPLY_FOR_REDUCE_SWEEP = (32, 128, 4)  # the apply tile fixed while the reduction tiles vary
REDUCE_FOR_APPLY_SWEEP = (64, 64, 4)  # and the reduction tile while the apply tiles vary


def _tiles(splits, reduce, apply, channels):
    return grn_mod.Tiles(splits, reduce[0], reduce[1], apply[0], apply[1], reduce[2],
                         grn_mod.stats_chunk(splits, channels), apply_warps=apply[2])


def variants(batch, pixels, channels, sms):
    """label -> (Tiles, or None for the autotuned path; form; reduction of the autotuned path)"""
    planned = grn_mod.pixel_splits(batch, pixels, channels, sms)
    out = {}
    for form in grn_mod.FORMS:
        out[f"{form} autotuned"] = (None, form, "channel-blocks")
        if grn_mod.whole_rows_shape(channels) is not None:
            out[f"{form} whole-rows autotuned"] = (None, form, "whole-rows")
            rows_planned = grn_mod.whole_rows_splits(batch, pixels, channels, sms)
            for mult in (1, 2, 4):
                splits = min(grn_mod.MAX_SPLITS, rows_planned * mult)
                for rows, warps in grn_mod._ROWS_CONFIGS:
                    tiles = _tiles(splits, (rows, grn_mod.whole_rows_shape(channels), warps), APPLY_FOR_REDUCE_SWEEP,
                                   channels)._replace(whole_rows=True)
                    out[f"{form} whole-rows splits={splits} rows={(rows, warps)}"] = (tiles, form, None)
        for mult in (1, 2, 4):
            splits = min(grn_mod.MAX_SPLITS, planned * mult)
            for reduce in grn_mod._REDUCE_CONFIGS:
                out[f"{form} splits={splits} reduce={reduce}"] = (_tiles(splits, reduce, APPLY_FOR_REDUCE_SWEEP, channels),
                                                                  form, None)
        for apply in grn_mod._APPLY_CONFIGS:
            out[f"{form} apply={apply}"] = (_tiles(planned, REDUCE_FOR_APPLY_SWEEP, apply, channels), form, None)
    return out


def time_case(batch, side, channels, rounds, flush):
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    m = grn_mod.GlobalResponseNorm(channels).to(dev, torch.bfloat16)
    with torch.no_grad():
        m.weight.copy_(0.5 * torch.randn(m.weight.shape, generator=g, device=dev))
        m.bias.copy_(0.1 * torch.randn(m.bias.shape, generator=g, device=dev))
    sets = [torch.nn.functional.gelu(torch.randn(batch, side, side, channels, generator=g, device=dev)).to(torch.bfloat16)
            for _ in range(SETS)]
    m64 = grn_mod.GlobalResponseNorm(channels).to(dev, torch.float64)
    m64.load_state_dict(m.state_dict())
    with torch.no_grad():
        truth = m64.forward_native(sets[0].double())
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    impls = {}
    for label, (tiles, form, reduction) in variants(batch, side * side, channels, sms).items():
        impls[label] = lambda x, t=tiles, f=form, r=reduction: _with_reduction(
            r, lambda: grn_mod.grn_channels_last(m, x, t, form=f))
    compiled = torch.compile(m.forward_native, dynamic=False)
    impls["inductor"] = compiled
    rows, runners = {}, {}
    for name, fn in impls.items():
        try:
            with torch.no_grad():
                out = fn(sets[0])
            err = float((out.double() - truth).norm() / truth.norm())
            runners[name] = over_sets(lambda x, fn=fn: fn(x), sets, SETS)
            rows[name] = {"rel_err": err}
        except Exception as exc:  # noqa: BLE001 - one form that does not build is a row, not the end
            rows[name] = {"error": f"{type(exc).__name__}: {str(exc)[:160]}"}
    moved = 2 * sets[0].numel() * sets[0].element_size()  # one read and one write: the least any form moves
    add_times(rows, runners, flush, rounds, moved)
    return rows


def _with_reduction(reduction, call):
    """``call()`` with ``grn.REDUCTION`` set to ``reduction`` (None: as it is)."""
    shipped = grn_mod.REDUCTION
    grn_mod.REDUCTION = reduction or shipped
    try:
        return call()
    finally:
        grn_mod.REDUCTION = shipped


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--cases", default=",".join(c[0] for c in CASES))
    parser.add_argument("--no-peers", action="store_true", help="skip the peer comparison per form")
    parser.add_argument("--peer-settings", default="recompute:channel-blocks,recompute:auto,factor-launch:auto",
                        help="FORM:REDUCTION pairs the peer comparison runs once each")
    args = parser.parse_args()
    wanted = set(args.cases.split(","))
    unknown = wanted - {c[0] for c in CASES}
    if unknown:
        parser.error(f"unknown case(s) {sorted(unknown)}; known: {[c[0] for c in CASES]}")
    out_dir = os.environ.get("OUT", ".")
    flush = L2Flusher(torch.device("cuda"))
    import torch._dynamo.config as dynamo_config
    dynamo_config.recompile_limit = max(getattr(dynamo_config, "recompile_limit", 8), 64)
    results = {}
    for label, batch, side, channels in CASES:
        if label in wanted:
            results[label] = time_case(batch, side, channels, args.rounds, flush)
            print(f"{label}: done", flush=True)
            with open(os.path.join(out_dir, "grn_variants.json"), "w") as f:
                json.dump({"cases": results, "gpu": torch.cuda.get_device_name()}, f, indent=1)
    settings = [tuple(pair.split(":")) for pair in args.peer_settings.split(",")]
    for form, reduction in settings:
        if form not in grn_mod.FORMS or reduction not in grn_mod.REDUCTIONS:
            parser.error(f"--peer-settings: {form}:{reduction} is not a FORM:REDUCTION of {grn_mod.FORMS} x "
                         f"{grn_mod.REDUCTIONS}")
    peer_rows = [] if args.no_peers else peers_per_form(settings)
    with open(os.path.join(out_dir, "grn_variants.json"), "w") as f:
        json.dump({"cases": results, "peers": peer_rows, "gpu": torch.cuda.get_device_name()}, f, indent=1)
    keys = ("us", "spread", "tb_s", "vs_inductor", "rel_err")
    for label, rows in results.items():
        ranked = sorted(rows.items(), key=lambda kv: kv[1].get("us", 1e9))
        keep = [kv for i, kv in enumerate(ranked) if i < 8 or kv[0] == "inductor" or kv[0].endswith("autotuned")]
        table = [(name, *(r.get(k) for k in keys), r.get("error", "")) for name, r in keep]
        print(f"\n{label} (the 8 fastest, Inductor and each form autotuned; all in grn_variants.json)\n"
              + md_table(["form", "us", "spread", "TB/s (1 read + 1 write)", "Inductor / form", "rel err", "note"],
                         table, ["", ".2f", ".3f", ".2f", ".3f", ".1e", ""]))

    if peer_rows:
        print("\n" + md_table(["FORM:REDUCTION", "case", "reference us", "Inductor us", "ratio (best peer / ref)"],
                              peer_rows, ["", "", ".2f", ".2f", ".3f"]))


def peers_per_form(settings):
    """(FORM:REDUCTION, case, reference us, Inductor us, best peer / reference) for every case of the
    task, once per (form, reduction) of ``settings``."""
    from fk_pytest.peers.measure import Options
    from fk_pytest.peers.run import benchmark
    rows, shipped = [], (grn_mod.FORM, grn_mod.REDUCTION)
    try:
        for form, reduction in settings:
            grn_mod.FORM, grn_mod.REDUCTION = form, reduction
            doc = benchmark(Options(torch.device("cuda"), "full"), ["global_response_norm"], max_cases=0,
                            progress=io.StringIO())
            for case in doc["ops"][0]["cases"]:
                impls = case["impls"]
                rows.append((f"{form}:{reduction}", case["case"], impls["reference"].get("us"),
                             impls.get("compile", {}).get("us"), case.get("ratio")))
            print(f"peers with {form}:{reduction}: done", flush=True)
    finally:
        grn_mod.FORM, grn_mod.REDUCTION = shipped
    return rows


if __name__ == "__main__":
    main()
