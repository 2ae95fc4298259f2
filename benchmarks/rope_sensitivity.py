"""How far the RoPE mutants (or others) move a random-weight end-to-end cut's top-1, per depth,
rope base, router and q/k-norm scale: a CPU stand-in for a GPU case's mutant margins.

``python -m benchmarks rope_sensitivity [--model qwen3-next-80b-a3b] [--scenario batch-32]
[--hidden 512] [--experts 32] [--dtype bfloat16] [--mutants rope|case|NAME,...]
LAYERS:THETA[:ROUTER_SCALE[:QK_SCALE]] ...`` builds the end-to-end case's full-profile model (its
attention shape; local heads as ``tasks.e2e`` draws them) at LAYERS layers and rope base THETA,
narrower elsewhere so that it runs on a CPU, and scores the scenario's requests (at 10% scale)
prefill- and decode-forced with the reference and with each mutant (default the two RoPE ones;
``case``: every mutant the case applies). It prints the share of target tokens each mutant flips
against the reference. ROUTER_SCALE multiplies every MoE router's weight (its logits'
temperature); QK_SCALE sets the attention's q and k norm scales to about that value, which
multiplies every attention logit by its square (``tasks.e2e.sharp_heads``; default: the case's
own, ``tasks.e2e.qk_norm_scale``). In float32 there are no noise runs (a CPU flips nothing), so
compare its numbers across cuts, against a GPU floor measured elsewhere; in bfloat16 a re-batched
run of the reference (the evaluator's ``rebatched_engine_args``) stands for the floor, and the
mutants are counted on the positions it keeps, as the evaluator counts them. For the evaluator's
own noise runs and verdict at a cut, ``benchmarks/e2e_calibration.py``.
"""
import argparse
import time

import torch

from fk_pytest.e2e import as_mutant
from fk_pytest.e2e_run import _engine, compose_candidate
from kernels_reference.L4.llama import init_random_weights, model_for
from tasks.e2e import E2E as SPEC, WEIGHT_SEED, model_config, qk_norm_scale, shaped_attention, sharp_routers

MODEL = "qwen3-next-80b-a3b"
ROPE_MUTANTS = ("rope-ignores-positions", "rope-wrong-in-decode")


def flipped(a, b, keep=None) -> float:
    """The share of positions where ``b`` differs from ``a`` (of those ``keep`` marks, if given)."""
    keep = keep or [[True] * len(xs) for xs in a]
    pairs = [(x, y) for xs, ys, ks in zip(a, b, keep) for x, y, k in zip(xs, ys, ks) if k]
    return sum(x != y for x, y in pairs) / max(1, len(pairs))


def agree(a, b):
    return [[x == y for x, y in zip(xs, ys)] for xs, ys in zip(a, b)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("cuts", nargs="+", help="LAYERS:THETA, e.g. 4:1e7 8:1e7")
    ap.add_argument("--scenario", default="batch-32")
    ap.add_argument("--model", default=MODEL, help="another end-to-end model with RoPE and q/k norms (qwen3-30b-a3b)")
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--experts", type=int, default=32)
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    ap.add_argument("--mutants", default="rope",
                    help="'rope' (the two RoPE mutants), 'case' (every mutant the end-to-end case applies), "
                         "or built-in mutant names, comma-separated")
    args = ap.parse_args()
    case = next((c for c in SPEC.cases("full", 0.1) if c["model"] == args.model and c["scenario"] == args.scenario), None)
    if case is None:
        ap.error(f"no full-profile end-to-end case {args.model}-{args.scenario}")
    applied = SPEC.mutants(case)
    mutants = (ROPE_MUTANTS if args.mutants == "rope" else tuple(applied) if args.mutants == "case"
               else tuple(args.mutants.split(",")))
    unknown = [m for m in mutants if m not in applied]
    if unknown:
        ap.error(f"{', '.join(unknown)}: not among the mutants of {case.id} ({', '.join(applied)})")
    requests, continuations = SPEC.requests(case), SPEC.continuations(case)
    sequences = [p + list(c) for (p, _), c in zip(requests, continuations)]
    prompt_lens = [len(p) for p, _ in requests]
    engine_args = dict(SPEC.engine_args(case), cuda_graphs=False)
    rebatched = dict(SPEC.rebatched_engine_args(case), cuda_graphs=False)
    dtype = getattr(torch, args.dtype)
    print(f"{case.id}: {len(requests)} requests, prompts {min(prompt_lens)}-{max(prompt_lens)} tokens, "
          f"{sum(n for _, n in requests)} target tokens; hidden {args.hidden}, {args.experts} experts, {args.dtype}")
    print("| layers | rope_theta | router scale | q/k norm scale | re-batched pre / dec | "
          + " | ".join(f"{m} pre / dec" for m in mutants) + " | s |")
    print("|---|---|---|---|---|" + "---|" * len(mutants) + "---|")
    for cut in args.cuts:
        parts = cut.split(":")
        defaults = ["1", str(qk_norm_scale(args.model, "full"))]  # ROUTER_SCALE, QK_SCALE
        layers, theta, router, qk = (parts + defaults[max(0, len(parts) - 2):])[:4]
        started = time.time()
        config = dict(model_config(args.model, "full"), num_hidden_layers=int(layers), rope_theta=float(theta),
                      hidden_size=args.hidden, num_experts=args.experts)
        reference = shaped_attention(init_random_weights(model_for(config), torch.Generator().manual_seed(WEIGHT_SEED)),
                                     float(qk))
        reference = sharp_routers(reference, float(router)).to(dtype).eval()
        scores = {}
        for name in (None, "rebatched") + mutants:
            model = reference if name in (None, "rebatched") else compose_candidate(
                reference, as_mutant(applied[name]).classes.get, share_parameters=True)[0]
            llm = _engine(model, reference, rebatched if name == "rebatched" else engine_args)
            with torch.no_grad():
                scores[name] = (llm.score(sequences, prompt_lens), llm.score_decode(sequences, prompt_lens))
        ref = scores[None]
        keep = [agree(ref[i], scores["rebatched"][i]) for i in range(2)]
        cells = [f"{flipped(ref[0], scores[m][0], keep[0]):.3f} / {flipped(ref[1], scores[m][1], keep[1]):.3f}"
                 for m in ("rebatched",) + mutants]
        print(f"| {layers} | {theta} | {router} | {qk} | " + " | ".join(cells) + f" | {time.time() - started:.0f} |",
              flush=True)


if __name__ == "__main__":
    main()
