"""Peers of the L1 ops for the peer benchmark (``fk-peers``, machinery in :mod:`fk_pytest.peers`).

A peer is what a user could run instead of the reference, doing the op's whole job on the task's own
inputs and returning the task's outputs: torch eager (the reference's ``forward_native``),
torch.compile of it, Liger-Kernel where it has the op, and for attention the SDPA backends and
flex_attention around a paged cache. Liger is imported lazily: absent, its peers are ``skipped``
with the reason. The cases are the bf16 workload cases of the Llama-family models (on the CPU
profile the dense tasks' small stand-ins of the same architecture; the router's Mixtral).

Targets (the reference's fraction of the measured copy bandwidth): memory-bound ops >= 85% at
>= 16384 tokens; paged decode >= 80% at B >= 32, C >= 2048 and >= 70% at B1 C8192. The MoE ops run
on the MoE models' bf16 cases; fused_moe also has torch._grouped_mm (sort -> grouped GEMM -> act ->
grouped GEMM -> weighted sum) as a peer, and targets of >= 60% of bf16 GEMM peak at prefill (the
whole layer's time, routing and sort included) and >= 70% of copy bandwidth at decode.

Kinds (``fk_pytest.peers`` PRODUCTION / FRAMEWORK): Liger, SDPA's flash / cuDNN / efficient kernels
(the per-sequence loop around them is the peer's, not a serving stack's) and torch._grouped_mm are
production kernels; eager, torch.compile and flex_attention are what the framework makes of plain
PyTorch. The report gives the ratio against each kind apart.
"""
import functools
import importlib
import re
import warnings
from typing import Dict, Optional, Tuple

import torch
import torch.nn.functional as F

from fk_pytest.compare import triton_interpreter_active
from fk_pytest.peers import (COMPILE, EAGER, PRODUCTION, OpPeers, Peer, PeerContext, Skipped, Target, Unsupported,
                             compiled_native, package_version)

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


def _wide_decode(case) -> bool:
    shape = decode_shape(case)
    return shape is not None and shape[0] >= 32 and shape[1] >= 2048


def _long_decode(case) -> bool:
    shape = decode_shape(case)
    return shape is not None and shape[0] == 1 and shape[1] >= 8192


MEMORY_BOUND = Target(f">= 85% of copy bandwidth at >= {BANDWIDTH_TOKENS} tokens", 0.85, _many_tokens)
DECODE_WIDE = Target("paged decode B>=32 C>=2048: >= 80% of copy bandwidth", 0.80, _wide_decode)
DECODE_LONG = Target("paged decode B1 C8192: >= 70% of copy bandwidth", 0.70, _long_decode)


# ---- Liger-Kernel --------------------------------------------------------------------------------
def _liger_ops(ctx: PeerContext, name: str):
    if ctx.device.type != "cuda" and not triton_interpreter_active():
        raise Skipped("liger's Triton kernels need a GPU (or TRITON_INTERPRET=1 to interpret them on the CPU)")
    try:
        return importlib.import_module(f"liger_kernel.ops.{name}")
    except ImportError as exc:
        raise Skipped(f"liger_kernel is not installed ({exc})") from None


def _liger_rms_norm(ctx: PeerContext):
    """LigerRMSNorm's function with Llama's casting (fp32 rstd, normalised value rounded to the input
    dtype before the weight) and offset 0; the fused-add variant with LigerFusedAddRMSNorm."""
    ops = _liger_ops(ctx, "rms_norm")
    weight, eps = ctx.reference.weight, ctx.reference.variance_epsilon
    if ctx.case["layout"] != "contiguous":
        ctx.note("strided input: liger makes it contiguous first (a copy)")
    if ctx.case["variant"] != "fused-add":
        return lambda inputs: ops.LigerRMSNormFunction.apply(inputs["x"], weight, eps, 0.0, "llama", False)
    try:
        fused = _liger_ops(ctx, "fused_add_rms_norm").LigerFusedAddRMSNormFunction
    except Skipped:
        fused = None
    if fused is not None:
        return lambda inputs: fused.apply(inputs["x"], inputs["residual"], weight, eps, 0.0, "llama", False)
    ctx.note("this liger has no fused add: the add runs in torch, then LigerRMSNorm")

    def add_then_norm(inputs):
        total = inputs["x"] + inputs["residual"]
        return ops.LigerRMSNormFunction.apply(total, weight, eps, 0.0, "llama", False), total

    return add_then_norm


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
                      _liger_rms_norm, **LIGER)
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


def _paged_layer(ctx: PeerContext, attend):
    """The layer's whole job around ``attend``: store the step's K/V at the slot mapping, gather each
    sequence's K/V through its block table, attend causally (bottom-right aligned)."""
    ref, task = ctx.reference, ctx.task
    nq, nk, hs = ref.num_heads, ref.num_kv_heads, ref.head_size
    k_name, v_name = task.cache_names()[:2]
    layouts: Dict[tuple, PackedLayout] = {}

    def layer(inputs):
        meta, k_cache, v_cache = inputs["metadata"], inputs[k_name], inputs[v_name]
        t = inputs["query"].shape[0]
        q = inputs["query"].view(t, nq, hs)
        k_slots, v_slots = k_cache.view(-1, nk, hs), v_cache.view(-1, nk, hs)
        k_slots.index_copy_(0, meta.slot_mapping, inputs["key"].reshape(t, nk, hs))
        v_slots.index_copy_(0, meta.slot_mapping, inputs["value"].reshape(t, nk, hs))
        key = PackedLayout.key(meta)
        if key not in layouts:  # the first call (the correctness check) plans; timed calls reuse it
            layouts[key] = PackedLayout(meta, q.device)
        layout = layouts[key]
        slots = layout.slots(meta.block_tables)
        return attend(q, k_slots[slots], v_slots[slots], layout, ref.scale).reshape(t, nq * hs)

    return layer


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
        mode = {"gqa": None}  # decided by the first call: "native" or "repeat"

        def attend_with(gqa, q, k_all, v_all, layout, scale):
            out = torch.empty_like(q)
            with sdpa_kernel([backend]):
                for i in range(len(layout.q_lens)):
                    qa, qb = layout.q_start[i], layout.q_start[i + 1]
                    ka, kb = layout.kv_start[i], layout.kv_start[i + 1]
                    qi = q[qa:qb].transpose(0, 1).unsqueeze(0)
                    ki = k_all[ka:kb].transpose(0, 1).unsqueeze(0)
                    vi = v_all[ka:kb].transpose(0, 1).unsqueeze(0)
                    if gqa == "repeat" and group > 1:
                        ki, vi = ki.repeat_interleave(group, dim=1), vi.repeat_interleave(group, dim=1)
                    extra = {"enable_gqa": True} if gqa == "native" and group > 1 else {}
                    q_len, context = qb - qa, layout.context(i)
                    if q_len == 1 or context == 0:
                        oi = F.scaled_dot_product_attention(qi, ki, vi, is_causal=q_len > 1, scale=scale, **extra)
                    else:
                        mask = causal_lower_right(q_len, kb - ka) if backend_name == "FLASH_ATTENTION" \
                            else layout.bottom_right_mask(i)
                        oi = F.scaled_dot_product_attention(qi, ki, vi, attn_mask=mask, scale=scale, **extra)
                    out[qa:qb] = oi[0].transpose(0, 1)
            return out

        def attend(q, k_all, v_all, layout, scale):
            if mode["gqa"] is not None:
                return attend_with(mode["gqa"], q, k_all, v_all, layout, scale)
            failures = []
            for gqa in ("native", "repeat"):
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    try:
                        out = attend_with(gqa, q, k_all, v_all, layout, scale)
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

        return _paged_layer(ctx, attend)

    return build


def _flex(ctx: PeerContext):
    """flex_attention (compiled) over the packed batch: one call for every sequence, with a block mask
    "same sequence and key position <= query position" built once per batch shape."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    if ctx.compile:
        flex = torch.compile(flex_attention, dynamic=False)
    else:
        flex = flex_attention
        ctx.note("uncompiled (--no-compile): flex_attention's slow reference path")
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


def _compile_attention(ctx: PeerContext):
    batch = len(ctx.case["context"])
    if batch > MAX_COMPILED_SEQUENCES:
        raise Skipped(f"forward_native loops over the {batch} sequences; compiling unrolls the loop "
                      f"(skipped above {MAX_COMPILED_SEQUENCES} sequences to keep compile time bounded)")
    return compiled_native(ctx)


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
        rows = torch.cat([inputs["kv_c_normed"].reshape(t, rank), inputs["k_pe"].reshape(t, rope)], -1)
        flat = cache.view(-1, rank + rope)
        flat.index_copy_(0, meta.slot_mapping, rows.to(cache.dtype))
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


MLA_PEERS = (
    EAGER,
    Peer("compile", COMPILE.description + f" (batches of up to {MAX_COMPILED_SEQUENCES} sequences)",
         _compile_attention),
    Peer("sdpa-expanded", "latent store/gather, kv_b_proj expansion, SDPA per sequence (no MLA kernel)",
         _mla_sdpa_expanded, kind=PRODUCTION),
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


# ---- the ops -------------------------------------------------------------------------------------
def _op(peers, targets=(), case_filter=llama_family_bf16) -> OpPeers:
    return OpPeers(tuple(peers), tuple(targets), case_filter)


OPS: Dict[str, OpPeers] = {
    "rms_norm": _op((EAGER, COMPILE, LIGER_RMS_NORM), (MEMORY_BOUND,)),
    "silu_and_mul": _op((EAGER, COMPILE, LIGER_SILU), (MEMORY_BOUND,)),
    "rotary_emb": _op((EAGER, COMPILE, LIGER_ROPE), (MEMORY_BOUND,)),
    "attention": _op(ATTENTION_PEERS, (DECODE_WIDE, DECODE_LONG)),
    "mla_attention": _op(MLA_PEERS, (), _bf16),
    "deepseek_rotary_emb": _op((EAGER, COMPILE), (MEMORY_BOUND,), _bf16),
    "vocab_parallel_embedding": _op((EAGER, COMPILE), (MEMORY_BOUND,)),
    # The reference already calls cuBLAS through F.linear; eager and Inductor are still what a user has.
    "qkv_parallel_linear": _op((EAGER, COMPILE)),
    "merged_column_parallel_linear": _op((EAGER, COMPILE)),
    "row_parallel_linear": _op((EAGER, COMPILE)),
    "replicated_linear": _op((EAGER, COMPILE)),
    "parallel_lm_head": _op((EAGER, COMPILE)),
    "fused_moe": _op((EAGER, MOE_COMPILE, GROUPED_MM), (MOE_PREFILL, MOE_DECODE), moe_bf16),
    "topk_softmax": _op((EAGER, COMPILE), (), moe_bf16),
    # No eager peer: forward_native is the float64-exact token-by-token recurrence, minutes a case.
    "gated_delta_rule": _op((FLA_GATED_DELTA,), (), _bf16),
    "gated_linear_attention": _op((FLA_GLA,), (), _bf16),
    "rwkv7": _op((FLA_RWKV7,), (), _bf16),
}
