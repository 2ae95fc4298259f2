"""Helpers of the tests of the state models (Mamba-2, Qwen3-Next): HF's tiny Qwen3-Next drawn at a
trained scale, and a model fed engine steps through its bound state pools (and KV caches)."""
import torch


@torch.no_grad()
def draw_qwen3_next(hf, gen):
    """HF Qwen3-Next parameters at a trained scale: decay rates from slow to fast, the gated norm's
    plain weight near 1, dt_bias and the zero-centred norms near 0, unit-size embedding rows,
    matrices and stacked experts ([E, out, in]: fan_in is last) at 1/sqrt(fan_in)."""
    for name, p in hf.named_parameters():
        if name.endswith("A_log"):
            p.copy_(torch.linspace(0.02, 4.0, p.numel()).log())
        elif name.endswith("linear_attn.norm.weight"):
            p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=gen))
        elif p.dim() == 1:
            p.copy_(0.3 * torch.randn(p.shape, generator=gen))
        elif name.endswith("embed_tokens.weight"):
            p.copy_(torch.randn(p.shape, generator=gen))
        else:
            p.copy_(torch.randn(p.shape, generator=gen) * p.shape[-1] ** -0.5)
    return hf


@torch.no_grad()
def logits_over_steps(model, ids, steps, slots, block_size, tables=None, method="forward_native"):
    """Feed ``model`` the steps ``(sequences, tokens each)`` of token ids through its bound state
    pools (slot ``slots[s]`` per sequence) and, with ``tables``, its paged KV caches; each
    sequence's logits, concatenated over the steps."""
    from kernels_reference.forward_context import AttentionMetadata, set_forward_context

    done = {s: 0 for s in ids}
    got = {s: [] for s in ids}
    for seqs, counts in steps:
        meta = AttentionMetadata.build([done[s] for s in seqs], list(counts), block_size,
                                       block_tables=[tables[s] for s in seqs] if tables else None,
                                       state_slots=[slots[s] for s in seqs])
        batch = torch.cat([ids[s][done[s]: done[s] + n] for s, n in zip(seqs, counts)])
        with set_forward_context(meta):
            hidden = getattr(model, method)(batch, meta.positions())
        logits = model.compute_logits(hidden, native=method == "forward_native")
        for s, part in zip(seqs, logits.split(list(counts))):
            got[s].append(part)
            done[s] += part.shape[0]
    return {s: torch.cat(parts) for s, parts in got.items()}
