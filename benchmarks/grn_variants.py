"""GRN's launch forms and tiles against Inductor, side by side on the GPU.

The reference's GRN (kernels_reference.L1.grn) is a sum-of-squares reduction into per-split
partials and an apply pass, in one of two forms (``grn.FORMS``: the apply programs recompute the
factors from the partials, or a factor launch between writes them). For each case below: every
form's own path, and for each form of ``--forms`` its tile sweep (the reduction tiles at 1x, 2x and
4x the planned pixel splits with one apply tile, the apply tiles with one reduction tile), each
checked against the float64 definition eagerly and as replays of one CUDA graph over four input
sets, then timed in one interleaved loop (amortised CUDA graphs, L2 flushed, a fresh input set per
call) beside ``torch.compile(forward_native)``. Then the peer benchmark's GRN comparison (every case
of the task) once per form, with ``FORM`` set to it:

    python3 -m benchmarks grn_variants [--rounds 30] [--cases stage1-B32,stage3-B32] [--no-peers]
                                       [--forms factor-launch] [--check-only] [--splits 2,4,8]

``--splits`` replaces the two-launch forms' 1x/2x/4x split counts by the given ones; each such row
notes how many waves of resident programs its reduction launch takes (programs over SMs x the
programs of its compiled kernel that fit an SM): a launch of 1.2 waves runs its last 0.2 on a few
SMs, and a memory-bound reduction whose waves are all alike pays for that tail.
"""
import argparse
import io
import json
import os
from unittest import mock

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


def variants(batch, pixels, channels, sms, forms=grn_mod.FORMS, split_counts=None):
    """label -> (Tiles, or None for the form's own planned or autotuned path; form): every form's
    own path, and the tile sweeps of ``forms`` (``split_counts``: the reductions' pixel splits, by
    default 1x, 2x and 4x the planned count)."""
    planned = grn_mod.pixel_splits(batch, pixels, channels, sms)
    split_counts = split_counts or [min(grn_mod.MAX_SPLITS, planned * mult) for mult in (1, 2, 4)]
    out = {f"{form} autotuned": (None, form) for form in grn_mod.FORMS}
    for form in forms:
        for splits in split_counts:
            for reduce in (*grn_mod._REDUCE_CONFIGS, grn_mod.ONE_WAVE_REDUCE):
                out[f"{form} splits={splits} reduce={reduce}"] = (_tiles(splits, reduce, APPLY_FOR_REDUCE_SWEEP, channels),
                                                                  form)
        for apply in grn_mod._APPLY_CONFIGS:
            out[f"{form} apply={apply}"] = (_tiles(planned, REDUCE_FOR_APPLY_SWEEP, apply, channels), form)
    return out


def replay_error(fn, sets, truths):
    """The largest relative error over ``sets`` when ``fn`` runs as replays of one captured CUDA graph,
    each set copied into its static input: what a launch leaves behind for the next shows here."""
    static = sets[0].clone()
    with torch.no_grad():
        fn(static)  # compiled, its launch footprint known
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = fn(static)
    worst = 0.0
    for x, truth in zip(sets, truths):
        static.copy_(x)
        graph.replay()
        torch.cuda.synchronize()
        worst = max(worst, float((out.double() - truth).norm() / truth.norm()))
    return worst


def reduction_waves(x, tiles, sms):
    """Waves of the reduction launch of ``tiles``: its programs over the SMs' room for them."""
    batch, height, width, channels = x.shape
    pixels = height * width
    splits, _ = grn_mod.whole_splits(pixels, tiles.splits)
    resident = grn_mod.reduction_residency(x, tiles.reduce_rows, tiles.reduce_channels, tiles.warps)
    programs = batch * splits * -(-channels // tiles.reduce_channels)
    return programs / (sms * resident) if resident else None


def time_case(batch, side, channels, rounds, flush, forms=grn_mod.FORMS, timed=True, split_counts=None):
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
        truths = [m64.forward_native(x.double()) for x in sets]
    truth = truths[0]
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    impls = {}
    waves = {}
    for label, (tiles, form) in variants(batch, side * side, channels, sms, forms, split_counts).items():
        impls[label] = lambda x, t=tiles, f=form: grn_mod.grn_channels_last(m, x, t, form=f)
        if split_counts and isinstance(tiles, grn_mod.Tiles) and "splits=" in label:
            waves[label] = reduction_waves(sets[0], tiles, sms)
    compiled = torch.compile(m.forward_native, dynamic=False)
    impls["inductor"] = compiled
    rows, runners = {}, {}
    for name, fn in impls.items():
        try:
            with torch.no_grad():
                out = fn(sets[0])
            err = float((out.double() - truth).norm() / truth.norm())
            rows[name] = {"rel_err": err}
            if name != "inductor":
                rows[name]["replay_err"] = replay_error(fn, sets, truths)
            runners[name] = over_sets(lambda x, fn=fn: fn(x), sets, SETS)
        except Exception as exc:  # noqa: BLE001 - one form that does not build is a row, not the end
            rows[name] = {"error": f"{type(exc).__name__}: {str(exc)[:160]}"}
        if waves.get(name):
            rows[name]["reduction_waves"] = waves[name]
    if not timed:
        return rows
    moved = 2 * sets[0].numel() * sets[0].element_size()  # one read and one write: the least any form moves
    add_times(rows, runners, flush, rounds, moved)
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--cases", default=",".join(c[0] for c in CASES))
    parser.add_argument("--no-peers", action="store_true", help="skip the peer comparison per form")
    parser.add_argument("--forms", default=",".join(grn_mod.FORMS),
                        help="the forms whose tiles are swept (every form's own path is timed)")
    parser.add_argument("--splits", default="",
                        help="comma-separated pixel split counts for the two-launch forms' reduction sweep")
    parser.add_argument("--check-only", action="store_true",
                        help="run every variant once eagerly and as graph replays against float64, untimed")
    args = parser.parse_args()
    wanted = set(args.cases.split(","))
    unknown = wanted - {c[0] for c in CASES}
    if unknown:
        parser.error(f"unknown case(s) {sorted(unknown)}; known: {[c[0] for c in CASES]}")
    forms = tuple(args.forms.split(","))
    if set(forms) - set(grn_mod.FORMS):
        parser.error(f"unknown form(s) {sorted(set(forms) - set(grn_mod.FORMS))}; known: {list(grn_mod.FORMS)}")
    try:
        split_counts = [int(n) for n in args.splits.split(",") if n.strip()]
    except ValueError:
        parser.error(f"--splits takes comma-separated whole numbers, got {args.splits!r}")
    if any(not 1 <= n <= grn_mod.MAX_SPLITS for n in split_counts):
        parser.error(f"--splits: each count must be 1..{grn_mod.MAX_SPLITS}, got {split_counts}")
    out_dir = os.environ.get("OUT", ".")
    flush = L2Flusher(torch.device("cuda"))
    import torch._dynamo.config as dynamo_config
    dynamo_config.recompile_limit = max(getattr(dynamo_config, "recompile_limit", 8), 64)
    results = {}
    for label, batch, side, channels in CASES:
        if label in wanted:
            results[label] = time_case(batch, side, channels, args.rounds, flush, forms, not args.check_only,
                                       split_counts)
            print(f"{label}: done", flush=True)
            if args.check_only:
                for name, row in results[label].items():
                    print(f"  {name}: {row}")
            with open(os.path.join(out_dir, "grn_variants.json"), "w") as f:
                json.dump({"cases": results, "gpu": torch.cuda.get_device_name()}, f, indent=1)
    if args.check_only:
        return
    peer_rows = [] if args.no_peers else peers_per_form()
    with open(os.path.join(out_dir, "grn_variants.json"), "w") as f:
        json.dump({"cases": results, "peers": peer_rows, "gpu": torch.cuda.get_device_name()}, f, indent=1)
    keys = ("us", "spread", "tb_s", "vs_inductor", "rel_err", "replay_err")
    for label, rows in results.items():
        ranked = sorted(rows.items(), key=lambda kv: kv[1].get("us", 1e9))
        keep = [kv for i, kv in enumerate(ranked) if i < 8 or kv[0] == "inductor" or kv[0].endswith("autotuned")]
        table = [(name, *(r.get(k) for k in keys), r.get("error") or waves_note(r)) for name, r in keep]
        print(f"\n{label} (the 8 fastest, Inductor and each form autotuned; all in grn_variants.json)\n"
              + md_table(["form", "us", "spread", "TB/s (1 read + 1 write)", "Inductor / form", "rel err", "replay err",
                          "note"],
                         table, ["", ".2f", ".3f", ".2f", ".3f", ".1e", ".1e", ""]))

    if peer_rows:
        print("\n" + md_table(["FORM", "case", "reference us", "Inductor us", "ratio (best peer / ref)"], peer_rows,
                              ["", "", ".2f", ".2f", ".3f"]))


def waves_note(row):
    return f"reduction {row['reduction_waves']:.2f} waves" if row.get("reduction_waves") else ""


def peers_per_form():
    """(form, case, reference us, Inductor us, best peer / reference) for every case of the task."""
    from fk_pytest.peers.measure import Options
    from fk_pytest.peers.run import benchmark
    rows = []
    for form in (*grn_mod.FORMS, "by-shape"):
        with mock.patch.object(grn_mod, "FORM", form):  # a graph captured under it keeps its launches
            doc = benchmark(Options(torch.device("cuda"), "full"), ["global_response_norm"], max_cases=0,
                            progress=io.StringIO())
        for case in doc["ops"][0]["cases"]:
            impls = case["impls"]
            rows.append((form, case["case"], impls["reference"].get("us"), impls.get("compile", {}).get("us"),
                         case.get("ratio")))
        print(f"peers with FORM={form}: done", flush=True)
    return rows


if __name__ == "__main__":
    main()
