"""A torch stand-in for the parts of FlashInfer the suite calls, as FlashInfer's documentation states
them, so that CPU tests can check the plumbing around it (page tables, head layout, MLA absorption,
per-step plans) where FlashInfer itself cannot run. It checks the callers, not FlashInfer.

``plan`` takes the page table (indptr, page indices, last-page lengths, or whole lengths for MLA);
``run`` attends each query row causally, bottom-right aligned, to its sequence's cached rows, in
float64. In CUDA-graph mode (``use_cuda_graph=True`` with caller-owned buffers) ``plan`` copies the
table into those buffers and ``run`` reads them there, with FlashInfer's checks (a fixed batch size,
indices that fit), so a plan that is stale or missing gives wrong answers as it would on a GPU.
"""
import types

import torch


def _length(indptr, last, b, page) -> int:
    pages = int(indptr[b + 1] - indptr[b])
    return 0 if pages == 0 else (pages - 1) * page + int(last[b])


def _rows(cache, b, indptr, indices, length):
    pages = indices[indptr[b]:indptr[b + 1]].long()
    return cache[pages].reshape(-1, *cache.shape[2:])[:length].double()


def _attend(q, keys, values, scale, causal=True):  # q [L, H, d], keys/values [N, Hk, d]
    group = q.shape[1] // keys.shape[1]
    keys, values = keys.repeat_interleave(group, 1), values.repeat_interleave(group, 1)
    scores = torch.einsum("qhd,khd->hqk", q.double(), keys) * scale
    if causal:
        allowed = torch.arange(keys.shape[0])[None, :] <= torch.arange(q.shape[0])[:, None] + keys.shape[0] - q.shape[0]
        scores = scores.masked_fill(~allowed, float("-inf"))
    if keys.shape[0] == 0:
        return torch.zeros_like(q, dtype=torch.float64)
    return torch.einsum("hqk,khd->qhd", torch.softmax(scores, -1), values)


class _Paged:
    def __init__(self, workspace, kv_layout="NHD", use_cuda_graph=False, use_tensor_cores=False, **buffers):
        if kv_layout != "NHD":
            raise ValueError(f"the stand-in has the NHD layout only, got {kv_layout}")
        self.graph = use_cuda_graph
        self.buffers = buffers
        self.table = None

    @staticmethod
    def _check_dtypes(kw):
        """FlashInfer's attention kernels exist for half types only: planning float32 fails in its
        dtype lookup (``KeyError: torch.float32`` on an H100 on 2026-12-05), here alike."""
        for name in ("q_data_type", "kv_data_type"):
            if kw.get(name) is not None and kw[name] not in (torch.float16, torch.bfloat16):
                raise KeyError(kw[name])

    def _keep(self, names, values):
        """The plan's arrays: copied into the caller's buffers in CUDA-graph mode, else kept."""
        if not self.graph:
            self.table = [torch.as_tensor(v).clone() for v in values]
            return
        indptr = self.buffers[names[0]]
        if len(values[0]) != len(indptr):
            raise ValueError(f"the batch size is fixed in cudagraph mode: {len(values[0]) - 1} != {len(indptr) - 1}")
        for name, value in zip(names, values):
            buf = self.buffers[name]
            if len(value) > len(buf):
                raise ValueError("The size of indices should be less than or equal to the allocated buffer")
            buf[:len(value)].copy_(torch.as_tensor(value).to(buf.device))
        self.table = [self.buffers[n] for n in names]


class BatchPrefillWithPagedKVCacheWrapper(_Paged):
    def plan(self, qo_indptr, indptr, indices, last, num_qo_heads, num_kv_heads, head_dim, page_size,
             causal=False, sm_scale=None, **kw):
        self._check_dtypes(kw)
        self._keep(("qo_indptr_buf", "paged_kv_indptr_buf", "paged_kv_indices_buf", "paged_kv_last_page_len_buf"),
                   (qo_indptr, indptr, indices, last))
        self.page, self.causal = page_size, causal
        self.scale = sm_scale if sm_scale is not None else head_dim ** -0.5

    def run(self, q, kv):
        qo, indptr, indices, last = self.table
        out = torch.empty_like(q)
        for b in range(len(qo) - 1):
            n = _length(indptr, last, b, self.page)
            rows = [_rows(c, b, indptr, indices, n) for c in kv]
            out[qo[b]:qo[b + 1]] = _attend(q[qo[b]:qo[b + 1]], *rows, self.scale, self.causal).to(q.dtype)
        return out


class BatchDecodeWithPagedKVCacheWrapper(_Paged):
    def plan(self, indptr, indices, last, num_qo_heads, num_kv_heads, head_dim, page_size, sm_scale=None, **kw):
        self._check_dtypes(kw)
        self._keep(("paged_kv_indptr_buffer", "paged_kv_indices_buffer", "paged_kv_last_page_len_buffer"),
                   (indptr, indices, last))
        self.page = page_size
        self.scale = sm_scale if sm_scale is not None else head_dim ** -0.5

    def run(self, q, kv):
        indptr, indices, last = self.table
        if q.shape[0] != len(indptr) - 1:
            raise ValueError(f"{q.shape[0]} query rows for a plan of {len(indptr) - 1} sequences")
        out = torch.empty_like(q)
        for b in range(q.shape[0]):
            n = _length(indptr, last, b, self.page)
            out[b:b + 1] = _attend(q[b:b + 1], *[_rows(c, b, indptr, indices, n) for c in kv], self.scale).to(q.dtype)
        return out


class BatchMLAPagedAttentionWrapper(_Paged):
    def plan(self, *args, **kw):
        self.plan_args = args

    def run(self, q_nope, q_pe, ckv, kpe):
        _, indptr, indices, lens, _, _, _, _, _, scale = self.plan_args[:10]
        out = torch.empty_like(q_nope)
        for b in range(q_nope.shape[0]):
            c = _rows(ckv, b, indptr, indices, int(lens[b]))
            k = _rows(kpe, b, indptr, indices, int(lens[b]))
            scores = (q_nope[b].double() @ c.T + q_pe[b].double() @ k.T) * scale
            out[b] = (torch.softmax(scores, -1) @ c).to(out.dtype)
        return out


mla = types.SimpleNamespace(BatchMLAPagedAttentionWrapper=BatchMLAPagedAttentionWrapper)


def single_prefill_with_kv_cache(q, k, v, causal=False, sm_scale=None, **kw):
    scale = sm_scale if sm_scale is not None else q.shape[-1] ** -0.5
    return _attend(q, k, v, scale, causal).to(q.dtype)
