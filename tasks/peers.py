"""Peers of the L1 ops for the peer benchmark (``fk-peers``, machinery in :mod:`fk_pytest.peers`).

A peer is what a user could run instead of the reference, doing the op's whole job on the task's own
inputs and returning the task's outputs: torch eager (the reference's ``forward_native``),
torch.compile of it, Liger-Kernel where it has the op, and for attention the kernels serving stacks
call on the paged cache (FlashInfer's paged prefill and decode wrappers, torch's varlen
FlashAttention) besides the SDPA backends and flex_attention around a cache gather. Liger and
FlashInfer are imported lazily: absent, their peers are ``skipped`` with the reason. The cases are
the bf16 workload cases of the Llama-family models (on the CPU profile the dense tasks' small
stand-ins of the same architecture; the router's Mixtral).

Targets (the reference's fraction of the measured copy bandwidth): memory-bound ops >= 85% at
>= 16384 tokens; paged decode >= 80% at B >= 32, C >= 2048 and >= 70% at B1 C8192. The MoE ops run
on the MoE models' bf16 cases; fused_moe also has torch._grouped_mm (sort -> grouped GEMM -> act ->
grouped GEMM -> weighted sum) as a peer, and targets of >= 60% of bf16 GEMM peak at prefill (the
whole layer's time, routing and sort included) and >= 70% of copy bandwidth at decode.

The encoder and vision ops (LayerNorm, GELU, the pooler, packed and padded bidirectional attention,
the patch embedding, DINOv2's position embedding, GRN, ConvNeXt's depthwise conv + norm) run on
their bf16 cases against what Hugging Face (SDPA), timm and torch.compile run: the torch calls of
the model code (F.layer_norm, F.gelu, nn.Conv2d in either memory format), Liger's LayerNorm, the
SDPA backends per sequence or on the padded batch with its key mask, flex_attention with a
same-sequence or key-padding block mask and torch's varlen FlashAttention. The norms, GELU, the
pooler's mean, GRN and the position embedding have bandwidth targets like the other memory-bound ops.

Kinds (``fk_pytest.peers`` PRODUCTION / FRAMEWORK): Liger, SDPA's flash / cuDNN / efficient kernels
(the per-sequence loop around them is the peer's, not a serving stack's) and torch._grouped_mm are
production kernels, and so is torch's varlen_attn; eager, torch.compile, flex_attention and the
torch calls a model's code makes (F.layer_norm, F.gelu, nn.Conv2d) are what the framework makes of
plain PyTorch. The report gives the ratio against each kind apart.
"""
import functools
import importlib
import importlib.util
import inspect
import math
import re
import sys
import warnings
from typing import Dict, Optional, Tuple

import torch
import torch.nn.functional as F

from fk_pytest.compare import triton_interpreter_active
from fk_pytest.peers import (COMPILE, EAGER, PRODUCTION, Ceiling, OpPeers, Peer, PeerContext, Skipped, Target,
                             Unsupported, compiled_native, package_version)
from kernels_reference.forward_context import page_table as step_page_table

from .dense import SMALL_MODELS
from .moe_inputs import MOE_MODELS
from .workload import LLAMA_FAMILY

FAMILY_MODELS = LLAMA_FAMILY + SMALL_MODELS + ("mixtral-8x7b",)  # Mixtral: the router task's own model


def llama_family_bf16(case) -> bool:
    return case.dtype == torch.bfloat16 and case.model in FAMILY_MODELS


# ---- targets -------------------------------------------------------------------------------------
BANDWIDTH_TOKENS = 16384


def _many_tokens(case) -> bool:
    return case.params.get("tokens", 0) >= BANDWIDTH_TOKENS


def decode_shape(case) -> Optional[Tuple[int, int]]:
    """(batch, context) of a paged decode case (ids read ``...-decode-B32-C2048-...``), else None."""
    m = re.search(r"decode-B(\d+)-C(\d+)", case.id)
    return (int(m[1]), int(m[2])) if m else None


def decode_batch(case) -> Optional[int]:
    """The batch of any decode case (paged attention ``...-decode-B32-C2048-...``, a recurrent state
    update ``...-decode-B32-bf16``), else None."""
    m = re.search(r"-decode-B(\d+)-", case.id)
    return int(m[1]) if m else None


def _serving_decode(case) -> bool:
    """A decode step of a serving batch: 32 sequences or more, any context."""
    batch = decode_batch(case)
    return batch is not None and batch >= 32


def _long_decode(case) -> bool:
    shape = decode_shape(case)
    return shape is not None and shape[0] == 1 and shape[1] >= 8192


MEMORY_BOUND = Target(f">= 85% of copy bandwidth at >= {BANDWIDTH_TOKENS} tokens", 0.85, _many_tokens)
# Paged decode of serving batches, every KV layout the tasks use (4 and 8 KV heads at d128, MLA's
# latent cache): the bar of the issue "Attention measured against the kernels serving stacks run".
DECODE_WIDE = Target("paged decode B>=32: >= 85% of copy bandwidth", 0.85, _serving_decode)
# Batch-1 long context, re-targeted: a pure read of the same bytes reached only 0.73 of copy on the
# H200, so the bar is the fastest read of its bytes timed beside it (tasks/read_ceilings.py).
DECODE_LONG = Target("paged decode B1 C8192: >= 90% of the fastest read of its bytes", 0.90, _long_decode,
                     metric="ceiling_frac")
# A recurrent model's decode step reads and writes every sequence's state (Mamba-2's [80, 64, 128]
# float32 per sequence, the gated delta rule's, GLA's and RWKV-7's): pure state bandwidth.
DECODE_STATE = Target("decode state update B>=32: >= 70% of copy bandwidth", 0.70, _serving_decode)
# Attention against production kernels (FlashInfer, FlashAttention, cuDNN): no case behind the best
# of them; and the ops of the dense table no case more than 5% behind any peer.
ATTENTION_PRODUCTION_FLOOR = 1.0
DENSE_SHAPE_FLOOR = 0.95


# ---- Liger-Kernel --------------------------------------------------------------------------------
def _liger_ops(ctx: PeerContext, name: str):
    if ctx.device.type != "cuda" and not triton_interpreter_active():
        raise Skipped("liger's Triton kernels need a GPU (or TRITON_INTERPRET=1 to interpret them on the CPU)")
    try:
        return importlib.import_module(f"liger_kernel.ops.{name}")
    except ImportError as exc:
        raise Skipped(f"liger_kernel is not installed ({exc})") from None


def _liger_rms_norm(offset: float, casting: str):
    """LigerRMSNorm's function with the weight ``offset`` (0: Llama's ``w``; 1: Gemma's ``1 + w``)
    and its casting mode ('llama': fp32 rstd, the normalised value rounded to the input dtype before
    the weight; 'gemma': all in fp32, rounded once); the fused-add variant with LigerFusedAddRMSNorm."""
    def build(ctx: PeerContext):
        ops = _liger_ops(ctx, "rms_norm")
        weight, eps = ctx.reference.weight, ctx.reference.variance_epsilon
        if ctx.case["layout"] != "contiguous":
            ctx.note("strided input: liger makes it contiguous first (a copy)")
        if ctx.case["variant"] != "fused-add":
            return lambda inputs: ops.LigerRMSNormFunction.apply(inputs["x"], weight, eps, offset, casting, False)
        try:
            fused = _liger_ops(ctx, "fused_add_rms_norm").LigerFusedAddRMSNormFunction
        except Skipped:
            fused = None
        if fused is not None:
            return lambda inputs: fused.apply(inputs["x"], inputs["residual"], weight, eps, offset, casting, False)
        ctx.note("this liger has no fused add: the add runs in torch, then LigerRMSNorm")

        def add_then_norm(inputs):
            total = inputs["x"] + inputs["residual"]
            return ops.LigerRMSNormFunction.apply(total, weight, eps, offset, casting, False), total

        return add_then_norm

    return build


def _liger_silu_and_mul(ctx: PeerContext):
    """Liger's SwiGLU forward on the fused gate_up tensor (its fused-layout function where this
    liger has one, else gate and up as two views)."""
    ops = _liger_ops(ctx, "swiglu")
    fused = getattr(ops, "LigerFusedGateUpSiLUMulFunction", None)
    if fused is not None:
        return lambda inputs: fused.apply(inputs["x"])
    ctx.note("LigerSiLUMulFunction on gate/up views (copies them contiguous)")

    def split(inputs):
        x = inputs["x"]
        d = x.shape[-1] // 2
        return ops.LigerSiLUMulFunction.apply(x[..., :d], x[..., d:])

    return split


def _liger_rotary_emb(ctx: PeerContext):
    """Liger's rope (HF layout [1, heads, T, head_size], neox style) with cos/sin gathered per token
    from a float32 table built once, as production caches it."""
    ref = ctx.reference
    if not ref.is_neox_style:
        raise Unsupported("liger's rope rotates halves (neox style) only; this model interleaves pairs")
    ops = _liger_ops(ctx, "rope")
    half, hs = ref.rotary_dim // 2, ref.head_size
    table = ref.cos_sin_table(ctx.device)  # [max_pos, rotary_dim]: cos half, then sin half
    cos_table = torch.cat([table[:, :half], table[:, :half]], dim=-1)  # HF's duplicated layout
    sin_table = torch.cat([table[:, half:], table[:, half:]], dim=-1)
    ctx.note("q/k are column slices of qkv: liger makes them contiguous first (a copy)")

    def rope(inputs):
        positions, query, key = inputs["positions"], inputs["query"], inputs["key"]
        t = positions.numel()
        q = query.view(t, -1, hs).unsqueeze(0).transpose(1, 2)
        k = key.view(t, -1, hs).unsqueeze(0).transpose(1, 2)
        q, k = ops.LigerRopeFunction.apply(q, k, cos_table[positions][None], sin_table[positions][None])
        return q.transpose(1, 2).reshape(t, -1), k.transpose(1, 2).reshape(t, -1)

    return rope


LIGER = dict(kind=PRODUCTION, version=package_version("liger-kernel"))
LIGER_RMS_NORM = Peer("liger", "Liger-Kernel RMSNorm (casting 'llama', offset 0; fused add where it has it)",
                      _liger_rms_norm(0.0, "llama"), **LIGER)
LIGER_GEMMA_RMS_NORM = Peer("liger", "Liger-Kernel RMSNorm as Gemma's (casting 'gemma', offset 1: x / rms(x) * "
                            "(1 + w); fused add where it has it)", _liger_rms_norm(1.0, "gemma"), **LIGER)
LIGER_SILU = Peer("liger", "Liger-Kernel SwiGLU (silu(gate) * up) forward", _liger_silu_and_mul, **LIGER)
LIGER_ROPE = Peer("liger", "Liger-Kernel rope, cos/sin gathered from a float32 table", _liger_rotary_emb, **LIGER)


# ---- attention around the paged cache --------------------------------------------------------------
MAX_COMPILED_SEQUENCES = 8  # forward_native loops over sequences; compiling unrolls that loop


class PackedLayout:
    """Index arrays of one batch shape (query and sequence lengths), planned once per shape on the host,
    as production plans attention metadata once per step for all layers.

    Keys/values of all sequences are gathered into one packed [S, kv_heads, head_size] tensor
    (sequence after sequence, positions 0..n-1); queries stay packed as the layer receives them.
    """

    def __init__(self, meta, device):
        self.q_lens, self.seq_lens, self.block_size = meta.query_lens_cpu, meta.seq_lens_cpu, meta.block_size
        self.q_start, self.kv_start = [0], [0]
        for q, n in zip(self.q_lens, self.seq_lens):
            self.q_start.append(self.q_start[-1] + q)
            self.kv_start.append(self.kv_start[-1] + n)
        seq = lambda lens: torch.cat([torch.full((n,), i) for i, n in enumerate(lens)])  # noqa: E731
        self.cu_q = torch.tensor(self.q_start, dtype=torch.int32, device=device)  # varlen kernels' cu_seqlens
        self.cu_k = torch.tensor(self.kv_start, dtype=torch.int32, device=device)
        self.q_seq = seq(self.q_lens).to(device)
        self.kv_seq = seq(self.seq_lens).to(device)
        self.q_pos = torch.cat([torch.arange(n - q, n) for q, n in zip(self.q_lens, self.seq_lens)]).to(device)
        self.kv_pos = torch.cat([torch.arange(n) for n in self.seq_lens]).to(device)
        self.kv_block_col = self.kv_pos // self.block_size
        self.kv_in_block = self.kv_pos % self.block_size
        self.device = device
        self._masks: Dict[int, torch.Tensor] = {}

    @staticmethod
    def key(meta):
        return meta.query_lens_cpu, meta.seq_lens_cpu, meta.block_size

    def slots(self, block_tables: torch.Tensor) -> torch.Tensor:
        """Cache slot of every packed key/value position, through this step's block tables."""
        return block_tables[self.kv_seq, self.kv_block_col].long() * self.block_size + self.kv_in_block

    def context(self, i: int) -> int:
        return self.seq_lens[i] - self.q_lens[i]

    def bottom_right_mask(self, i: int) -> torch.Tensor:
        """[q_len, seq_len] booleans: query j (at position context + j) sees keys 0..context + j."""
        if i not in self._masks:
            q, n = self.q_lens[i], self.seq_lens[i]
            cols = torch.arange(n, device=self.device)[None, :]
            self._masks[i] = cols <= torch.arange(q, device=self.device)[:, None] + (n - q)
        return self._masks[i]


def _paged_store(ctx: PeerContext):
    """``store(inputs) -> (q [T, nq, d], k_cache, v_cache, metadata)``: the step's K/V written at the
    slot mapping (the store every paged-attention peer does before attending, as serving stacks run a
    cache-write kernel before theirs); the caches keep their [blocks, block_size, nk, d] layout."""
    ref, task = ctx.reference, ctx.task
    nq, nk, hs = ref.num_heads, ref.num_kv_heads, ref.head_size
    k_name, v_name = task.cache_names()[:2]

    def store(inputs):
        meta, k_cache, v_cache = inputs["metadata"], inputs[k_name], inputs[v_name]
        t = inputs["query"].shape[0]
        k_cache.view(-1, nk, hs).index_copy_(0, meta.slot_mapping, inputs["key"].reshape(t, nk, hs))
        v_cache.view(-1, nk, hs).index_copy_(0, meta.slot_mapping, inputs["value"].reshape(t, nk, hs))
        return inputs["query"].view(t, nq, hs), k_cache, v_cache, meta

    return store


def _paged_layer(ctx: PeerContext, attend):
    """The layer's whole job around ``attend``: store the step's K/V at the slot mapping, gather each
    sequence's K/V through its block table, attend causally (bottom-right aligned)."""
    ref = ctx.reference
    nq, nk, hs = ref.num_heads, ref.num_kv_heads, ref.head_size
    store = _paged_store(ctx)
    layouts: Dict[tuple, PackedLayout] = {}

    def layer(inputs):
        q, k_cache, v_cache, meta = store(inputs)
        t = q.shape[0]
        k_slots, v_slots = k_cache.view(-1, nk, hs), v_cache.view(-1, nk, hs)
        key = PackedLayout.key(meta)
        if key not in layouts:  # the first call (the correctness check) plans; timed calls reuse it
            layouts[key] = PackedLayout(meta, q.device)
        layout = layouts[key]
        slots = layout.slots(meta.block_tables)
        return attend(q, k_slots[slots], v_slots[slots], layout, ref.scale).reshape(t, nq * hs)

    return layer


def _gqa_args(gqa: str, group: int, k: torch.Tensor, v: torch.Tensor):
    """K/V ([B, kv_heads, L, d]) and SDPA's extra arguments for one way of sharing K/V heads:
    ``"native"`` (enable_gqa) or ``"repeat"`` (heads repeated, for backends without GQA)."""
    if group == 1:
        return k, v, {}
    if gqa == "repeat":
        return k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1), {}
    return k, v, {"enable_gqa": True}


def _with_gqa_fallback(ctx: PeerContext, backend_name: str, group: int, attend_with):
    """``attend(*args)`` running ``attend_with(gqa, *args)`` with native GQA where the forced SDPA
    backend takes it, else with K/V heads repeated; the first call decides, and a backend that runs
    neither way is :class:`Unsupported` with its refusals."""
    mode = {"gqa": None}

    def attend(*args):
        if mode["gqa"] is not None:
            return attend_with(mode["gqa"], *args)
        failures = []
        for gqa in ("native", "repeat"):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                try:
                    out = attend_with(gqa, *args)
                except RuntimeError as exc:
                    why = "; ".join(str(w.message).splitlines()[0] for w in caught[:3])
                    failures.append(f"{gqa} GQA: {str(exc).splitlines()[0]}" + (f" ({why})" if why else ""))
                    continue
            mode["gqa"] = gqa
            if gqa == "repeat" and group > 1:
                ctx.note("no native GQA here: K/V heads repeated")
            return out
        if failures[0].split(": ", 1)[1] == failures[1].split(": ", 1)[1]:
            failures = [failures[0].split(": ", 1)[1]]  # the same refusal either way: say it once
        raise Unsupported(f"SDPA {backend_name} cannot run this case: " + " | ".join(failures))

    return attend


def _sdpa_peer(backend_name: str):
    """SDPA with one backend forced, one call per sequence ([1, heads, len, head_size] views). Decode
    and fresh prefill need no mask (is_causal when q_len == seq_len); a chunk that continues a
    prompt needs bottom-right alignment: flash gets PyTorch's causal_lower_right bias, the others a
    boolean mask. GQA natively (enable_gqa) where the backend has it, else K/V heads repeated."""

    def build(ctx: PeerContext):
        from torch.nn.attention import SDPBackend, sdpa_kernel
        from torch.nn.attention.bias import causal_lower_right

        backend = getattr(SDPBackend, backend_name)
        group = ctx.reference.num_heads // ctx.reference.num_kv_heads

        def attend_with(gqa, q, k_all, v_all, layout, scale):
            out = torch.empty_like(q)
            with sdpa_kernel([backend]):
                for i in range(len(layout.q_lens)):
                    qa, qb = layout.q_start[i], layout.q_start[i + 1]
                    ka, kb = layout.kv_start[i], layout.kv_start[i + 1]
                    qi = q[qa:qb].transpose(0, 1).unsqueeze(0)
                    ki, vi, extra = _gqa_args(gqa, group, k_all[ka:kb].transpose(0, 1).unsqueeze(0),
                                              v_all[ka:kb].transpose(0, 1).unsqueeze(0))
                    q_len, context = qb - qa, layout.context(i)
                    if q_len == 1 or context == 0:
                        oi = F.scaled_dot_product_attention(qi, ki, vi, is_causal=q_len > 1, scale=scale, **extra)
                    else:
                        mask = causal_lower_right(q_len, kb - ka) if backend_name == "FLASH_ATTENTION" \
                            else layout.bottom_right_mask(i)
                        oi = F.scaled_dot_product_attention(qi, ki, vi, attn_mask=mask, scale=scale, **extra)
                    out[qa:qb] = oi[0].transpose(0, 1)
            return out

        return _paged_layer(ctx, _with_gqa_fallback(ctx, backend_name, group, attend_with))

    return build


def _flex_function(ctx: PeerContext):
    """flex_attention compiled (its fast path: Inductor generates the kernel), or its slow eager
    reference path under --no-compile; always without autograd: the correctness check calls with
    grad mode on, the timed calls with it off, and Dynamo would trace it once for each."""
    from torch.nn.attention.flex_attention import flex_attention

    if ctx.compile:
        flex = torch.compile(flex_attention, dynamic=False)
    else:
        ctx.note("uncompiled (--no-compile): flex_attention's slow reference path")
        flex = flex_attention

    def inference(*args, **kwargs):
        with torch.no_grad():
            return flex(*args, **kwargs)

    return inference


def _flex(ctx: PeerContext):
    """flex_attention (compiled) over the packed batch: one call for every sequence, with a block mask
    "same sequence and key position <= query position" built once per batch shape."""
    from torch.nn.attention.flex_attention import create_block_mask

    flex = _flex_function(ctx)
    grouped = ctx.reference.num_heads != ctx.reference.num_kv_heads
    block_masks = {}

    def attend(q, k_all, v_all, layout, scale):
        if id(layout) not in block_masks:
            q_seq, q_pos, kv_seq, kv_pos = layout.q_seq, layout.q_pos, layout.kv_seq, layout.kv_pos

            def same_sequence_causal(b, h, q_idx, kv_idx):
                return (q_seq[q_idx] == kv_seq[kv_idx]) & (kv_pos[kv_idx] <= q_pos[q_idx])

            block_masks[id(layout)] = create_block_mask(same_sequence_causal, None, None, q.shape[0],
                                                        k_all.shape[0], device=q.device)
        out = flex(q.transpose(0, 1).unsqueeze(0), k_all.transpose(0, 1).unsqueeze(0),
                   v_all.transpose(0, 1).unsqueeze(0), block_mask=block_masks[id(layout)], scale=scale,
                   enable_gqa=grouped)
        return out[0].transpose(0, 1)

    return _paged_layer(ctx, attend)


def _varlen_function(ctx: PeerContext, causal: bool):
    """torch's public varlen attention (``torch.nn.attention.varlen.varlen_attn``, torch 2.9 and
    newer: FlashAttention's varlen kernel), the keyword arguments this case needs from it, read off
    the installed signature (its keywords grew over releases), and the signature; Skipped /
    Unsupported with the reason where this torch cannot run the case. Without ``enable_gqa`` the
    caller repeats K/V heads (:func:`_repeat_kv_heads`)."""
    if ctx.device.type != "cuda":
        raise Skipped("varlen_attn runs FlashAttention's CUDA kernel (no CPU path)")
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        raise Skipped(f"this torch ({torch.__version__}) has no torch.nn.attention.varlen") from None
    if ctx.case.dtype not in (torch.float16, torch.bfloat16):
        raise Unsupported("FlashAttention runs half types only")
    ref = ctx.reference
    accepts = inspect.signature(varlen_attn).parameters
    options = {}
    if "scale" in accepts:
        options["scale"] = ref.scale
    elif not math.isclose(ref.scale, ref.head_size ** -0.5):
        raise Unsupported("this torch's varlen_attn takes no scale; the layer's is not 1/sqrt(head_size)")
    if ref.num_kv_heads != ref.num_heads and "enable_gqa" in accepts:
        options["enable_gqa"] = True
    if causal:
        if "window_size" in accepts:
            options["window_size"] = (-1, 0)  # its spelling of causal
        elif "is_causal" in accepts:
            options["is_causal"] = True
        else:
            raise Unsupported("this torch's varlen_attn has no causal mask")
    return varlen_attn, options, accepts


def _repeat_kv_heads(ctx: PeerContext, options, k: torch.Tensor, v: torch.Tensor):
    """K/V [T, nk, d] as varlen_attn can take them: as they are with native GQA (or none needed),
    else each head repeated for its query heads (torch before varlen_attn's enable_gqa; the copy
    is part of the peer's time, as it would be for a user of that torch)."""
    group = ctx.reference.num_heads // ctx.reference.num_kv_heads
    if group == 1 or options.get("enable_gqa"):
        return k, v
    return k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)


def _paged_varlen(ctx: PeerContext):
    """varlen_attn over the packed batch, causal (FlashAttention aligns a chunk's queries to the end
    of its keys): on the paged cache itself through ``block_table`` / ``seqused_k`` where this torch
    has them (vLLM's FlashAttention path), else on K/V gathered through the block tables; the first
    call decides, and a refusal either way is Unsupported with both reasons."""
    varlen_attn, options, accepts = _varlen_function(ctx, causal=True)
    ref = ctx.reference
    nq, nk, hs = ref.num_heads, ref.num_kv_heads, ref.head_size
    store = _paged_store(ctx)
    native_gqa = nq == nk or "enable_gqa" in options
    mode = {"paged": "block_table" in accepts and "seqused_k" in accepts and native_gqa, "decided": False}
    if not native_gqa:
        ctx.note("this torch's varlen_attn has no enable_gqa: K/V heads repeated after the gather")

    def gathered(q, k_all, v_all, layout, scale):
        k_all, v_all = _repeat_kv_heads(ctx, options, k_all, v_all)
        return varlen_attn(q, k_all, v_all, layout.cu_q, layout.cu_k, max(layout.q_lens), max(layout.seq_lens),
                           **options)

    gathered_layer = _paged_layer(ctx, gathered)

    def paged_layer(inputs):
        q, k_cache, v_cache, meta = store(inputs)
        cu_kv = torch.nn.functional.pad(torch.cumsum(meta.seq_lens, 0, dtype=torch.int32), (1, 0))
        out = varlen_attn(q, k_cache, v_cache, meta.query_start_loc, cu_kv, meta.max_query_len, meta.max_seq_len,
                          seqused_k=meta.seq_lens, block_table=meta.block_tables, **options)
        return out.reshape(q.shape[0], nq * hs)

    def layer(inputs):
        if mode["decided"]:
            return (paged_layer if mode["paged"] else gathered_layer)(inputs)
        refusals = []
        if mode["paged"]:
            try:
                out = paged_layer(inputs)
                mode["decided"] = True
                return out
            except (RuntimeError, ValueError) as exc:
                refusals.append(f"on the paged cache: {str(exc).splitlines()[0]}")
                mode["paged"] = False
        try:
            out = gathered_layer(inputs)
        except (RuntimeError, ValueError) as exc:
            refusals.append(f"on gathered K/V: {str(exc).splitlines()[0]}")
            raise Unsupported("varlen_attn cannot run this case: " + " | ".join(refusals)) from None
        mode["decided"] = True
        if refusals:
            ctx.note("K/V gathered through the block tables (" + refusals[0] + ")")
        return out

    return layer


# FlashInfer (``flashinfer-python``, the kernels SGLang's and vLLM's FlashInfer backends call) on
# the task's own cache: its paged layout is ours ([blocks, block_size, kv_heads, d] for K and V,
# "NHD"), the page table is the block tables' used entries. Its kernels are compiled just in time
# (nvcc) on first use; ``plan`` is the per-step host scheduling a serving stack does once for all
# layers, so it runs once per step's metadata, before timing, and only ``run`` is timed.
FLASHINFER_WORKSPACE_BYTES = 256 << 20  # the float workspace (split-KV partial results), shared
FLASHINFER = dict(kind=PRODUCTION, version=package_version("flashinfer-python"))


def gpu_package(ctx: PeerContext, module: str, distribution: str, kernels: str):
    """The installed ``module`` (of ``distribution``), or Skipped with the reason (no GPU, not installed)."""
    if ctx.device.type != "cuda":
        raise Skipped(f"{kernels}'s kernels need a GPU")
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise Skipped(f"{distribution} is not installed ({exc})") from None


def flashinfer_module(ctx: PeerContext):
    """The installed ``flashinfer`` package (tests replace it with a stand-in)."""
    return gpu_package(ctx, "flashinfer", "flashinfer-python", "FlashInfer")


def page_table(meta):
    """FlashInfer's page table of a step (kernels_reference.forward_context.page_table), all three
    int32 arrays on the metadata's device."""
    indptr, indices, last = step_page_table(meta)
    device = meta.block_tables.device
    return indptr.to(device), indices, last.to(device)


def planned_per_step(plan):
    """``planned(meta)``: ``plan(meta)``'s result, made once per step's metadata object (each input
    set brings its own) and kept with it, so an id is never reused by another step's metadata."""
    plans: Dict[int, tuple] = {}

    def planned(meta):
        entry = plans.get(id(meta))
        if entry is None or entry[0] is not meta:
            plans[id(meta)] = entry = (meta, plan(meta))
        return entry[1]

    return planned


def _flashinfer_peer(wrapper_kind: str):
    """``wrapper_kind``: "prefill" (BatchPrefillWithPagedKVCacheWrapper over the whole batch, causal,
    decode rows as one-token queries: SGLang's extend path for mixed batches), "decode" or
    "decode-tc" (BatchDecodeWithPagedKVCacheWrapper on CUDA cores / tensor cores, the decode kernel
    vLLM's backend runs for one-token steps; steps where every sequence decodes only)."""

    def build(ctx: PeerContext):
        flashinfer = flashinfer_module(ctx)
        if ctx.case.dtype not in (torch.float16, torch.bfloat16):
            raise Unsupported("FlashInfer's attention runs half types only")
        decode = all(n == 1 for n in ctx.case["query"])
        if wrapper_kind != "prefill" and not decode:
            raise Unsupported("the decode wrapper takes one query token per sequence; this step prefills "
                              "(mixed steps run in the prefill wrapper, peer 'flashinfer')")
        ref, dtype = ctx.reference, ctx.case.dtype
        nq, nk, hs = ref.num_heads, ref.num_kv_heads, ref.head_size
        store = _paged_store(ctx)
        workspace = torch.empty(FLASHINFER_WORKSPACE_BYTES, dtype=torch.uint8, device=ctx.device)

        @planned_per_step
        def planned(meta):
            indptr, indices, last = page_table(meta)
            if wrapper_kind == "prefill":
                wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD")
                wrapper.plan(meta.query_start_loc, indptr, indices, last, nq, nk, hs, meta.block_size,
                             causal=True, sm_scale=ref.scale, q_data_type=dtype, kv_data_type=dtype)
            else:
                wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
                    workspace, "NHD", use_tensor_cores=wrapper_kind == "decode-tc")
                wrapper.plan(indptr, indices, last, nq, nk, hs, meta.block_size, sm_scale=ref.scale,
                             q_data_type=dtype, kv_data_type=dtype)
            return wrapper

        def layer(inputs):
            q, k_cache, v_cache, meta = store(inputs)
            return planned(meta).run(q, (k_cache, v_cache)).reshape(q.shape[0], nq * hs)

        return layer

    return build


# FlashAttention 4 (``flash-attn-4``: CuTe DSL kernels compiled just in time, SM90 and SM100), its
# varlen forward on the task's own paged cache: ``page_table`` is the block tables (its K/V layout,
# [pages, page_size, kv_heads, d], is ours), ``seqused_k`` the sequence lengths, ``cu_seqlens_q`` the
# packed queries; causal aligns each sequence's queries with the end of its keys, as ours.
FLASH_ATTN_4 = dict(kind=PRODUCTION, version=package_version("flash-attn-4"))


def flash_attn_cute_module(ctx: PeerContext):
    """The installed ``flash_attn.cute`` (tests replace it with a stand-in)."""
    return gpu_package(ctx, "flash_attn.cute", "flash-attn-4", "FlashAttention 4")


def _flash_attn_4(ctx: PeerContext):
    fa = flash_attn_cute_module(ctx)
    if ctx.case.dtype not in (torch.float16, torch.bfloat16):
        raise Unsupported("FlashAttention 4 runs half types only")
    ref = ctx.reference
    nq, hs = ref.num_heads, ref.head_size
    store = _paged_store(ctx)

    def layer(inputs):
        q, k_cache, v_cache, meta = store(inputs)
        out = fa.flash_attn_varlen_func(
            q, k_cache, v_cache, cu_seqlens_q=meta.query_start_loc, seqused_k=meta.seq_lens,
            max_seqlen_q=meta.max_query_len, max_seqlen_k=meta.max_seq_len, page_table=meta.block_tables,
            softmax_scale=ref.scale, causal=True)
        out = out[0] if isinstance(out, tuple) else out  # (out, lse) in some versions
        return out.reshape(q.shape[0], nq * hs)

    return layer


def _compile_sequence_loop(sequences_of):
    """COMPILE for a forward_native that loops over the batch's sequences in Python, skipped where
    ``sequences_of(case)`` is above MAX_COMPILED_SEQUENCES."""
    def build(ctx: PeerContext):
        batch = sequences_of(ctx.case)
        if batch > MAX_COMPILED_SEQUENCES:
            raise Skipped(f"forward_native loops over the {batch} sequences; compiling unrolls the loop "
                          f"(skipped above {MAX_COMPILED_SEQUENCES} sequences to keep compile time bounded)")
        return compiled_native(ctx)
    return build


_compile_attention = _compile_sequence_loop(lambda case: len(case["context"]))


ATTENTION_PEERS = (
    EAGER,
    Peer("compile", COMPILE.description + f" (batches of up to {MAX_COMPILED_SEQUENCES} sequences)",
         _compile_attention),
    Peer("sdpa-flash", "SDPA forced to FlashAttention, per sequence, + cache store/gather",
         _sdpa_peer("FLASH_ATTENTION"), kind=PRODUCTION),
    Peer("sdpa-cudnn", "SDPA forced to cuDNN attention, per sequence, + cache store/gather",
         _sdpa_peer("CUDNN_ATTENTION"), kind=PRODUCTION),
    Peer("sdpa-efficient", "SDPA forced to memory-efficient attention, per sequence, + cache store/gather",
         _sdpa_peer("EFFICIENT_ATTENTION"), kind=PRODUCTION),
    Peer("flex", "flex_attention (compiled) over the packed batch with a per-sequence causal block mask, "
         "+ cache store/gather", _flex),
    Peer("varlen_attn", "torch.nn.attention.varlen.varlen_attn (FlashAttention varlen), causal, on the paged "
         "cache through block_table where this torch has it, else on gathered K/V; + cache store",
         _paged_varlen, kind=PRODUCTION),
    Peer("flashinfer", "FlashInfer BatchPrefillWithPagedKVCacheWrapper (backend auto), causal, the whole step "
         "(decode rows as one-token queries) + cache store", _flashinfer_peer("prefill"), **FLASHINFER),
    Peer("flashinfer-decode", "FlashInfer BatchDecodeWithPagedKVCacheWrapper (CUDA cores), decode steps "
         "+ cache store", _flashinfer_peer("decode"), **FLASHINFER),
    Peer("flashinfer-decode-tc", "FlashInfer BatchDecodeWithPagedKVCacheWrapper (use_tensor_cores), decode "
         "steps + cache store", _flashinfer_peer("decode-tc"), **FLASHINFER),
    Peer("flash-attn-4", "FlashAttention 4 flash_attn_varlen_func on the paged cache (page_table, seqused_k), "
         "causal, the whole step + cache store", _flash_attn_4, **FLASH_ATTN_4),
)


# ---- mixture of experts --------------------------------------------------------------------------
def moe_bf16(case) -> bool:
    return case.dtype == torch.bfloat16 and case.model in MOE_MODELS


MOE_PREFILL_TOKENS = 1024
MOE_DECODE_TOKENS = 256


def _moe_tokens(case) -> int:
    return case.params.get("tokens", 0)


MOE_PREFILL = Target(f"fused_moe at >= {MOE_PREFILL_TOKENS} tokens: >= 60% of bf16 GEMM peak (roofline)", 0.60,
                     lambda case: _moe_tokens(case) >= MOE_PREFILL_TOKENS, metric="roofline_frac")
MOE_DECODE = Target(f"fused_moe at <= {MOE_DECODE_TOKENS} tokens: >= 70% of copy bandwidth", 0.70,
                    lambda case: 0 < _moe_tokens(case) <= MOE_DECODE_TOKENS)


def grouped_mm_moe(x, logits, w13, w2, top_k: int, renormalize: bool):
    """The MoE layer on torch._grouped_mm: pairs sorted by expert, per-expert row counts as the
    groups' offsets (no host sync), gate_up and down as two grouped GEMMs, the routing-weighted sum."""
    t, h = x.shape
    num_experts, inter = w13.shape[0], w2.shape[-1]
    probs = torch.softmax(logits.float(), dim=-1)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(-1, keepdim=True)
    flat = ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.zeros(num_experts, dtype=torch.int32, device=x.device).scatter_add_(
        0, flat, torch.ones_like(flat, dtype=torch.int32))
    offs = torch.cumsum(counts, 0, dtype=torch.int32)
    tokens = order // top_k
    gate_up = torch._grouped_mm(x[tokens], w13.transpose(1, 2), offs=offs)  # [T*k, 2I]
    act = (F.silu(gate_up[:, :inter].float()) * gate_up[:, inter:].float()).to(x.dtype)
    down = torch._grouped_mm(act, w2.transpose(1, 2), offs=offs)  # [T*k, H]
    y = down.float() * weights.reshape(-1)[order, None]
    return torch.zeros(t, h, dtype=torch.float32, device=x.device).index_add_(0, tokens, y).to(x.dtype)


def _grouped_mm_peer(ctx: PeerContext):
    if not hasattr(torch, "_grouped_mm"):
        raise Unsupported("this torch has no torch._grouped_mm")
    if ctx.device.type != "cuda":
        raise Skipped("torch._grouped_mm's bf16 kernels need a CUDA GPU (sm90)")
    if ctx.case.dtype != torch.bfloat16 or torch.cuda.get_device_capability(ctx.device) < (9, 0):
        raise Unsupported("torch._grouped_mm runs bf16 on sm90 and newer")
    ref = ctx.reference
    w13, w2, k, renorm = ref.w13_weight, ref.w2_weight, ref.top_k, ref.topk.renormalize
    return lambda inputs: grouped_mm_moe(inputs["hidden_states"], inputs["router_logits"], w13, w2, k, renorm)


# The expert loop's per-expert row counts change with every routing: compiled one graph per shape,
# it recompiled on nearly every call (on the CPU, a 16-expert layer: 21 graphs in 12 calls of 64
# tokens; on the H200, 123 ms a call at Qwen3-30B-A3B 8192 tokens: compile time timed as run time).
# torch's default dynamic shapes compile it a few times, then reuse the graphs (4 in the same 12).
MOE_COMPILE = Peer("compile", "torch.compile(forward_native) with torch's default dynamic shapes: Inductor "
                   "(one graph per shape would recompile on every routing)",
                   functools.partial(compiled_native, dynamic=None))

GROUPED_MM = Peer("grouped_mm", "torch._grouped_mm: sort by expert, grouped GEMM, act, grouped GEMM, weighted sum",
                  _grouped_mm_peer, kind=PRODUCTION)


# ---- multi-head latent attention (DeepSeek-V2) -------------------------------------------------------
def _store_latent(inputs, cache: torch.Tensor, rank: int, rope: int) -> torch.Tensor:
    """The step's [latent | rope key] rows written into the latent cache at the slot mapping;
    returns the cache as rows [slots, rank + rope]."""
    t = inputs["q"].shape[0]
    rows = torch.cat([inputs["kv_c_normed"].reshape(t, rank), inputs["k_pe"].reshape(t, rope)], -1)
    flat = cache.view(-1, rank + rope)
    flat.index_copy_(0, inputs["metadata"].slot_mapping, rows.to(cache.dtype))
    return flat


def _mla_sdpa_expanded(ctx: PeerContext):
    """What a user without an MLA kernel runs: store the latent rows, gather every sequence's history,
    expand it through kv_b_proj (one GEMM for the batch) into per-head K [k_nope | k_pe] and V, then
    SDPA (torch's backend choice) per sequence, bottom-right causal."""
    ref = ctx.reference
    h, nope, rope, v, rank = (ref.num_heads, ref.qk_nope_head_dim, ref.qk_rope_head_dim, ref.v_head_dim,
                              ref.kv_lora_rank)
    cache_name = ctx.task.cache_names()[0]
    layouts: Dict[tuple, PackedLayout] = {}

    def layer(inputs):
        meta, cache, q = inputs["metadata"], inputs[cache_name], inputs["q"]
        t = q.shape[0]
        flat = _store_latent(inputs, cache, rank, rope)
        key = PackedLayout.key(meta)
        if key not in layouts:
            layouts[key] = PackedLayout(meta, q.device)
        layout = layouts[key]
        history = flat[layout.slots(meta.block_tables)]
        n = history.shape[0]
        kv = F.linear(history[:, :rank], ref.kv_b_proj.weight).view(n, h, nope + v)
        keys = torch.cat([kv[..., :nope], history[:, None, rank:].expand(n, h, rope)], -1)
        values = kv[..., nope:]
        qh = q.view(t, h, nope + rope)
        out = q.new_empty(t, h, v)
        for i in range(len(layout.q_lens)):
            qa, qb = layout.q_start[i], layout.q_start[i + 1]
            ka, kb = layout.kv_start[i], layout.kv_start[i + 1]
            qi, ki, vi = (x.transpose(0, 1).unsqueeze(0) for x in (qh[qa:qb], keys[ka:kb], values[ka:kb]))
            if qb - qa == 1 or layout.context(i) == 0:
                oi = F.scaled_dot_product_attention(qi, ki, vi, is_causal=qb - qa > 1, scale=ref.scale)
            else:
                oi = F.scaled_dot_product_attention(qi, ki, vi, attn_mask=layout.bottom_right_mask(i), scale=ref.scale)
            out[qa:qb] = oi[0].transpose(0, 1)
        return out.reshape(t, h * v)

    return layer


def _bf16(case) -> bool:
    return case.dtype == torch.bfloat16


def _flashinfer_mla(ctx: PeerContext):
    """FlashInfer's BatchMLAPagedAttentionWrapper on the task's own latent cache (its ckv and kpe
    parts as views of each cached row, as vLLM's FlashInfer MLA backend passes them), in the absorbed
    form a serving stack decodes with: each head's q_nope moved into latent space through W_UK (one
    batched GEMM), attention over the cached latent + rope rows, the latent output lifted through W_UV
    (a second one); + the latent store. Decode steps only (vLLM runs it for decode)."""
    flashinfer = flashinfer_module(ctx)
    if not all(n == 1 for n in ctx.case["query"]):
        raise Unsupported("the MLA decode peer takes one query token per sequence; this step prefills")
    ref, dtype = ctx.reference, ctx.case.dtype
    h, nope, rope, v, rank = (ref.num_heads, ref.qk_nope_head_dim, ref.qk_rope_head_dim, ref.v_head_dim,
                              ref.kv_lora_rank)
    weight = ref.kv_b_proj.weight.view(h, nope + v, rank)
    w_uk, w_uv = weight[:, :nope, :], weight[:, nope:, :]  # [H, nope, R], [H, v, R]
    cache_name = ctx.task.cache_names()[0]
    workspace = torch.empty(FLASHINFER_WORKSPACE_BYTES, dtype=torch.uint8, device=ctx.device)

    @planned_per_step
    def planned(meta):
        indptr, indices, _ = page_table(meta)
        wrapper = flashinfer.mla.BatchMLAPagedAttentionWrapper(workspace)
        wrapper.plan(meta.query_start_loc, indptr, indices, meta.seq_lens, h, rank, rope, meta.block_size,
                     False, ref.scale, dtype, dtype)
        return wrapper

    def layer(inputs):
        meta, cache, q = inputs["metadata"], inputs[cache_name], inputs["q"]
        t = q.shape[0]
        _store_latent(inputs, cache, rank, rope)
        qh = q.view(t, h, nope + rope)
        q_latent = torch.bmm(qh[..., :nope].transpose(0, 1), w_uk).transpose(0, 1)  # [T, H, R]
        latent = planned(meta).run(q_latent, qh[..., nope:], cache[..., :rank], cache[..., rank:])
        return torch.bmm(latent.transpose(0, 1), w_uv.transpose(1, 2)).transpose(0, 1).reshape(t, h * v)

    return layer


MLA_PEERS = (
    EAGER,
    Peer("compile", COMPILE.description + f" (batches of up to {MAX_COMPILED_SEQUENCES} sequences)",
         _compile_attention),
    Peer("sdpa-expanded", "latent store/gather, kv_b_proj expansion, SDPA per sequence (no MLA kernel)",
         _mla_sdpa_expanded, kind=PRODUCTION),
    Peer("flashinfer-mla", "FlashInfer BatchMLAPagedAttentionWrapper (backend auto) on the latent cache, absorbed "
         "(W_UK before, W_UV after), decode steps + latent store", _flashinfer_mla, **FLASHINFER),
)


# ---- linear attention: flash-linear-attention -----------------------------------------------------
# The L1 scan tasks take FLA's own arguments (tasks/gated_delta_inputs.py, gla_inputs.py,
# rwkv7_inputs.py), so the peer is FLA's function on the task's inputs: its chunked kernel for
# prefill, its fused recurrent one when every sequence brings one token (decode), as vLLM's
# Qwen3-Next layer calls them.
def _fla_peer(module: str, chunk: str, recurrent: str, recurrent_names: Optional[Dict[str, str]] = None):
    """``recurrent_names``: arguments the recurrent form names otherwise (GLA's gate is ``gk`` there)."""
    def build(ctx: PeerContext):
        if ctx.device.type != "cuda":
            raise Skipped("flash-linear-attention's kernels need a GPU")
        try:
            ops = importlib.import_module(f"fla.ops.{module}")
        except ImportError as exc:
            raise Skipped(f"fla-core is not installed ({exc})") from None
        decode = all(n == 1 for n in ctx.case.params.get("lengths", ()))
        fn = getattr(ops, recurrent if decode else chunk)
        ctx.note(f"fla.ops.{module}.{recurrent if decode else chunk}")

        def run(inputs):
            args = dict(inputs)
            if args.get("cu_seqlens") is not None:
                args["cu_seqlens"] = args["cu_seqlens"].long()  # FLA's type; ours is int32 as vLLM's
            if decode:
                args = {(recurrent_names or {}).get(k, k): v for k, v in args.items()}
            return fn(**args)

        return run

    return build


FLA = dict(kind=PRODUCTION, version=package_version("fla-core"))
FLA_GATED_DELTA = Peer("fla", "flash-linear-attention chunk_gated_delta_rule / fused_recurrent_gated_delta_rule",
                       _fla_peer("gated_delta_rule", "chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule"), **FLA)
FLA_GLA = Peer("fla", "flash-linear-attention chunk_gla / fused_recurrent_gla",
               _fla_peer("gla", "chunk_gla", "fused_recurrent_gla", {"g": "gk"}), **FLA)
FLA_RWKV7 = Peer("fla", "flash-linear-attention chunk_rwkv7 / fused_recurrent_rwkv7",
                 _fla_peer("rwkv7", "chunk_rwkv7", "fused_recurrent_rwkv7"), **FLA)


# ---- Mamba-2: mamba-ssm's Triton kernels ------------------------------------------------------------
# vLLM's MambaMixer2 runs ports of mamba-ssm's Triton kernels (``mamba_chunk_scan_combined``,
# ``selective_state_update``); mamba-ssm itself is their origin and the peer. Its package __init__
# imports its compiled CUDA extension (selective_scan_cuda), which the Triton kernels never use and
# which a pip install built without CUDA (MAMBA_SKIP_CUDA_BUILD=TRUE, or the sdist's source tree on
# PYTHONPATH as the GPU step carries it) lacks: the package is then registered without running that
# __init__, and only its Triton modules are imported.
def _mamba_triton(ctx: PeerContext, module: str):
    if ctx.device.type != "cuda" and not triton_interpreter_active():
        raise Skipped("mamba-ssm's Triton kernels need a GPU (or TRITON_INTERPRET=1 to interpret them on the CPU)")
    name = f"mamba_ssm.ops.triton.{module}"
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        spec = importlib.util.find_spec("mamba_ssm")
        if spec is None or spec.submodule_search_locations is None:
            raise Skipped(f"mamba-ssm is not installed ({exc})") from None
        if "mamba_ssm" not in sys.modules:
            sys.modules["mamba_ssm"] = importlib.util.module_from_spec(spec)  # its __init__ not run
        try:
            return importlib.import_module(name)
        except ImportError as again:
            raise Skipped(f"mamba-ssm's {name} does not import ({again})") from None


def _on_interpreter(ctx: PeerContext, fn):
    """``fn`` as is on a GPU. On the CPU (Triton's interpreter, where the peer is checked, never
    timed for a verdict) two things of mamba-ssm's that assume a GPU are no-ops: the
    ``torch.cuda.device`` context it enters with the tensors' device index (a CPU tensor has none),
    and its autotuners' benchmarking (no driver to time with: every config ties, the first runs)."""
    if ctx.device.type == "cuda":
        return fn
    import contextlib
    from unittest import mock

    from triton.runtime.autotuner import Autotuner

    def interpreted(inputs):
        with mock.patch.object(torch.cuda, "device", lambda index: contextlib.nullcontext()), \
                mock.patch.object(Autotuner, "do_bench", lambda self, call, quantiles=None: [0.0, 0.0, 0.0]):
            return fn(inputs)

    return interpreted


def _mamba_chunk_scan(ctx: PeerContext):
    """``mamba_chunk_scan_combined`` on the packed batch as one row (batch 1, ``seq_idx`` marking
    the sequences, ``cu_seqlens`` and ``return_varlen_states`` for each sequence's final state).
    Upstream takes one initial state per batch row, so only the first packed sequence can carry
    one: a case where a later sequence continues a state is Unsupported (vLLM's port takes one per
    sequence)."""
    ops = _mamba_triton(ctx, "ssd_combined")
    if ctx.device.type != "cuda" and ctx.case.dtype != torch.float32:
        raise Skipped("under Triton's CPU interpreter mamba-ssm's chunk scan returns garbage in half types "
                      "(relative error ~1e10 with bfloat16 x or B/C, Triton 3.9, 2026-12-05; float32 agreed "
                      "with the reference to 1e-6): checked on a GPU")
    from .mamba_ssd import carried_states
    if ctx.case["with_state"] and any(carried_states(ctx.case["lengths"])[1:]):
        raise Unsupported("mamba-ssm's varlen scan takes one initial state for the whole packed batch "
                          "(its batch row); here later sequences continue states too")
    ref = ctx.reference
    lengths = ctx.case["lengths"]
    # built once, on the first (warm-up) call: a host-to-device copy inside the timed call made the
    # peer impossible to capture in a CUDA graph, so it was timed eagerly with its launches counted
    seq_idx_of = {}

    def run(inputs):
        x, cu = inputs["x"], inputs["cu_seqlens"]
        if x.device not in seq_idx_of:
            seq_idx_of[x.device] = torch.repeat_interleave(
                torch.arange(len(lengths), device=x.device, dtype=torch.int32),
                torch.tensor(lengths, device=x.device))[None]
        seq_idx = seq_idx_of[x.device]
        init = inputs.get("initial_states")
        z = inputs.get("z")
        out, states = ops.mamba_chunk_scan_combined(
            x[None], inputs["dt"][None], inputs["A"], inputs["B"][None], inputs["C"][None], ref.chunk_size,
            D=inputs.get("D"), z=None if z is None else z[None], dt_bias=inputs.get("dt_bias"),
            initial_states=None if init is None else init[:1], seq_idx=seq_idx, cu_seqlens=cu,
            dt_softplus=ref.dt_softplus, dt_limit=ref.dt_limit, return_varlen_states=True)
        # Upstream returns the states in C's dtype (bf16 in a bf16 model); the op's interface keeps
        # them in float32 unless ``state_dtype`` says otherwise: compared at the interface's dtype.
        return out[0], states.to(inputs.get("state_dtype") or torch.float32)

    return _on_interpreter(ctx, run)


def _mamba_state_update(ctx: PeerContext):
    """``selective_state_update``: the task's own arguments (the pool, per-head values broadcast over
    head_dim, ``state_batch_indices``), the state written in place."""
    ops = _mamba_triton(ctx, "selective_state_update")
    softplus = ctx.reference.dt_softplus

    def run(inputs):
        return ops.selective_state_update(**inputs, dt_softplus=softplus)

    return _on_interpreter(ctx, run)


MAMBA_SSM = dict(kind=PRODUCTION, version=package_version("mamba-ssm"))
MAMBA_CHUNK_SCAN = Peer("mamba-ssm", "mamba-ssm mamba_chunk_scan_combined (Triton), the packed batch as one row "
                        "with seq_idx, varlen states", _mamba_chunk_scan, **MAMBA_SSM)
MAMBA_STATE_UPDATE = Peer("mamba-ssm", "mamba-ssm selective_state_update (Triton), state_batch_indices",
                          _mamba_state_update, **MAMBA_SSM)


# ---- the gated RMSNorm after the scans: flash-linear-attention and mamba-ssm -----------------------
# Qwen3-Next normalises each 128-wide head row, then gates (FLA's FusedRMSNormGated, vLLM's
# RMSNormGated with norm_before_gate); Mamba-2 gates first and normalises groups of the gated value
# (mamba-ssm's RMSNormGated, which vLLM ported and FLA carries as layernorm_gated).
def _fla_norm(ctx: PeerContext, module: str):
    if ctx.device.type != "cuda":
        raise Skipped("flash-linear-attention's norm kernels need a GPU (their launcher asks the driver for "
                      "the device's multiprocessors, which Triton's interpreter has no driver for)")
    try:
        return importlib.import_module(f"fla.modules.norm.{module}")
    except ImportError as exc:
        raise Skipped(f"fla-core is not installed ({exc})") from None


def _fla_fused_rms_norm_gated(ctx: PeerContext):
    """FLA's ``FusedRMSNormGated`` function (``rms_norm_gated``, swish): the whole row normalised,
    then times silu(gate): Qwen3-Next's form only."""
    ref = ctx.reference
    if not ref.norm_before_gate or ref.group_size not in (None, ref.hidden_size):
        raise Unsupported("FusedRMSNormGated normalises the whole row and then gates; this layer gates first "
                          "and normalises groups of the gated value (Mamba-2's form)")
    ops = _fla_norm(ctx, "fused_norm_gate")
    weight, eps = ref.weight, ref.eps
    return lambda inputs: ops.rms_norm_gated(inputs["x"], inputs["z"], weight, None, activation="swish", eps=eps)


def _grouped_rms_norm_gated(load):
    """``rmsnorm_fn(x, weight, None, z, eps, group_size, norm_before_gate)`` of the module ``load(ctx)``
    returns: mamba-ssm's layernorm_gated and FLA's copy of it take the layer's arguments as they are."""
    def build(ctx: PeerContext):
        ops, ref = load(ctx), ctx.reference

        def run(inputs):
            return ops.rmsnorm_fn(inputs["x"], ref.weight, None, z=inputs["z"], eps=ref.eps,
                                  group_size=ref.group_size, norm_before_gate=ref.norm_before_gate)

        return _on_interpreter(ctx, run)

    return build


FLA_FUSED_NORM_GATED = Peer("fla-fused", "flash-linear-attention FusedRMSNormGated (rms_norm_gated, swish): the row "
                            "normalised, then gated", _fla_fused_rms_norm_gated, **FLA)
FLA_NORM_GATED = Peer("fla", "flash-linear-attention RMSNormGated (layernorm_gated.rmsnorm_fn): groups, the gate "
                      "before or after the norm", _grouped_rms_norm_gated(lambda ctx: _fla_norm(ctx, "layernorm_gated")),
                      **FLA)
MAMBA_NORM_GATED = Peer("mamba-ssm", "mamba-ssm RMSNormGated (ops.triton.layernorm_gated.rmsnorm_fn), the kernel "
                        "vLLM ported", _grouped_rms_norm_gated(lambda ctx: _mamba_triton(ctx, "layernorm_gated")),
                        **MAMBA_SSM)


# ---- encoders and vision towers --------------------------------------------------------------------
# The L1 ops of embedding and vision serving (issue 29): peers are what Hugging Face transformers
# (SDPA), timm and torch.compile run for them. The ops call torch modules directly in those stacks
# (nn.LayerNorm, nn.GELU, nn.Conv2d), so those calls are peers of the kind FRAMEWORK (what the
# framework runs for plain model code), like eager; the attention kernels behind SDPA, torch's
# varlen FlashAttention and Liger are PRODUCTION. Cases: the bf16 ones (every model is served in
# bf16; the float32 sweep is a correctness concern, not a peer workload).
def _tokens_target(unit: str, count) -> Target:
    """MEMORY_BOUND's bar for an op whose size is not its ``tokens`` parameter."""
    return Target(f">= 85% of copy bandwidth at >= {BANDWIDTH_TOKENS} {unit}", 0.85,
                  lambda case: count(case) >= BANDWIDTH_TOKENS)


# GRN reads every pixel's channels twice (the norms, then the scaling) against io_bytes' once, so
# past the L2 cache its copy-bandwidth fraction is bounded by about 2/3 unless a pass is fused away.
GRN_BANDWIDTH = _tokens_target("pixels (batch x height x width)",
                               lambda case: case["batch"] * case["height"] * case["width"])
POSITION_BANDWIDTH = _tokens_target("tokens (batch x (1 + patches))",
                                    lambda case: case["batch"] * (1 + case["grid_height"] * case["grid_width"]))
# Only mean pooling reads every token (CLS / last-token pooling read one row per sequence). No full
# case reaches the bar's size today (the largest mean-pooled batch is 8 x 512 tokens of 384 channels,
# 3 MB: launch-bound); the target says so ("no case") rather than judging a latency-bound case.
POOLER_BANDWIDTH = _tokens_target("mean-pooled tokens", lambda case: (
    sum(case["lengths"]) if case["pooling_type"] == "MEAN" else 0))


def _torch_layer_norm(ctx: PeerContext):
    """``F.layer_norm`` on the activations as nn.LayerNorm runs it (HF's BERT, ViT, timm); the
    fused-add variant is HF's "add & norm": the sum in the activation dtype (rounded), then the norm."""
    norm = ctx.reference
    shape, weight, bias, eps = (norm.hidden_size,), norm.weight, norm.bias, norm.eps
    if ctx.case["variant"] != "fused-add":
        return lambda inputs: F.layer_norm(inputs["x"], shape, weight, bias, eps)

    def add_then_norm(inputs):
        total = inputs["x"] + inputs["residual"]
        return F.layer_norm(total, shape, weight, bias, eps), total

    return add_then_norm


def _liger_layer_norm(ctx: PeerContext):
    """LigerLayerNormFunction (weight and bias, statistics in float32); Liger has no fused-add
    LayerNorm, so that variant adds in torch first."""
    fn = _liger_ops(ctx, "layer_norm").LigerLayerNormFunction
    norm = ctx.reference
    weight, bias, eps = norm.weight, norm.bias, norm.eps
    if ctx.case["variant"] != "fused-add":
        return lambda inputs: fn.apply(inputs["x"], weight, bias, eps)
    ctx.note("liger has no fused-add LayerNorm: the add runs in torch, then LigerLayerNorm")

    def add_then_norm(inputs):
        total = inputs["x"] + inputs["residual"]
        return fn.apply(total, weight, bias, eps), total

    return add_then_norm


def _torch_gelu(ctx: PeerContext):
    """``F.gelu`` on the activations (nn.GELU in HF's and timm's MLPs: one kernel, float32 inside);
    with the dense's bias added first in the activation dtype, as an unfused epilogue does."""
    approximate = ctx.reference.approximate
    if ctx.case["variant"] != "bias":
        return lambda inputs: F.gelu(inputs["x"], approximate=approximate)
    return lambda inputs: F.gelu(inputs["x"] + inputs["bias"], approximate=approximate)


TORCH_LAYER_NORM = Peer("F.layer_norm", "F.layer_norm in the activation dtype (nn.LayerNorm; HF BERT's add & norm "
                        "adds first)", _torch_layer_norm)
LIGER_LAYER_NORM = Peer("liger", "Liger-Kernel LayerNorm (the fused-add variant adds in torch first)",
                        _liger_layer_norm, **LIGER)
TORCH_GELU = Peer("F.gelu", "F.gelu in the activation dtype (nn.GELU; the bias added first)", _torch_gelu)


# Packed encoder attention (encoder_only_attention): [T, heads * d] rows, sequences from the forward
# context's cu_seqlens, bidirectional within each sequence.
def _packed_heads(ctx: PeerContext, inputs):
    """q [T, nq, d], k and v [T, nk, d] as views of the task's column slices of qkv."""
    ref = ctx.reference
    t = inputs["query"].shape[0]
    return (inputs["query"].view(t, ref.num_heads, ref.head_size),
            inputs["key"].view(t, ref.num_kv_heads, ref.head_size),
            inputs["value"].view(t, ref.num_kv_heads, ref.head_size))


def _packed_sdpa_peer(backend_name: str):
    """SDPA with one backend forced, one call per sequence of the packed batch ([1, heads, len, d]
    views, no mask, not causal), as HF runs a batch of one sentence at a time; GQA as ``_sdpa_peer``."""

    def build(ctx: PeerContext):
        from torch.nn.attention import SDPBackend, sdpa_kernel

        backend, ref = getattr(SDPBackend, backend_name), ctx.reference
        group = ref.num_heads // ref.num_kv_heads

        def attend_with(gqa, q, k, v, lengths):
            out = q.new_empty(q.shape)
            first = 0
            with sdpa_kernel([backend]):
                for n in lengths:
                    rows = slice(first, first + n)
                    qi = q[rows].transpose(0, 1).unsqueeze(0)
                    ki, vi, extra = _gqa_args(gqa, group, k[rows].transpose(0, 1).unsqueeze(0),
                                              v[rows].transpose(0, 1).unsqueeze(0))
                    oi = F.scaled_dot_product_attention(qi, ki, vi, scale=ref.scale, **extra)
                    out[rows] = oi[0].transpose(0, 1)
                    first += n
            return out

        attend = _with_gqa_fallback(ctx, backend_name, group, attend_with)

        def layer(inputs):
            q, k, v = _packed_heads(ctx, inputs)
            lengths = [n for n in inputs["metadata"].query_lens_cpu if n]
            return attend(q, k, v, lengths).reshape(q.shape[0], -1)

        return layer

    return build


def _packed_flex(ctx: PeerContext):
    """flex_attention over the whole packed batch with a "same sequence" block mask, built once
    per batch shape (a model builds it once per step for all its layers)."""
    from torch.nn.attention.flex_attention import create_block_mask

    flex, ref = _flex_function(ctx), ctx.reference
    grouped = ref.num_heads != ref.num_kv_heads
    block_masks = {}

    def layer(inputs):
        q, k, v = _packed_heads(ctx, inputs)
        t, lengths = q.shape[0], tuple(inputs["metadata"].query_lens_cpu)
        if lengths not in block_masks:
            sequence = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths)).to(q.device)

            def same_sequence(b, h, q_idx, kv_idx):
                return sequence[q_idx] == sequence[kv_idx]

            block_masks[lengths] = create_block_mask(same_sequence, None, None, t, t, device=q.device)
        out = flex(*(x.transpose(0, 1).unsqueeze(0) for x in (q, k, v)), block_mask=block_masks[lengths],
                   scale=ref.scale, enable_gqa=grouped)
        return out[0].transpose(0, 1).reshape(t, -1)

    return layer


def _torch_varlen(ctx: PeerContext):
    """torch's varlen FlashAttention on the packed batch, cu_seqlens for queries and keys alike, full
    (not causal) attention."""
    varlen_attn, options, _ = _varlen_function(ctx, causal=False)

    def layer(inputs):
        q, k, v = _packed_heads(ctx, inputs)
        k, v = _repeat_kv_heads(ctx, options, k, v)
        meta = inputs["metadata"]
        cu, longest = meta.query_start_loc, meta.max_query_len
        return varlen_attn(q, k, v, cu, cu, longest, longest, **options).reshape(q.shape[0], -1)

    return layer


ENCODER_ATTENTION_PEERS = (
    EAGER,
    Peer("compile", COMPILE.description + f" (batches of up to {MAX_COMPILED_SEQUENCES} sequences)",
         _compile_sequence_loop(lambda case: len(case["lengths"]))),
    Peer("sdpa-flash", "SDPA forced to FlashAttention, per sequence, bidirectional",
         _packed_sdpa_peer("FLASH_ATTENTION"), kind=PRODUCTION),
    Peer("sdpa-cudnn", "SDPA forced to cuDNN attention, per sequence, bidirectional",
         _packed_sdpa_peer("CUDNN_ATTENTION"), kind=PRODUCTION),
    Peer("sdpa-efficient", "SDPA forced to memory-efficient attention, per sequence, bidirectional",
         _packed_sdpa_peer("EFFICIENT_ATTENTION"), kind=PRODUCTION),
    Peer("flex", "flex_attention (compiled) over the packed batch with a same-sequence block mask", _packed_flex),
    Peer("varlen_attn", "torch.nn.attention.varlen.varlen_attn: FlashAttention varlen over the packed batch",
         _torch_varlen, kind=PRODUCTION),
)


# Padded attention (multi_head_attention): [B, S, heads * d], an optional boolean key mask [B, S].
def _padded_heads(ctx: PeerContext, inputs):
    """q [B, nq, S, d], k and v [B, nk, S, d]: views of the task's column slices of qkv."""
    ref = ctx.reference
    b, s = inputs["query"].shape[:2]
    return (inputs["query"].view(b, s, ref.num_heads, ref.head_size).transpose(1, 2),
            inputs["key"].view(b, -1, ref.num_kv_heads, ref.head_size).transpose(1, 2),
            inputs["value"].view(b, -1, ref.num_kv_heads, ref.head_size).transpose(1, 2))


def _keys_masked(case) -> bool:
    """Whether any key of the case's batch is padding (a mask of all True is dropped, as HF drops it)."""
    return case["lengths"] is not None and min(case["lengths"]) < case["tokens"]


def _padded_sdpa_peer(backend_name: str):
    """One SDPA call over the padded batch with the key-padding mask as a boolean [B, 1, 1, S]
    attn_mask: HF BERT's SDPA path; a vision tower's batch of images has no mask."""

    def build(ctx: PeerContext):
        from torch.nn.attention import SDPBackend, sdpa_kernel

        masked = _keys_masked(ctx.case)
        if masked and backend_name == "FLASH_ATTENTION":
            raise Unsupported("FlashAttention takes no attention mask; this batch pads some of its entries")
        backend, ref = getattr(SDPBackend, backend_name), ctx.reference
        group = ref.num_heads // ref.num_kv_heads

        def attend_with(gqa, q, k, v, key_mask):
            k, v, extra = _gqa_args(gqa, group, k, v)
            mask = key_mask[:, None, None, :] if masked else None
            with sdpa_kernel([backend]):
                return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=ref.scale, **extra)

        attend = _with_gqa_fallback(ctx, backend_name, group, attend_with)

        def layer(inputs):
            q, k, v = _padded_heads(ctx, inputs)
            out = attend(q, k, v, inputs.get("attention_mask"))
            return out.transpose(1, 2).reshape(q.shape[0], q.shape[2], -1)

        return layer

    return build


def _padded_flex(ctx: PeerContext):
    """flex_attention over the padded batch; with padding, a key-padding block mask built once from
    the first batch's mask (every batch of a case pads alike; a model builds it once per forward)."""
    from torch.nn.attention.flex_attention import create_block_mask

    flex, ref = _flex_function(ctx), ctx.reference
    grouped = ref.num_heads != ref.num_kv_heads
    masked = _keys_masked(ctx.case)
    built = {}

    def layer(inputs):
        q, k, v = _padded_heads(ctx, inputs)
        b, s = q.shape[0], q.shape[2]
        if masked and "block_mask" not in built:
            key_ok = inputs["attention_mask"]

            def key_padding(bi, h, q_idx, kv_idx):
                return key_ok[bi, kv_idx]

            built["block_mask"] = create_block_mask(key_padding, b, None, s, k.shape[2], device=q.device)
        out = flex(q, k, v, block_mask=built.get("block_mask"), scale=ref.scale, enable_gqa=grouped)
        return out.transpose(1, 2).reshape(b, s, -1)

    return layer


PADDED_ATTENTION_PEERS = (
    EAGER,
    Peer("compile", COMPILE.description + f" (batches of up to {MAX_COMPILED_SEQUENCES} entries)",
         _compile_sequence_loop(lambda case: case["batch"])),
    Peer("sdpa-flash", "SDPA forced to FlashAttention on the padded batch (unpadded batches only: no mask)",
         _padded_sdpa_peer("FLASH_ATTENTION"), kind=PRODUCTION),
    Peer("sdpa-cudnn", "SDPA forced to cuDNN attention on the padded batch, boolean key mask",
         _padded_sdpa_peer("CUDNN_ATTENTION"), kind=PRODUCTION),
    Peer("sdpa-efficient", "SDPA forced to memory-efficient attention on the padded batch, boolean key mask",
         _padded_sdpa_peer("EFFICIENT_ATTENTION"), kind=PRODUCTION),
    Peer("flex", "flex_attention (compiled) on the padded batch, key-padding block mask", _padded_flex),
)


# Convolutions: nn.Conv2d runs cuDNN on the GPU, in the model's memory format. "channels-last" is
# the model moved with .to(memory_format=torch.channels_last): weights converted once, the input
# converted per call when it comes NCHW (a copy, as the model's first op would make).
def _channels_last_weight(ctx: PeerContext, weight: torch.Tensor, x_layout: str) -> torch.Tensor:
    if x_layout != "channels-last":
        ctx.note("NCHW input converted to channels-last per call (a copy)")
    return weight.contiguous(memory_format=torch.channels_last)


def _patch_conv(channels_last: bool):
    """timm's PatchEmbed: nn.Conv2d(kernel = stride = patch) in the activation dtype, then
    flatten(2).transpose(1, 2) to [B, patches, D] (a view: timm does not copy it)."""

    def build(ctx: PeerContext):
        proj = ctx.reference.proj
        weight = _channels_last_weight(ctx, proj.weight, ctx.case["layout"]) if channels_last else proj.weight

        def run(inputs):
            x = inputs["x"]
            if channels_last:
                x = x.contiguous(memory_format=torch.channels_last)
            return F.conv2d(x, weight, proj.bias, stride=proj.stride).flatten(2).transpose(1, 2)

        return run

    return build


def _dwconv_norm(channels_last: bool):
    """timm's ConvNeXt block up to its MLP: the depthwise nn.Conv2d (7x7, groups = channels),
    permute to [B, H, W, C], F.layer_norm over the channels (nn.LayerNorm)."""

    def build(ctx: PeerContext):
        conv, norm = ctx.reference.conv_dw, ctx.reference.norm
        weight = _channels_last_weight(ctx, conv.weight, ctx.case["layout"]) if channels_last else conv.weight
        shape = (norm.hidden_size,)

        def run(inputs):
            x = inputs["x"]
            if channels_last:
                x = x.contiguous(memory_format=torch.channels_last)
            y = F.conv2d(x, weight, conv.bias, padding=conv.padding, groups=conv.groups)
            return F.layer_norm(y.permute(0, 2, 3, 1), shape, norm.weight, norm.bias, norm.eps)

        return run

    return build


PATCH_CONV_PEERS = (
    Peer("conv2d", "nn.Conv2d (cuDNN), the input as it comes: timm's / HF's PatchEmbed", _patch_conv(False)),
    Peer("conv2d-channels-last", "nn.Conv2d (cuDNN) with weights and input channels-last", _patch_conv(True)),
)
DWCONV_NORM_PEERS = (
    Peer("conv2d", "depthwise nn.Conv2d (cuDNN), the input as it comes, permute, F.layer_norm: timm's "
         "ConvNeXt block", _dwconv_norm(False)),
    Peer("conv2d-channels-last", "the same with weights and input channels-last (a model moved to channels_last)",
         _dwconv_norm(True)),
)


# ---- reads of a case's bytes without the op ------------------------------------------------------------
def _read_ceiling(name: str):
    """The read ``name`` of tasks/read_ceilings.py, imported when first built: its Triton kernel is
    then made for the interpreter where TRITON_INTERPRET is set by then (Triton decides at definition)."""
    def build(ctx: PeerContext):
        if ctx.device.type != "cuda" and not triton_interpreter_active():
            raise Skipped("the paged read is a Triton kernel: a GPU, or TRITON_INTERPRET=1 on the CPU")
        from . import read_ceilings
        return getattr(read_ceilings, name)
    return build


PAGED_DECODE_READS = (
    Ceiling("paged", "every cached K/V block of each sequence read through its block table (Triton)",
            _read_ceiling("paged_read"), _long_decode),
    Ceiling("contiguous", "as many bytes read from one contiguous range of each cache (torch.sum)",
            _read_ceiling("contiguous_read"), _long_decode),
)


# ---- the ops -------------------------------------------------------------------------------------
def _op(peers, targets=(), case_filter=llama_family_bf16, shape_floor=None, production_floor=None,
        ceilings=()) -> OpPeers:
    return OpPeers(tuple(peers), tuple(targets), case_filter, shape_floor, production_floor, tuple(ceilings))


def _dense(peers, targets=(), case_filter=llama_family_bf16, production_floor=None, ceilings=()) -> OpPeers:
    """An op of the dense-model peer table: no case below DENSE_SHAPE_FLOOR of the best peer."""
    return _op(peers, targets, case_filter, DENSE_SHAPE_FLOOR, production_floor, ceilings)


OPS: Dict[str, OpPeers] = {
    "rms_norm": _dense((EAGER, COMPILE, LIGER_RMS_NORM), (MEMORY_BOUND,)),
    "silu_and_mul": _dense((EAGER, COMPILE, LIGER_SILU), (MEMORY_BOUND,)),
    "rotary_emb": _dense((EAGER, COMPILE, LIGER_ROPE), (MEMORY_BOUND,)),
    "attention": _dense(ATTENTION_PEERS, (DECODE_WIDE, DECODE_LONG), production_floor=ATTENTION_PRODUCTION_FLOOR,
                        ceilings=PAGED_DECODE_READS),
    "mla_attention": _dense(MLA_PEERS, (DECODE_WIDE,), _bf16, production_floor=ATTENTION_PRODUCTION_FLOOR),
    "deepseek_rotary_emb": _op((EAGER, COMPILE), (MEMORY_BOUND,), _bf16),
    "vocab_parallel_embedding": _dense((EAGER, COMPILE), (MEMORY_BOUND,)),
    # The reference already calls cuBLAS through F.linear; eager and Inductor are still what a user has.
    "qkv_parallel_linear": _dense((EAGER, COMPILE)),
    "merged_column_parallel_linear": _dense((EAGER, COMPILE)),
    "row_parallel_linear": _dense((EAGER, COMPILE)),
    "replicated_linear": _dense((EAGER, COMPILE)),
    "parallel_lm_head": _dense((EAGER, COMPILE)),
    "fused_moe": _op((EAGER, MOE_COMPILE, GROUPED_MM), (MOE_PREFILL, MOE_DECODE), moe_bf16),
    "topk_softmax": _op((EAGER, COMPILE), (), moe_bf16),
    # No eager peer: forward_native is the float64-exact token-by-token recurrence, minutes a case.
    "rms_norm_gated": _op((EAGER, COMPILE, FLA_FUSED_NORM_GATED, FLA_NORM_GATED, MAMBA_NORM_GATED), (), _bf16),
    "gemma_rms_norm": _op((EAGER, COMPILE, LIGER_GEMMA_RMS_NORM), (), _bf16),
    # Eager and Inductor of the native forms only. The 2-D rope is torch ops in timm and HF. The conv
    # window has production kernels (vLLM's Triton causal_conv1d, which the reference's interface
    # follows; FLA's causal_conv1d), but FLA's takes per-sequence [N, D, W] states in and out rather
    # than vLLM's slot pool and cache indices: a peer of it (gather, call, scatter) is not written yet.
    "short_convolution": _op((EAGER, COMPILE), (), _bf16),
    "rope_2d": _op((EAGER, COMPILE), (), _bf16),
    "mamba_chunk_scan": _op((MAMBA_CHUNK_SCAN,), (), _bf16),
    "selective_state_update": _op((MAMBA_STATE_UPDATE,), (DECODE_STATE,), _bf16),
    "gated_delta_rule": _op((FLA_GATED_DELTA,), (DECODE_STATE,), _bf16),
    "gated_linear_attention": _op((FLA_GLA,), (DECODE_STATE,), _bf16),
    "rwkv7": _op((FLA_RWKV7,), (DECODE_STATE,), _bf16),
    "layer_norm": _op((EAGER, COMPILE, TORCH_LAYER_NORM, LIGER_LAYER_NORM), (MEMORY_BOUND,), _bf16),
    "gelu": _op((EAGER, COMPILE, TORCH_GELU), (MEMORY_BOUND,), _bf16),
    "encoder_only_attention": _op(ENCODER_ATTENTION_PEERS, (), _bf16),
    "multi_head_attention": _op(PADDED_ATTENTION_PEERS, (), _bf16),
    "patch_embed": _op((EAGER, COMPILE) + PATCH_CONV_PEERS, (), _bf16),
    "convnext_dwconv_norm": _op((EAGER, COMPILE) + DWCONV_NORM_PEERS, (), _bf16),
    # No library ships these as kernels (HF, timm and vLLM write them as a few torch ops): torch
    # eager and Inductor are the peers.
    "pooler": _op((EAGER, COMPILE), (POOLER_BANDWIDTH,), _bf16),
    "dinov2_position_embedding": _op((EAGER, COMPILE), (POSITION_BANDWIDTH,), _bf16),
    "global_response_norm": _op((EAGER, COMPILE), (GRN_BANDWIDTH,), _bf16),
}
