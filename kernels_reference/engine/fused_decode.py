"""The engine's fused batch-1 decode: a Llama step whose per-layer glue runs inside its GEMVs.

Why: at batch 1 a decode step is bound by reading the weights once, and on the H200 everything that
is not a GEMV (two norms, RoPE, the KV store, SiluAndMul: ~7 kernels a layer) added 0.66 ms to a
4.53 ms Llama-3.1-8B step (docs/perf/h200-engine.md). Here a layer is six launches instead of
eleven: ``norm_gemv_rope_kv`` (norm -> qkv -> RoPE -> KV store), the paged decode and its merge,
the o projection, ``norm_gemv_silu_mul`` (norm -> gate/up -> SiluAndMul), the down projection
(the o/down GEMVs in the same Triton kernel by default, with every launch a dependent launch where
the GPU has PDL; ``FusedDecodeConfig`` selects). On the H200 the step takes 7-9% less GPU time
than the module path (runs h-l of docs/perf/h200-engine.md). The kernels:
:mod:`kernels_reference.ops.fused_gemv.gemv`.

Where it applies, and why only there: the fusions cross the boundaries of the modules the tasks
mirror (RMSNorm, RotaryEmbedding, Attention, SiluAndMul, the linear layers are separate vLLM
modules, each replaceable by a candidate). So the path is taken only for a model built entirely
from the reference classes (checked by exact type, so a candidate's subclass or replacement turns
it off, with the reason), only for one token of one sequence (the batch-1 decode graph), and only
when the engine is asked for it (``LLM(..., fused_decode=True)`` or a ``FusedDecodeConfig``). The
suite's end-to-end tasks do not ask: they time the module structure vLLM runs, with whatever
modules a candidate swaps in.
"""
import dataclasses
from typing import Callable, Optional

import torch

from ..forward_context import get_forward_context

try:
    import triton
except ImportError:
    triton = None

_FLOAT_TYPES = (torch.float16, torch.bfloat16, torch.float32)


def fused_decode_unavailable_reason(model) -> Optional[str]:
    """None when ``FusedDecode`` can run ``model``'s batch-1 decode step; else the first reason why
    not, naming the module and what is different about it."""
    from ..L1.attention import Attention
    from ..ops.fused_gemv.gemv import HALF_ROWS
    from ..L1.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
    from ..L1.rms_norm import RMSNorm
    from ..L1.rotary_emb import RotaryEmbedding
    from ..L1.silu_and_mul import SiluAndMul
    from ..L1.vocab_parallel_embedding import VocabParallelEmbedding
    from ..L2.llama_attention import LlamaAttention
    from ..L2.llama_mlp import LlamaMLP
    from ..L3.llama_decoder_layer import LlamaDecoderLayer

    if triton is None:
        return "Triton is not installed"
    body = getattr(model, "model", None)
    layers = getattr(body, "layers", None)
    if layers is None or not len(layers):
        return f"{type(model).__name__} has no model.layers (not a Llama-family causal LM)"
    expected = [("model.embed_tokens", body.embed_tokens if hasattr(body, "embed_tokens") else None,
                 VocabParallelEmbedding), ("model.norm", getattr(body, "norm", None), RMSNorm)]
    for i, layer in enumerate(layers):
        name = f"model.layers.{i}"
        if type(layer) is not LlamaDecoderLayer:
            return f"{name} is {type(layer).__name__}, not the reference LlamaDecoderLayer"
        attn, mlp = layer.self_attn, layer.mlp
        expected += [(f"{name}.self_attn", attn, LlamaAttention), (f"{name}.mlp", mlp, LlamaMLP),
                     (f"{name}.input_layernorm", layer.input_layernorm, RMSNorm),
                     (f"{name}.post_attention_layernorm", layer.post_attention_layernorm, RMSNorm)]
        if type(attn) is LlamaAttention:
            expected += [(f"{name}.self_attn.qkv_proj", attn.qkv_proj, QKVParallelLinear),
                         (f"{name}.self_attn.o_proj", attn.o_proj, RowParallelLinear),
                         (f"{name}.self_attn.rotary_emb", attn.rotary_emb, RotaryEmbedding),
                         (f"{name}.self_attn.attn", attn.attn, Attention)]
        if type(mlp) is LlamaMLP:
            expected += [(f"{name}.mlp.gate_up_proj", mlp.gate_up_proj, MergedColumnParallelLinear),
                         (f"{name}.mlp.down_proj", mlp.down_proj, RowParallelLinear),
                         (f"{name}.mlp.act_fn", mlp.act_fn, SiluAndMul)]
    for name, module, cls in expected:
        if type(module) is not cls:
            return f"{name} is {type(module).__name__}, not the reference {cls.__name__}"
    for i, layer in enumerate(layers):
        attn, mlp = layer.self_attn, layer.mlp
        name = f"model.layers.{i}"
        rope = attn.rotary_emb
        if attn.qk_norm:
            return f"{name}.self_attn has per-head q/k norms (Qwen3), which the fused kernel does not apply"
        if any(m.bias is not None for m in (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)):
            return f"{name} has linear biases, which the fused kernels do not add"
        if not rope.is_neox_style or rope.rotary_dim != attn.head_dim:
            return f"{name}.self_attn.rotary_emb is not NeoX RoPE over the whole head"
        if attn.head_dim % (2 * HALF_ROWS) or mlp.gate_up_proj.output_sizes[0] % HALF_ROWS:
            return f"{name}: head size {attn.head_dim} / intermediate size must be multiples of {2 * HALF_ROWS} / {HALF_ROWS}"
        if attn.attn.kv_cache is None:
            return f"{name}.self_attn.attn has no KV cache"
        if attn.qkv_proj.weight.dtype not in _FLOAT_TYPES:
            return f"{name} weights are {attn.qkv_proj.weight.dtype}"
    return None


@dataclasses.dataclass(frozen=True)
class FusedDecodeConfig:
    """What the fused path fuses (``LLM(fused_decode=FusedDecodeConfig(...))``; True = the default).

    ``mlp``: norm -> gate/up -> SiluAndMul as one kernel (else the MLP runs as modules);
    ``linear``: the o projection (and with ``mlp`` the down projection) through the same GEMV kernel
    instead of cuBLAS (no split-K reduction kernels, and every launch of a layer is ours);
    ``pdl``: with ``linear``, every launch of a layer is a programmatic dependent launch (the paged
    decode's PDL "all" included), so each kernel is launched while the one ahead finishes; None
    (the default) = where the GPU and Triton have it (sm_90+), not in the interpreter.
    The defaults are the fastest combination measured on the H200 (docs/perf/h200-engine.md, runs h-k).
    """

    mlp: bool = True
    linear: bool = True
    pdl: Optional[bool] = None
    # "fused": norm -> gate/up -> SiluAndMul in one kernel. "cublas": the norm kernel, then cuBLAS's
    # gate/up GEMV (it streams this 235 MB matrix faster than the fused kernel on the H200), and
    # SiluAndMul applied as the down projection reads its input (needs linear=True).
    gate_up: str = "fused"

    def __post_init__(self):
        if self.pdl and not self.linear:
            raise ValueError("FusedDecodeConfig(pdl=True) needs linear=True: cuBLAS's kernels are not dependent launches")
        if self.gate_up not in ("fused", "cublas"):
            raise ValueError(f"FusedDecodeConfig(gate_up={self.gate_up!r}): expected 'fused' or 'cublas'")
        if self.gate_up == "cublas" and not (self.linear and self.mlp):
            raise ValueError("FusedDecodeConfig(gate_up='cublas') needs mlp=True and linear=True: SiluAndMul is "
                             "applied by the Triton down projection")


class FusedDecode:
    """``forward(input_ids, positions) -> hidden`` for the decode graphs: the fused path for one
    token of one sequence, ``fallback`` (the model's own forward) for anything else. Reads the
    step's metadata from the forward context, as the attention layers do."""

    def __init__(self, model, fallback: Callable, config: Optional[FusedDecodeConfig] = None):
        reason = fused_decode_unavailable_reason(model)
        if reason:
            raise ValueError(f"fused_decode: {reason}")
        self.model, self.fallback, self.config = model, fallback, config or FusedDecodeConfig()

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        meta = get_forward_context()
        # Shapes only (a graph is captured per batch size): one token, one sequence.
        if input_ids.shape[0] != 1 or meta is None or meta.num_seqs != 1:
            return self.fallback(input_ids, positions)
        return self.forward_one(input_ids, positions, meta)

    def forward_one(self, input_ids, positions, meta) -> torch.Tensor:
        from ..ops.paged_decode import decode
        from ..ops.fused_gemv.gemv import gemv, norm_gemv_rope_kv, norm_gemv_silu_mul

        config = self.config
        pdl = bool(config.pdl) and input_ids.is_cuda  # the interpreter has no dependent launches
        if config.pdl is None and input_ids.is_cuda:
            pdl = decode.pdl_unavailable_reason(input_ids.device) is None
        decode_config = dataclasses.replace(decode.DECODE_CONFIG, pdl="all") if pdl else None
        body = self.model.model
        x = body.embed_tokens(input_ids)
        residual = None
        table, table_row = None, None
        for layer in body.layers:
            attn, mlp = layer.self_attn, layer.mlp
            if table is None:  # every layer of these models shares one RoPE configuration
                table, table_row = attn.rotary_emb.table_rows(positions)
            key_cache, value_cache = attn.attn.kv_cache
            norm = layer.input_layernorm
            query, residual = norm_gemv_rope_kv(
                x, residual, norm.weight, norm.variance_epsilon, attn.qkv_proj.weight, table, table_row,
                meta.slot_mapping, key_cache, value_cache, attn.num_heads, attn.num_kv_heads, attn.head_dim,
                pdl=pdl)
            out = decode.paged_decode(query.view(1, attn.num_heads, attn.head_dim), key_cache, value_cache,
                                      meta.block_tables, meta.seq_lens, attn.attn.scale, config=decode_config)
            out = out.view(1, -1)
            x = gemv(out, attn.o_proj.weight, pdl=pdl) if config.linear else attn.o_proj(out)
            norm = layer.post_attention_layernorm
            if config.mlp and config.gate_up == "cublas":
                x, residual = norm(x, residual)
                x = gemv(mlp.gate_up_proj(x), mlp.down_proj.weight, pdl=pdl, silu_mul_input=True)
            elif config.mlp:
                act, residual = norm_gemv_silu_mul(x, residual, norm.weight, norm.variance_epsilon,
                                                   mlp.gate_up_proj.weight, pdl=pdl)
                x = gemv(act, mlp.down_proj.weight, pdl=pdl) if config.linear else mlp.down_proj(act)
            else:
                x, residual = norm(x, residual)
                x = mlp(x)
        hidden, _ = body.norm(x, residual)
        return hidden
