"""The state models at full width, random bf16 weights: our L4 model against HF transformers.

Mamba-2 (mamba2-2.7b, all 64 layers) and Qwen3-Next (Qwen3-Next-80B-A3B's widths, 512 experts, cut
to ``QWEN3_NEXT_LAYERS`` = 4 layers: its pattern of three gated DeltaNet layers and one gated full
attention, once). HF's model is built from the config in bf16 on the GPU with its parameters drawn at
a trained scale (``tasks.state_steps.draw_hf_state_model``: decay rates from slow to fast, norms near
their identity); ours loads the same weights through HF checkpoint names. Truth is HF's model upcast
to float32, each sequence recomputed whole without a cache. Ours runs as the engine feeds it: one
packed prefill step of the prompts, then 8 decode steps, through its state pools (slot per
sequence) and, for Qwen3-Next's attention layer, its paged KV cache. The table gives the relative L2
error of the logits against that truth for HF bf16 and for ours; the target is ours <= 2x HF bf16,
the dense and MoE models' rule (``benchmarks/hf_agreement.py``).

HF runs its own torch paths (no mamba-ssm or flash-linear-attention kernels are importable there),
its experts in the eager per-expert loop. The Qwen3-Next router has the MoE caveat of
``hf_agreement.py``: a token whose k-th and (k+1)-th router logits sit within bf16 rounding routes
differently in bf16 and float32 and moves the ratio.

    python3 -m benchmarks hf_agreement_states            (device machine, repo root)
    python3 -m benchmarks hf_agreement_states --tiny-cpu (checks this script on the CPU at tiny widths)
"""
import sys
import time
from pathlib import Path

import torch
import transformers

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parents[1] / "src")]
from benchmarks.hf_agreement import BLOCK, DECODE, PROMPTS, config_kwargs, rel, report, write_results  # noqa: E402
from kernels_reference.L4.llama import model_for  # noqa: E402
from tasks.state_steps import draw_hf_state_model, logits_over_steps  # noqa: E402

QWEN3_NEXT_LAYERS = 4
MODELS = {"mamba2-2.7b": (transformers.Mamba2Config, None),
          "qwen3-next-80b-a3b": (transformers.Qwen3NextConfig, QWEN3_NEXT_LAYERS)}
# The CPU check: tiny widths, the real layer patterns (Qwen3-Next's 3 + 1) and a few experts.
TINY = {"mamba2-2.7b": dict(hidden_size=64, num_heads=4, head_dim=32, state_size=16, n_groups=2, chunk_size=16,
                            num_hidden_layers=2, vocab_size=97),
        "qwen3-next-80b-a3b": dict(hidden_size=64, linear_num_key_heads=2, linear_num_value_heads=4,
                                   linear_key_head_dim=16, linear_value_head_dim=8, intermediate_size=96,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=32, vocab_size=96,
                                   num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                                   shared_expert_intermediate_size=48)}


def hf_config(name, cls, layers, tiny):
    cfg = config_kwargs(name, drop=("architectures",))
    if layers:
        cfg["num_hidden_layers"] = layers
    if tiny:  # a quick check of this script on a CPU, not a measurement
        cfg.update(TINY[name])
    config = cls(**cfg)
    if getattr(config, "num_experts", 0):  # HF's per-expert loop: its grouped-GEMM path does not take every dtype
        config._experts_implementation = "eager"
    return config


def engine_steps(config, dev):
    """The prompts as one packed prefill step, then ``DECODE`` decode steps; a state slot and a run
    of KV blocks per sequence."""
    names = [str(i) for i in range(len(PROMPTS))]
    steps = [(tuple(names), PROMPTS)] + [(tuple(names), (1,) * len(names))] * DECODE
    slots = {s: i for i, s in enumerate(names)}
    tables, at = {}, 0
    for s, n in zip(names, PROMPTS):
        blocks = -(-(n + DECODE) // BLOCK)
        tables[s], at = list(range(at, at + blocks)), at + blocks
    return names, steps, slots, tables, at


def main():
    tiny = "--tiny-cpu" in sys.argv
    dev = torch.device("cpu" if tiny else "cuda")
    gen = torch.Generator(device="cpu").manual_seed(0)  # token ids
    weights_gen = torch.Generator(device=dev).manual_seed(0)
    print("| model | layers | tokens | HF bf16 error vs fp32 | ours bf16 error vs fp32 | ratio (target <= 2) | seconds |")
    print("|---|---|---|---|---|---|---|")
    results = []
    for name, (cls, layers) in MODELS.items():
        t0 = time.time()
        config = hf_config(name, cls, layers, tiny)
        # Built and drawn on the device: Qwen3-Next's 4 layers of 512 experts are 6.4G float32
        # parameters, minutes to initialise and draw on the CPU.
        with dev:
            hf = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
        draw_hf_state_model(hf, weights_gen, centred_norms=config.model_type == "qwen3_next")
        hf = hf.to(dtype=torch.bfloat16)
        ours = model_for(config).to(device=dev, dtype=torch.bfloat16).eval()
        ours.load_weights(hf.state_dict().items())
        names, steps, slots, tables, blocks = engine_steps(config, dev)
        ids = {s: torch.randint(0, config.vocab_size, (n + DECODE,), generator=gen).to(dev)
               for s, n in zip(names, PROMPTS)}
        with torch.no_grad():
            hf_bf16 = [hf(input_ids=ids[s][None], use_cache=False).logits[0].float() for s in names]
            hf.float()
            truth = [hf(input_ids=ids[s][None], use_cache=False).logits[0].float() for s in names]
            del hf
            if dev.type == "cuda":
                torch.cuda.empty_cache()
            if hasattr(ours, "attention_layers") and list(ours.attention_layers()):
                ours.allocate_kv_cache(num_blocks=blocks + 1, block_size=BLOCK)
            ours.allocate_state_pools(num_slots=len(names))
            got = logits_over_steps(ours, ids, steps, slots, BLOCK, tables, method="forward")
        ours_logits = torch.cat([got[s].float() for s in names])
        hf_logits, truth_logits = torch.cat(hf_bf16), torch.cat(truth)
        e_hf, e_ours = rel(hf_logits, truth_logits), rel(ours_logits, truth_logits)
        tokens = int(ours_logits.shape[0])
        report(results, name, [config.num_hidden_layers, tokens], e_hf, e_ours, t0,
               layers=config.num_hidden_layers, tokens=tokens, tiny=tiny)
        del ours
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    write_results(results, "hf_agreement_states.json")


if __name__ == "__main__":
    main()
