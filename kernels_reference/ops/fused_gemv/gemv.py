"""One-token GEMVs with the decode step's per-layer glue fused in (Triton), for the engine's fused
batch-1 decode path (:mod:`kernels_reference.engine.fused_decode`).

At batch 1 a Llama layer's linear layers read their weights once, and everything between them
(residual add + RMSNorm, RoPE, the KV-cache store, SiluAndMul) is a handful of tiny kernels whose
cost is their launch and their memory latency, not their bytes: on the H200 they took 0.66 ms of
a 4.53 ms Llama-3.1-8B decode step (docs/perf/h200-engine.md). One kernel, in three forms, absorbs
them into the GEMVs that surround them:

* ``norm_gemv_rope_kv``: (residual add +) RMSNorm as the prologue of the fused q/k/v projection;
  NeoX RoPE on q and k and the store of k and v into the paged cache as its epilogue. The query
  comes out rotated; nothing else is written (k and v go straight to their cache slot).
* ``norm_gemv_silu_mul``: (residual add +) RMSNorm as the prologue of the gate/up projection;
  SiluAndMul as its epilogue (the [2 * intermediate] activation never reaches memory).
* ``gemv``: the plain projection (o, down), optionally applying SiluAndMul to its input as it
  reads it; with the other two it lets every launch of a layer be a dependent launch (PDL).

How the work is cut: one program owns HALF output rows and their *partners* (rotary pair i and
i + head_dim/2 of the same head; gate row j and up row j), so each epilogue is local to a
program. Every program recomputes the RMS statistics of the one input row (a few KiB from L2)
instead of waiting for another kernel to write them; program 0 writes the updated residual
(to a buffer other than the one every program reads, so no program sees it half-written).

Numerics follow the unfused modules step by step: the sum and the norm in float32 with the norm
rounded to the model dtype before the weight multiply (RMSNorm), the projection accumulated in
float32 and rounded to the model dtype (``F.linear``'s output), the rotation / activation in
float32 with one rounding. Only the GEMV's summation order differs from cuBLAS's.

Scope: one token (decode at batch 1), weights [N, K] with a unit inner stride, no bias, NeoX RoPE
over the whole head. ``torch`` equivalents (``*_reference``) define the semantics for the tests.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # the fused path is simply unavailable without Triton
    triton = None

SILU_MUL, ROPE_KV, PLAIN = 0, 1, 2
HALF_ROWS = 8  # output rows per program and half (a program owns 2 * HALF_ROWS weight rows)
MIN_HALF_ROWS = 4  # used instead where HALF_ROWS would leave fewer than 3 programs per SM
# The GPU tile per kernel kind: a program streams 2 x HALF rows x BLOCK_K columns per loop
# iteration and multiplies in registers (ROW_ACC: one accumulator per row, reduced every
# iteration). Optional: "HALF" fixes the rows per half (default: _half_rows); "PER_SM" makes the
# grid persistent; "STAGES" > 1 pipelines the loop's loads through shared memory (cp.async);
# "NORM_BLOCK" sets the columns per step of the norm statistics (default: the whole row).
# benchmarks/fused_gemv.py times alternatives on the H200 side by side. Tried there and removed
# (docs/perf/h200-engine.md): tensor-core loops, both the token as row 0 of a 16-row A operand
# (2026-12-01, commits b7902d5..49a26cf, 1.1-3x slower) and the weights as A (commits 149a3b4..921bd58 (2026-12-01) run o, 1.2-1.7x slower); weight
# prefetching, into registers a tile ahead (never faster) and into L2 before the PDL wait
# (0.16-0.32 ms slower in the engine, run p).
# Defaults: the fastest per kind in the engine (runs k, p, q): tiles that keep their weights in
# shared memory (TMA, STAGES > 1) win the isolated sweep but lose inside the engine (runs m, q).
# LATE_TRIGGER (with PDL): the next kernel launched once every program has streamed its last
# weights, not at once: 0.036 ms faster per step (run t).
GPU_TILES = {ROPE_KV: dict(BLOCK_K=512, num_warps=4, ROW_ACC=True, LATE_TRIGGER=True),
             SILU_MUL: dict(BLOCK_K=512, num_warps=4, ROW_ACC=True, PER_SM=5, LATE_TRIGGER=True),
             PLAIN: dict(BLOCK_K=1024, num_warps=8, ROW_ACC=True, LATE_TRIGGER=True)}


def _config(k: int, on_gpu: bool, epilogue: int = PLAIN) -> dict:
    """Tile of the K loop; the interpreter takes the whole row at once (it pays per step, not per
    element)."""
    if not on_gpu:
        return dict(BLOCK_K=triton.next_power_of_2(k), num_warps=4, ROW_ACC=False)
    return dict(GPU_TILES[epilogue])


def _check_row(x: torch.Tensor, residual: Optional[torch.Tensor], norm_weight: torch.Tensor,
               weight: torch.Tensor) -> None:
    if x.dim() != 2 or x.shape[0] != 1:
        raise ValueError(f"the fused GEMVs take one token [1, hidden], got {tuple(x.shape)}")
    hidden = x.shape[1]
    if residual is not None and residual.shape != x.shape:
        raise ValueError(f"residual {tuple(residual.shape)} does not match the input {tuple(x.shape)}")
    if norm_weight.shape != (hidden,) or weight.dim() != 2 or weight.shape[1] != hidden:
        raise ValueError(f"norm weight {tuple(norm_weight.shape)} / weight {tuple(weight.shape)} do not fit "
                         f"rows of {hidden}")
    if weight.stride(1) != 1:
        raise ValueError("the weight needs a unit stride along its input dimension")


def _half_rows(pairs: int, device: torch.device) -> int:
    """Rows per program and half: HALF_ROWS, or MIN_HALF_ROWS where that many would give fewer than
    three programs per SM (Llama-3.1-8B's q/k/v, o and down projections on an H200): a program
    streams its rows alone, so an SM needs several to keep enough loads in flight."""
    from ..paged_decode.device import sm_count

    if pairs % HALF_ROWS == 0 and pairs // HALF_ROWS >= 3 * sm_count(device):
        return HALF_ROWS
    return MIN_HALF_ROWS if pairs % MIN_HALF_ROWS == 0 else HALF_ROWS


def _row_args(x, residual):
    """Contiguous input row, residual row and a fresh buffer for the updated residual."""
    x = x.contiguous()
    if residual is None:
        return x, x, x  # unused by the kernel (HAS_RES=False): the residual is the input itself
    return x, residual.contiguous(), torch.empty_like(x)


def norm_gemv_silu_mul(x: torch.Tensor, residual: Optional[torch.Tensor], norm_weight: torch.Tensor, eps: float,
                       gate_up_weight: torch.Tensor, pdl: bool = False) -> Tuple[torch.Tensor, torch.Tensor]:
    """``SiluAndMul(gate_up(RMSNorm(x [+ residual])))`` for one token: (activation [1, I], residual).

    ``gate_up_weight`` [2I, hidden] holds gate rows then up rows (``MergedColumnParallelLinear``).
    The returned residual is ``x + residual`` (or ``x`` itself when ``residual`` is None). ``pdl``:
    launched as a programmatic dependent launch (sm_90+): nothing is read or written before the wait
    for the kernel ahead, and the next kernel may launch once every program of this one runs.
    """
    _check_row(x, residual, norm_weight, gate_up_weight)
    inter = gate_up_weight.shape[0] // 2
    if gate_up_weight.shape[0] % 2 or inter % HALF_ROWS:
        raise ValueError(f"gate/up weight of {gate_up_weight.shape[0]} rows: need 2 x a multiple of {HALF_ROWS}")
    x, res, res_out = _row_args(x, residual)
    out = torch.empty(1, inter, dtype=x.dtype, device=x.device)
    _launch(x, res, res_out, norm_weight, eps, gate_up_weight, out, residual is not None, SILU_MUL,
            pair_offset=inter, pairs=inter, pdl=pdl)
    return out, (res_out if residual is not None else x)


def gemv(x: torch.Tensor, weight: torch.Tensor, pdl: bool = False, silu_mul_input: bool = False) -> torch.Tensor:
    """``F.linear(x, weight)`` for one token [1, K] -> [1, N], with the same kernel (no norm, no
    epilogue): the fused path's o and down projections, so that every launch of a layer can be a
    dependent launch (``pdl``), which cuBLAS's kernels are not. ``silu_mul_input``: x is the
    gate/up projection's output [1, 2K] and the kernel applies SiluAndMul to it as it reads it
    (SiluAndMul's numerics: float32, one rounding), so the activation never reaches memory."""
    k = x.shape[-1] // 2 if silu_mul_input else x.shape[-1]
    if x.dim() != 2 or x.shape[0] != 1 or weight.dim() != 2 or weight.shape[1] != k or (
            silu_mul_input and x.shape[1] % 2):
        raise ValueError(f"gemv takes x [1, K] (silu_mul_input: [1, 2K]) and weight [N, K], got {tuple(x.shape)} "
                         f"and {tuple(weight.shape)}")
    if weight.stride(1) != 1 or weight.shape[0] % (2 * MIN_HALF_ROWS):
        raise ValueError(f"weight {tuple(weight.shape)}: needs a unit inner stride and a multiple of "
                         f"{2 * MIN_HALF_ROWS} rows")
    x = x.contiguous()
    out = torch.empty(1, weight.shape[0], dtype=x.dtype, device=x.device)
    n_half = weight.shape[0] // 2
    _launch(x, x, x, x, 0.0, weight, out, False, PLAIN, pair_offset=n_half, pairs=n_half, pdl=pdl, norm=False,
            silu_in=silu_mul_input)
    return out


def gemv_reference(x, weight, silu_mul_input=False):
    if silu_mul_input:
        gate, up = x.float().chunk(2, dim=-1)
        x = (torch.nn.functional.silu(gate) * up).to(x.dtype)
    return torch.nn.functional.linear(x, weight)


def norm_gemv_rope_kv(x: torch.Tensor, residual: Optional[torch.Tensor], norm_weight: torch.Tensor, eps: float,
                      qkv_weight: torch.Tensor, cos_sin: torch.Tensor, cos_sin_row: torch.Tensor,
                      slot: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                      num_heads: int, num_kv_heads: int, head_size: int,
                      pdl: bool = False) -> Tuple[torch.Tensor, torch.Tensor]:
    """The attention block's input side for one token: ``qkv = qkv_proj(RMSNorm(x [+ residual]))``,
    NeoX RoPE on q and k at row ``cos_sin_row`` [1] of ``cos_sin`` ([positions, head_size]: cos
    half then sin half, as ``RotaryEmbedding.cos_sin_table``), k and v stored at cache ``slot``
    [1] (skipped when negative: a padding row). Returns (rotated query [1, nq * d], residual)."""
    _check_row(x, residual, norm_weight, qkv_weight)
    if qkv_weight.shape[0] != (num_heads + 2 * num_kv_heads) * head_size:
        raise ValueError(f"qkv weight of {qkv_weight.shape[0]} rows does not hold {num_heads} + 2 x "
                         f"{num_kv_heads} heads of {head_size}")
    if head_size % (2 * HALF_ROWS) or cos_sin.shape[-1] != head_size:
        raise ValueError(f"head size {head_size} / rotary table width {cos_sin.shape[-1]}: the fused path "
                         f"needs full-head NeoX RoPE and a head size that is a multiple of {2 * HALF_ROWS}")
    for cache in (key_cache, value_cache):
        if cache.dim() != 4 or cache.shape[2:] != (num_kv_heads, head_size) or cache.stride(-1) != 1:
            raise ValueError(f"cache {tuple(cache.shape)} is not [blocks, block_size, {num_kv_heads}, {head_size}]")
    x, res, res_out = _row_args(x, residual)
    query = torch.empty(1, num_heads * head_size, dtype=x.dtype, device=x.device)
    heads = num_heads + 2 * num_kv_heads
    _launch(x, res, res_out, norm_weight, eps, qkv_weight, query, residual is not None, ROPE_KV,
            pair_offset=head_size // 2, pairs=heads * (head_size // 2), pdl=pdl,
            rope=(cos_sin, cos_sin_row, slot, key_cache, value_cache, num_heads, num_kv_heads, head_size))
    return query, (res_out if residual is not None else x)


LAST_LAUNCH: dict = {}  # the last compiled kernel launched (the H200 script reads its registers)


def _launch(x, res, res_out, norm_weight, eps, weight, out, has_res, epilogue, pair_offset, pairs, pdl=False,
            rope=None, norm=True, silu_in=False):
    if rope is None:  # the rope/cache arguments are unused: any tensor of the right kind will do
        cos_sin, row, slot, kc, vc, nq, nk, d = out, x, x, out.view(1, 1, 1, -1), out.view(1, 1, 1, -1), 1, 1, 1
    else:
        cos_sin, row, slot, kc, vc, nq, nk, d = rope
    from ..paged_decode.device import sm_count

    config = _config(weight.shape[1], x.is_cuda, epilogue)
    half = config.pop("HALF", None) or _half_rows(pairs, x.device)
    if pairs % half or (epilogue == ROPE_KV and (d // 2) % half):
        half = HALF_ROWS  # every caller has checked that this one divides
    if pdl and x.is_cuda:
        from ..paged_decode.device import VariantUnavailable, pdl_unavailable_reason

        reason = pdl_unavailable_reason(x.device)
        if reason:
            raise VariantUnavailable(f"fused GEMV with pdl=True: {reason}")
        config["launch_pdl"] = True
    groups = pairs // half
    # PER_SM: a persistent grid of that many programs per SM (the statistics computed once per
    # program, no partial last wave); else one program per group.
    per_sm = config.pop("PER_SM", None)
    programs = min(groups, per_sm * sm_count(x.device)) if per_sm else groups
    # TMA: the weight tiles come through a tensor descriptor (the Hopper tensor memory
    # accelerator), in a loop Triton pipelines STAGES deep through shared memory.
    tma, stages = config.pop("TMA", False), config.pop("STAGES", 1)
    w_desc = _weight_descriptor(weight, half, config["BLOCK_K"]) if tma else weight
    # NORM_BLOCK: columns of x per step of the norm statistics pass. By default the whole row (up
    # to 8192 columns) at once: one memory round trip instead of K / BLOCK_K dependent ones, worth
    # 0.135 ms of a Llama-3.1-8B step on the H200 (docs/perf/h200-engine.md, run p).
    norm_block = min(config.pop("NORM_BLOCK", 0) or 8192, triton.next_power_of_2(weight.shape[1]))
    late_trigger = config.pop("LATE_TRIGGER", False)  # with PDL: see the kernel
    LAST_LAUNCH["kernel"] = _norm_gemv_kernel[(programs,)](
        x, res, res_out, norm_weight, weight, w_desc, out,
        cos_sin, row, slot, kc, vc,
        weight.shape[1], eps, weight.stride(0), pair_offset, cos_sin.stride(0) if cos_sin.dim() == 2 else 0, groups,
        kc.stride(0), kc.stride(1), kc.stride(2), vc.stride(0), vc.stride(1), vc.stride(2), kc.shape[1],
        HAS_RES=has_res, EPILOGUE=epilogue, HALF=half, NORM=norm, PDL=pdl and x.is_cuda, SILU_IN=silu_in,
        TMA=tma, STAGES=stages, NORM_BLOCK=norm_block, LATE_TRIGGER=late_trigger,
        NUM_Q_HEADS=nq, NUM_KV_HEADS=nk, HEAD_DIM=d, **config,
    )


def _weight_descriptor(weight: torch.Tensor, half: int, block_k: int):
    from triton.tools.tensor_descriptor import TensorDescriptor

    return TensorDescriptor.from_tensor(weight, [half, block_k])


# ---- the same computations in torch (the tests' definition of what the kernels do) -----------------

def _norm_reference(x, residual, norm_weight, eps):
    h = x.float() + (residual.float() if residual is not None else 0.0)
    res = h.to(x.dtype) if residual is not None else x
    normed = (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * norm_weight
    return normed, res


def norm_gemv_silu_mul_reference(x, residual, norm_weight, eps, gate_up_weight):
    normed, res = _norm_reference(x, residual, norm_weight, eps)
    gate, up = torch.nn.functional.linear(normed, gate_up_weight).float().chunk(2, dim=-1)
    return (torch.nn.functional.silu(gate) * up).to(x.dtype), res


def norm_gemv_rope_kv_reference(x, residual, norm_weight, eps, qkv_weight, cos_sin, cos_sin_row, slot,
                                key_cache, value_cache, num_heads, num_kv_heads, head_size):
    normed, res = _norm_reference(x, residual, norm_weight, eps)
    qkv = torch.nn.functional.linear(normed, qkv_weight).float().view(-1, head_size)
    half = head_size // 2
    cos, sin = cos_sin[cos_sin_row.long()].float().view(1, head_size).split(half, dim=-1)
    x1, x2 = qkv[:num_heads + num_kv_heads].split(half, dim=-1)
    rotated = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)
    query, key = rotated[:num_heads], rotated[num_heads:]
    value = qkv[num_heads + num_kv_heads:].to(x.dtype)
    s = int(slot.reshape(-1)[0])
    if s >= 0:
        block, offset = divmod(s, key_cache.shape[1])
        key_cache[block, offset] = key.to(key_cache.dtype)
        value_cache[block, offset] = value.to(value_cache.dtype)
    return query.reshape(1, -1), res


if triton is not None:
    from ..paged_decode.device import _gdc_launch_dependents, _gdc_wait  # grid dependency control (or stand-ins)

    # ---- the kernel's pieces: the norm prologue, a chunk of the GEMV input, the rows of a group and
    # the epilogues ------------------------------------------------------------------------------

    @triton.jit
    def _row_rstd(x_ptr, res_ptr, res_out_ptr, K, eps, pid, HAS_RES: tl.constexpr, BLOCK_K: tl.constexpr):
        """RMS statistics of x (+ residual) in float32, as RMSNorm; program 0 writes the sum (the
        updated residual)."""
        kk = tl.arange(0, BLOCK_K)
        dtype = x_ptr.dtype.element_ty
        sumsq = tl.zeros([BLOCK_K], tl.float32)
        for k0 in range(0, K, BLOCK_K):
            m = k0 + kk < K
            h = tl.load(x_ptr + k0 + kk, mask=m, other=0.0).to(tl.float32)
            if HAS_RES:
                h += tl.load(res_ptr + k0 + kk, mask=m, other=0.0).to(tl.float32)
                tl.store(res_out_ptr + k0 + kk, h.to(dtype), mask=m & (tl.zeros([BLOCK_K], tl.int32) + pid == 0))
            sumsq += h * h
        return 1.0 / tl.sqrt(tl.sum(sumsq, axis=0) / K + eps)

    @triton.jit
    def _input_chunk(x_ptr, res_ptr, norm_w_ptr, k0, kk, K, rstd,
                     HAS_RES: tl.constexpr, NORM: tl.constexpr, SILU_IN: tl.constexpr):
        """Columns k0 + kk of the GEMV's input in float32, holding model-dtype values: the normalised
        row (RMSNorm's two roundings), SiluAndMul of x's two halves (one rounding), or x itself."""
        dtype = x_ptr.dtype.element_ty
        m = k0 + kk < K
        h = tl.load(x_ptr + k0 + kk, mask=m, other=0.0).to(tl.float32)
        if SILU_IN:  # x holds gate then up (K each): SiluAndMul as the input is read
            up = tl.load(x_ptr + K + k0 + kk, mask=m, other=0.0).to(tl.float32)
            h = (h / (1.0 + tl.exp(-h)) * up).to(dtype).to(tl.float32)
        if NORM:
            if HAS_RES:
                h += tl.load(res_ptr + k0 + kk, mask=m, other=0.0).to(tl.float32)
            nw = tl.load(norm_w_ptr + k0 + kk, mask=m, other=0.0).to(tl.float32)
            h = ((h * rstd).to(dtype).to(tl.float32) * nw).to(dtype).to(tl.float32)
        return h

    @triton.jit
    def _group_rows(group, pair_offset, EPILOGUE: tl.constexpr, HALF: tl.constexpr, HEAD_DIM: tl.constexpr):
        """A group's HALF output rows and their partners: (head, col, first row, rows, partner rows).
        ROPE_KV: HALF rotary pairs (i, i + HEAD_DIM/2) of one head; else rows j..j+HALF and the
        rows pair_offset later. The rows of a half are contiguous (first_row + col)."""
        r = tl.arange(0, HALF)
        if EPILOGUE == 1:
            CHUNKS: tl.constexpr = HEAD_DIM // 2 // HALF
            head = group // CHUNKS
            first_col = (group % CHUNKS) * HALF
            first_row = head * HEAD_DIM + first_col
            col = first_col + r  # rotary index within the head's first half
        else:
            head = group
            first_row = group * HALF
            col = r
        rows_a = first_row + r
        return head, col, first_row, rows_a, rows_a + pair_offset

    @triton.jit
    def _store_rows(ya, yb, head, col, rows_a, rows_b, out_ptr,
                    cos_sin_ptr, cos_sin_row_ptr, cs_s_row, slot_ptr, k_cache_ptr, v_cache_ptr,
                    kc_s_block, kc_s_tok, kc_s_head, vc_s_block, vc_s_tok, vc_s_head, block_size,
                    EPILOGUE: tl.constexpr, HALF: tl.constexpr, NUM_Q_HEADS: tl.constexpr,
                    NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr):
        """The epilogue of one group: ya / yb are its rows' and partners' GEMV outputs (float32
        holding model-dtype values, as F.linear's output)."""
        dtype = out_ptr.dtype.element_ty
        if EPILOGUE == 0:  # SILU_MUL
            out = ya / (1.0 + tl.exp(-ya)) * yb
            tl.store(out_ptr + rows_a, out.to(dtype))
        elif EPILOGUE == 2:  # PLAIN
            tl.store(out_ptr + rows_a, ya.to(dtype))
            tl.store(out_ptr + rows_b, yb.to(dtype))
        else:  # ROPE_KV
            # Scalar conditions are broadcast over the rows (the interpreter rejects scalar masks).
            heads = tl.zeros([HALF], tl.int32) + head
            rotate = heads < NUM_Q_HEADS + NUM_KV_HEADS  # q and k rotate, v does not
            cs_row = tl.load(cos_sin_row_ptr).to(tl.int64)
            cos = tl.load(cos_sin_ptr + cs_row * cs_s_row + col)
            sin = tl.load(cos_sin_ptr + cs_row * cs_s_row + HEAD_DIM // 2 + col)
            oa = tl.where(rotate, ya * cos - yb * sin, ya).to(dtype)
            ob = tl.where(rotate, yb * cos + ya * sin, yb).to(dtype)
            is_q = heads < NUM_Q_HEADS
            tl.store(out_ptr + rows_a, oa, mask=is_q)
            tl.store(out_ptr + rows_b, ob, mask=is_q)
            slot = tl.load(slot_ptr + tl.zeros([HALF], tl.int32)).to(tl.int64)  # one slot, as a row vector
            stored = (slot >= 0) & (heads >= NUM_Q_HEADS)
            block = slot // block_size
            offset = slot % block_size
            is_k = heads < NUM_Q_HEADS + NUM_KV_HEADS
            is_v = heads >= NUM_Q_HEADS + NUM_KV_HEADS
            kv_head = tl.where(is_k, heads - NUM_Q_HEADS, heads - NUM_Q_HEADS - NUM_KV_HEADS).to(tl.int64)
            k_row = k_cache_ptr + block * kc_s_block + offset * kc_s_tok + kv_head * kc_s_head
            v_row = v_cache_ptr + block * vc_s_block + offset * vc_s_tok + kv_head * vc_s_head
            kv_ty = k_cache_ptr.dtype.element_ty
            tl.store(k_row + col, oa.to(kv_ty), mask=stored & is_k)
            tl.store(k_row + HEAD_DIM // 2 + col, ob.to(kv_ty), mask=stored & is_k)
            tl.store(v_row + col, oa.to(kv_ty), mask=stored & is_v)
            tl.store(v_row + HEAD_DIM // 2 + col, ob.to(kv_ty), mask=stored & is_v)

    # ---- the kernel: each program multiplies its weight tiles in registers --------------------------

    @triton.jit
    def _norm_gemv_kernel(
        x_ptr, res_ptr, res_out_ptr, norm_w_ptr, w_ptr, w_desc, out_ptr,
        cos_sin_ptr, cos_sin_row_ptr, slot_ptr, k_cache_ptr, v_cache_ptr,
        K, eps, w_s_row, pair_offset, cs_s_row, n_groups,
        kc_s_block, kc_s_tok, kc_s_head, vc_s_block, vc_s_tok, vc_s_head, block_size,
        HAS_RES: tl.constexpr, EPILOGUE: tl.constexpr, HALF: tl.constexpr,
        NUM_Q_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
        BLOCK_K: tl.constexpr, ROW_ACC: tl.constexpr, NORM: tl.constexpr,
        PDL: tl.constexpr, SILU_IN: tl.constexpr, TMA: tl.constexpr, STAGES: tl.constexpr,
        NORM_BLOCK: tl.constexpr, LATE_TRIGGER: tl.constexpr,
    ):
        pid = tl.program_id(0)
        dtype = out_ptr.dtype.element_ty
        kk = tl.arange(0, BLOCK_K)
        if PDL:
            # A dependent launch: nothing is read from the kernel ahead (x, the residual) or
            # written before it has finished. The next kernel may launch once every program of
            # this one is past its wait (it waits for this one's completion in turn); LATE_TRIGGER:
            # only once every program has streamed its last weights, so that the next kernel's
            # waiting programs do not take SM resources while this one still streams.
            _gdc_wait()
            if not LATE_TRIGGER:
                _gdc_launch_dependents()
        rstd = 1.0
        if NORM:  # once per program
            rstd = _row_rstd(x_ptr, res_ptr, res_out_ptr, K, eps, pid, HAS_RES, NORM_BLOCK)

        # With fewer programs than groups (a persistent grid) each program takes every
        # num_programs-th group.
        for group in range(pid, n_groups, tl.num_programs(0)):
            head, col, first_row, rows_a, rows_b = _group_rows(group, pair_offset, EPILOGUE, HALF, HEAD_DIM)
            wa_ptrs = w_ptr + rows_a.to(tl.int64)[:, None] * w_s_row + kk[None, :]
            wb_ptrs = w_ptr + rows_b.to(tl.int64)[:, None] * w_s_row + kk[None, :]
            # The GEMV in float32. ROW_ACC: one partial sum per row, reduced every iteration (few
            # registers); else partial products per column, reduced once at the end.
            if ROW_ACC:
                acc_a = tl.zeros([HALF], tl.float32)
                acc_b = tl.zeros([HALF], tl.float32)
            else:
                acc_a = tl.zeros([HALF, BLOCK_K], tl.float32)
                acc_b = tl.zeros([HALF, BLOCK_K], tl.float32)
            for k0 in tl.range(0, K, BLOCK_K, num_stages=STAGES):
                m = k0 + kk < K
                if TMA:
                    wa = w_desc.load([first_row, k0])
                    wb = w_desc.load([first_row + pair_offset, k0])
                else:
                    wa = tl.load(wa_ptrs + k0, mask=m[None, :], other=0.0, eviction_policy="evict_first")
                    wb = tl.load(wb_ptrs + k0, mask=m[None, :], other=0.0, eviction_policy="evict_first")
                a = _input_chunk(x_ptr, res_ptr, norm_w_ptr, k0, kk, K, rstd, HAS_RES, NORM, SILU_IN)
                if ROW_ACC:
                    acc_a += tl.sum(wa.to(tl.float32) * a[None, :], axis=1)
                    acc_b += tl.sum(wb.to(tl.float32) * a[None, :], axis=1)
                else:
                    acc_a += wa.to(tl.float32) * a[None, :]
                    acc_b += wb.to(tl.float32) * a[None, :]
            if PDL and LATE_TRIGGER:
                if group + tl.num_programs(0) >= n_groups:  # this program's last group
                    _gdc_launch_dependents()
            if ROW_ACC:
                ya = acc_a.to(dtype).to(tl.float32)  # F.linear's output precision
                yb = acc_b.to(dtype).to(tl.float32)
            else:
                ya = tl.sum(acc_a, axis=1).to(dtype).to(tl.float32)
                yb = tl.sum(acc_b, axis=1).to(dtype).to(tl.float32)
            _store_rows(ya, yb, head, col, rows_a, rows_b, out_ptr, cos_sin_ptr, cos_sin_row_ptr, cs_s_row,
                        slot_ptr, k_cache_ptr, v_cache_ptr, kc_s_block, kc_s_tok, kc_s_head,
                        vc_s_block, vc_s_tok, vc_s_head, block_size,
                        EPILOGUE, HALF, NUM_Q_HEADS, NUM_KV_HEADS, HEAD_DIM)
