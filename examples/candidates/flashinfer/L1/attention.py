"""Paged attention through FlashInfer (``flashinfer-python``), as vLLM's FlashInfer backend runs it.

A real kernel library behind the suite's ``Attention`` interface, to be scored like any candidate,
at kernel level and end to end inside the served model. FlashInfer splits attention into a
per-step ``plan`` (host-side scheduling; the page table copied into the wrapper's buffers) and a
per-layer ``run``. The plan happens in ``plan_step``, which the engine and the kernel-level tasks
call once per step before the forward, outside any CUDA graph
(:mod:`kernels_reference.forward_context`); every layer of the model shares it.

- Steps where every sequence decodes one token: ``BatchDecodeWithPagedKVCacheWrapper`` in CUDA-graph
  mode, one wrapper per batch size with fixed page-table buffers (a captured decode graph reads
  them where capture found them; each step's plan rewrites them in place); on tensor cores when
  more than 4 query heads share a KV head, vLLM's rule (FlashInfer's CUDA-core decode refuses
  Qwen2.5's 7).
- Every other step (prefill, chunked prefill, mixed): ``BatchPrefillWithPagedKVCacheWrapper``,
  causal, decode rows as one-token queries.
- Float32 (the task's fuzzing; FlashInfer's kernels are built for half types): each sequence's
  keys gathered through its block table, then torch's SDPA.
- The step's keys and values go into the cache first, with the reference's cache-store kernel
  (vLLM's FlashInfer backend also writes the cache with its own ``reshape_and_cache_flash``).

The cache layout is FlashInfer's "NHD" paged layout: [pages, page_size, kv_heads, head_dim] for K
and V apart, which is the suite's. Needs a CUDA GPU with ``flashinfer-python`` installed (its
kernels compile just in time with the machine's nvcc on first use).
"""
import os
from typing import Dict, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

import flashinfer
from kernels_reference.forward_context import AttentionMetadata, get_forward_context, page_table
from kernels_reference.ops.kv_store.store import store_kv_cache_triton

HALF_TYPES = (torch.float16, torch.bfloat16)  # the dtypes FlashInfer's attention kernels are built for
WORKSPACE_BYTES = 256 << 20  # split-KV partial results, shared by every wrapper of a device
# Query heads per KV head above which decode runs on tensor cores: vLLM's rule, 4. The environment
# may set another (0: tensor cores for every decode): on an H100 on 2026-12-05 the CUDA-core decode
# failed two Qwen3-8B decode cases (4 query heads per KV head) that the tensor-core one has not been
# tried on: FK_FLASHINFER_TENSOR_CORE_GROUP=0 with the fi-kernel step of benchmarks/gpu_steps.sh.
TENSOR_CORE_GROUP = int(os.environ.get("FK_FLASHINFER_TENSOR_CORE_GROUP", "4"))


class _StepPlan:
    """The wrappers of one device, head layout and dtype, and the step they were last planned for."""

    def __init__(self, device, num_heads: int, num_kv_heads: int, head_size: int, scale: float, dtype):
        self.device, self.dtype = device, dtype
        self.heads = (num_heads, num_kv_heads, head_size)
        self.scale = scale
        self.workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        self.prefill = flashinfer.BatchPrefillWithPagedKVCacheWrapper(self.workspace, "NHD")
        self.decoders: Dict[int, Tuple[object, torch.Tensor]] = {}  # batch size -> (wrapper, indices buffer)
        self.planned: Optional[AttentionMetadata] = None  # the metadata the wrappers hold the plan of
        self.lengths = None  # its host lengths
        self.wrapper = None
        self._key = None

    def _decoder(self, batch: int, needed: int, width: int):
        """The CUDA-graph decode wrapper for ``batch`` sequences; a new one (new buffers) only when the
        page indices outgrow its buffer, which never happens to a captured size (its first plan is
        the padded metadata's, whose block tables have the engine's full width)."""
        entry = self.decoders.get(batch)
        if entry is None or entry[1].numel() < needed:
            indices = torch.zeros(max(needed, batch * width, 1), dtype=torch.int32, device=self.device)
            nq, nk, _ = self.heads
            wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
                self.workspace, "NHD", use_cuda_graph=True, use_tensor_cores=nq // nk > TENSOR_CORE_GROUP,
                paged_kv_indptr_buffer=torch.zeros(batch + 1, dtype=torch.int32, device=self.device),
                paged_kv_indices_buffer=indices,
                paged_kv_last_page_len_buffer=torch.zeros(batch, dtype=torch.int32, device=self.device))
            entry = self.decoders[batch] = (wrapper, indices)
        return entry[0]

    def plan(self, meta: AttentionMetadata) -> None:
        if meta is self.planned:  # the other layers of the same step
            return
        if self.dtype not in HALF_TYPES:  # nothing for FlashInfer to plan: the torch path runs it
            self.planned, self.lengths = meta, (meta.query_lens_cpu, meta.seq_lens_cpu)
            return
        indptr, indices, last = page_table(meta)  # host indptr and last, device indices
        decode = bool(meta.query_lens_cpu) and all(n == 1 for n in meta.query_lens_cpu)
        key = (decode, meta.query_lens_cpu, meta.seq_lens_cpu, meta.block_size)
        # The same step again (a kernel-level task's input copies): keep the plan, so that graphs
        # captured on it keep reading live buffers.
        if key == self._key and torch.equal(indices, self._indices):
            self.planned, self.lengths = meta, key[1:3]
            return
        nq, nk, hs = self.heads
        if decode:
            wrapper = self._decoder(meta.num_seqs, indices.numel(), meta.block_tables.shape[1])
            wrapper.plan(indptr, indices, last, nq, nk, hs, meta.block_size, sm_scale=self.scale,
                         q_data_type=self.dtype, kv_data_type=self.dtype)
        else:
            qo_indptr = torch.tensor((0,) + tuple(meta.query_lens_cpu), dtype=torch.int32).cumsum(0).to(torch.int32)
            wrapper = self.prefill
            wrapper.plan(qo_indptr, indptr, indices, last, nq, nk, hs, meta.block_size, causal=True,
                         sm_scale=self.scale, q_data_type=self.dtype, kv_data_type=self.dtype)
        self.wrapper, self._key, self._indices, self.planned = wrapper, key, indices, meta
        self.lengths = key[1:3]

    def holds(self, meta: AttentionMetadata) -> bool:
        """The wrappers hold this step's plan: its metadata's, or an equal step's (a kernel-level
        task's graphs are captured on copies of one step, planned once)."""
        return meta is self.planned or (meta.query_lens_cpu, meta.seq_lens_cpu) == self.lengths


_PLANS: Dict[tuple, _StepPlan] = {}


def _attend_paged_torch(q, k_cache, v_cache, meta: AttentionMetadata, scale: float) -> torch.Tensor:
    """What this tree runs where FlashInfer has no kernel (float32: FlashInfer's are built for half
    types; no served model attends in float32, the task's fuzzing does): per sequence, its keys and
    values gathered through its block table, SDPA with the causal mask aligned to the end of its keys."""
    page, nk, hs = k_cache.shape[1:]
    group = q.shape[1] // nk
    out = torch.empty_like(q)
    start = 0
    for i, (n_q, n) in enumerate(zip(meta.query_lens_cpu, meta.seq_lens_cpu)):
        blocks = meta.block_tables[i, : -(-n // page)].long()
        k, v = (c[blocks].reshape(-1, nk, hs)[:n].transpose(0, 1).repeat_interleave(group, 0) for c in (k_cache, v_cache))
        rows = torch.arange(n_q, device=q.device)[:, None] + (n - n_q)
        mask = torch.arange(n, device=q.device)[None, :] <= rows
        out[start:start + n_q] = F.scaled_dot_product_attention(
            q[start:start + n_q].transpose(0, 1), k, v, attn_mask=mask, scale=scale).transpose(0, 1)
        start += n_q
    return out


class Attention(nn.Module):
    def __init__(self, num_heads: int, head_size: int, scale: float, num_kv_heads: Optional[int] = None):
        super().__init__()
        self.num_heads, self.head_size, self.scale = num_heads, head_size, scale
        self.num_kv_heads = num_kv_heads or num_heads
        self.kv_cache: Optional[Tuple[torch.Tensor, torch.Tensor]] = None

    def _step_plan(self) -> _StepPlan:
        if self.kv_cache is None:
            raise RuntimeError("the FlashInfer attention needs its KV cache bound (kv_cache) before plan_step")
        cache = self.kv_cache[0]
        key = (cache.device, self.num_heads, self.num_kv_heads, self.head_size, self.scale, cache.dtype)
        if key not in _PLANS:
            _PLANS[key] = _StepPlan(cache.device, self.num_heads, self.num_kv_heads, self.head_size, self.scale,
                                    cache.dtype)
        return _PLANS[key]

    def plan_step(self, meta: AttentionMetadata) -> None:
        self._step_plan().plan(meta)

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        meta = get_forward_context()
        t = query.shape[0]
        nq, nk, hs = self.num_heads, self.num_kv_heads, self.head_size
        q = query.reshape(t, nq, hs)
        if meta is None or self.kv_cache is None:  # no paged cache: the batch's tokens as one causal prompt
            if meta is not None:
                raise NotImplementedError("attention over packed sequences without a KV cache")
            return flashinfer.single_prefill_with_kv_cache(
                q, key.reshape(t, nk, hs), value.reshape(t, nk, hs), causal=True,
                sm_scale=self.scale).reshape(t, nq * hs)
        plan = self._step_plan()
        if not plan.holds(meta):
            raise RuntimeError("FlashInfer attention: no plan for this step (plan_step was not called with "
                               "the step's metadata)")
        k_cache, v_cache = self.kv_cache
        store_kv_cache_triton(key, value, k_cache, v_cache, meta.slot_mapping)
        if plan.dtype not in HALF_TYPES:
            return _attend_paged_torch(q, k_cache, v_cache, meta, self.scale).reshape(t, nq * hs)
        return plan.wrapper.run(q, (k_cache, v_cache)).reshape(t, nq * hs)
