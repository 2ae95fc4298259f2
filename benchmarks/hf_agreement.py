"""Full-size Llama-family configs with random bf16 weights: our L4 model against HF transformers.

For each architecture, HF's model is built from the published config with random weights in bf16
on the GPU; the same weights are loaded into our LlamaForCausalLM through HF checkpoint names.
Truth is HF's model upcast to float32. For a packed batch of prompts (prefill) and then 8
teacher-forced decode steps through our paged KV cache, we report the relative L2 error of
logits against that truth for HF bf16 and for ours; the target is ours <= 2x HF bf16.

    python3 -m benchmarks hf_agreement > docs/perf/h200-hf-agreement.md   (device machine, repo root)

``--moe``: the mixture-of-experts models instead (Mixtral-8x7B, Qwen3-30B-A3B, DeepSeek-V2-Lite) at
their full widths (every expert, the full vocabulary), ``MOE_LAYERS`` = 4 layers deep (DeepSeek:
layer 0 dense, 1..3 MoE, as the real model). HF's experts run its eager per-expert loop in both
dtypes (the grouped-GEMM path is not available in every dtype). GPU memory, largest model
(Mixtral, 6.1 B parameters at 4 layers): HF bf16 12.1 GB + ours bf16 12.1 GB + the HF fp32 truth
24.3 GB (converted in place from the bf16 copy) ~ 49 GB peak of the H200's 139 GB; Qwen3-30B-A3B
3.1 B parameters (~25 GB peak), DeepSeek-V2-Lite 2.3 B (~18 GB). Same prompts (37, 300, 5, 128 +
8 decode steps) and metric as the dense run; about a minute per model on an H200.

Caveat (MoE): random-weight routers put some tokens' k-th and (k+1)-th router logits within bf16
rounding of each other, so HF bf16 and ours may each route a few tokens differently from the fp32
truth, and differently from each other; such a token's logits differ by O(1). The ratio therefore
carries some routing noise besides the kernels' own rounding (``tasks/moe.py`` explains the tasks'
rule, which leaves such tokens out; this end-to-end table does not).

    python3 -m benchmarks hf_agreement --moe     (device machine, repo root; --tiny-cpu checks it here)
"""
import json
import os
import sys
import time
from pathlib import Path

import torch
import transformers

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parents[1] / "src")]
from kernels_reference.forward_context import AttentionMetadata, set_forward_context  # noqa: E402
from kernels_reference.L4.llama import init_random_weights, model_for  # noqa: E402
from tasks.configs import load_config  # noqa: E402

MODELS = {"llama-3.1-8b": transformers.LlamaConfig, "qwen3-8b": transformers.Qwen3Config,
          "mistral-7b-v0.3": transformers.MistralConfig, "qwen2.5-7b": transformers.Qwen2Config}
MOE_MODELS = {"mixtral-8x7b": transformers.MixtralConfig, "qwen3-30b-a3b": transformers.Qwen3MoeConfig,
              "deepseek-v2-lite": transformers.DeepseekV2Config}
MOE_LAYERS = 4
PROMPTS, DECODE, BLOCK = (37, 300, 5, 128), 8, 16


TINY = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=500, head_dim=16)
# MoE models on the CPU check: the real expert counts and top-k, tiny widths; DeepSeek's MLA cut too.
TINY_MOE = dict(TINY, num_hidden_layers=MOE_LAYERS, moe_intermediate_size=32)
TINY_MLA = dict(num_key_value_heads=4, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
                q_lora_rank=None)


def config_kwargs(name, drop=()):
    """A model's config from tasks/configs as HF config arguments: our notes (``_*``), the serving
    dtype and the keys in ``drop`` (ours, not the HF class's) left out."""
    return {k: v for k, v in load_config(name).items() if not k.startswith("_") and k not in ("torch_dtype", *drop)}


def hf_config(name, cls, tiny=False, layers=None):
    cfg = config_kwargs(name, drop=("qk_norm",))
    if layers:
        cfg["num_hidden_layers"] = layers
    if tiny:  # a quick check of this script on a CPU, not a measurement
        cfg.update(TINY_MOE if layers else TINY)
        if "kv_lora_rank" in cfg:
            cfg.update(TINY_MLA)
    config = cls(**cfg)
    if layers:  # HF's per-expert loop: its grouped-GEMM experts path does not take every dtype
        config._experts_implementation = "eager"
    return config


def rel(x, truth):
    return float((x.float() - truth).norm() / truth.norm())


def report(results, model, cells, e_hf, e_ours, started, **record):
    """One model's table row, printed at once (``cells``: the columns between the model and the
    errors), and its record appended to ``results``."""
    seconds = time.time() - started
    print("| " + " | ".join([model, *map(str, cells), f"{e_hf:.4g}", f"{e_ours:.4g}", f"{e_ours / e_hf:.3f}",
                             f"{seconds:.0f}"]) + " |", flush=True)
    results.append(dict(model=model, **record, hf_bf16_error=e_hf, ours_bf16_error=e_ours, ratio=e_ours / e_hf,
                        seconds=seconds))


def write_results(results, filename):
    """The records as JSON under $OUT, where the device step sets it."""
    if os.environ.get("OUT"):
        (Path(os.environ["OUT"]) / filename).write_text(json.dumps(results, indent=1))


def main():
    tiny, moe = "--tiny-cpu" in sys.argv, "--moe" in sys.argv
    dev = torch.device("cpu" if tiny else "cuda")
    torch.manual_seed(0)
    if moe:
        print(f"MoE models {'at tiny widths (CPU check)' if tiny else 'at full width'}, {MOE_LAYERS} layers deep\n")
    print("| model | tokens | HF bf16 error vs fp32 | ours bf16 error vs fp32 | ratio (target <= 2) | seconds |")
    print("|---|---|---|---|---|---|")
    results = []
    for name, cls in (MOE_MODELS if moe else MODELS).items():
        t0 = time.time()
        config = hf_config(name, cls, tiny, MOE_LAYERS if moe else None)
        with torch.device(dev):
            hf = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).eval()
        init_random_weights(hf)  # the same trained-scale draw as our models get
        ours = model_for(config).to(device=dev, dtype=torch.bfloat16).eval()
        ours.load_weights(hf.state_dict().items())
        seqs = [torch.randint(0, config.vocab_size, (n + DECODE,)).tolist() for n in PROMPTS]
        with torch.no_grad():
            hf_bf16 = [hf(torch.tensor([s], device=dev)).logits[0].float() for s in seqs]
            hf.float()
            truth = [hf(torch.tensor([s], device=dev)).logits[0].float() for s in seqs]
            del hf
            torch.cuda.empty_cache()
            ours.allocate_kv_cache(num_blocks=sum(-(-len(s) // BLOCK) for s in seqs) + 1, block_size=BLOCK)
            tables, at = [], 0
            for s in seqs:
                n = -(-len(s) // BLOCK)
                tables.append(list(range(at, at + n)))
                at += n
            rows = [[] for _ in seqs]
            meta = AttentionMetadata.build([0] * len(seqs), list(PROMPTS), BLOCK, device=dev, block_tables=tables)
            ids = sum((s[:n] for s, n in zip(seqs, PROMPTS)), [])
            with set_forward_context(meta):
                out = ours.compute_logits(ours(torch.tensor(ids, device=dev), meta.positions())).float()
            at = 0
            for i, n in enumerate(PROMPTS):
                rows[i].append(out[at: at + n])
                at += n
            for step in range(DECODE):
                ctx = [n + step for n in PROMPTS]
                meta = AttentionMetadata.build(ctx, [1] * len(seqs), BLOCK, device=dev, block_tables=tables)
                ids = [s[c] for s, c in zip(seqs, ctx)]
                with set_forward_context(meta):
                    out = ours.compute_logits(ours(torch.tensor(ids, device=dev), meta.positions())).float()
                for i in range(len(seqs)):
                    rows[i].append(out[i: i + 1])
        ours_logits = torch.cat([torch.cat(r) for r in rows])
        hf_logits, truth_logits = torch.cat(hf_bf16), torch.cat(truth)
        e_hf, e_ours = rel(hf_logits, truth_logits), rel(ours_logits, truth_logits)
        tokens = int(ours_logits.shape[0])
        report(results, name, [tokens], e_hf, e_ours, t0, tokens=tokens, layers=config.num_hidden_layers, tiny=tiny)
        del ours
        torch.cuda.empty_cache()
    write_results(results, f"h200_hf_agreement{'_moe' if moe else ''}.json")


if __name__ == "__main__":
    main()
