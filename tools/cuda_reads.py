"""Read ceilings in CUDA C++ (compiled at run time with NVRTC through ``torch.cuda._compile_kernel``):
how fast can *any* kernel read the K/V bytes of a batch-1 paged decode, beside the Triton reads of
tools/h200_decode_b1.py's ceilings section (which reach 0.70-0.73 of copy at B1 C8192). On the H200
these reads took 10.81-11.37 us at B1 C8192 (0.70-0.73), the same as Triton's: docs/perf/h200-decode-b1.md, run 22.

Each kernel sums what it reads (so no load is dead) and writes one float per CTA; the caller checks
the total against a float64 sum of the same bytes. The cache must be contiguous
[blocks, block_size, kv heads, head_size] in bfloat16 (one block = BLOCK_U4 16-byte words).

* ``read_paged_blocks``: whole cache blocks through the block table, ``per_cta`` blocks per CTA,
  ``unroll`` of them in flight at once (every 16-byte load of K and V issued before any is used),
  ``load`` one of "ldg" (ld.global.nc), "ldcs" (streaming, evict-first), "plain".
* ``read_flat``: both caches' storage read contiguously, ``items`` 16-byte words per thread, one
  step per CTA (the shape of the fastest Triton read).
"""
from __future__ import annotations

import functools

import torch

_COMMON = r"""
// Loads as inline PTX (the cache operator chosen by name), then one empty statement per loaded word
// after a step's last load. What made ptxas issue a step's loads before the first sum was
// __launch_bounds__(THREADS, 1) (MIN_CTAS 1: 80-100 registers, 16-18 loads first in the sm_90 SASS);
// with the default bounds it chose 32 registers and interleaved loads and sums, about 4 in flight,
// these statements notwithstanding.
#define LD_V4(name, op) __device__ __forceinline__ uint4 name(const uint4* p) { uint4 r; \
    asm volatile(op " {%0, %1, %2, %3}, [%4];" : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p)); return r; }
LD_V4(LOAD_ldg, "ld.global.nc.v4.u32")
LD_V4(LOAD_ldcs, "ld.global.cs.v4.u32")
LD_V4(LOAD_plain, "ld.global.v4.u32")
__device__ __forceinline__ void hold(uint4& x) { asm volatile("" : "+r"(x.x), "+r"(x.y), "+r"(x.z), "+r"(x.w)); }
__device__ __forceinline__ float bf16x8_sum(uint4 x) {
    const unsigned w[4] = {x.x, x.y, x.z, x.w};
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < 4; ++i) s += __int_as_float(w[i] << 16) + __int_as_float(w[i] & 0xffff0000u);
    return s;
}
__device__ __forceinline__ void cta_sum_store(float acc, float* out) {
    __shared__ float red[THREADS / 32];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = acc;
    __syncthreads();
    if (threadIdx.x == 0) {
        float t = 0.f;
        for (int i = 0; i < THREADS / 32; ++i) t += red[i];
        out[blockIdx.x] = t;
    }
}
"""

_PAGED = r"""
extern "C" __global__ void __launch_bounds__(THREADS, MIN_CTAS) read_paged_blocks(
        const uint4* __restrict__ k, const uint4* __restrict__ v, const int* __restrict__ table,
        float* __restrict__ out, int n_blocks, int per_cta) {
    // CTA c reads part c % PARTS (THREADS x ITEMS 16-byte words) of blocks [c / PARTS x per_cta, + per_cta)
    const int first = (blockIdx.x / PARTS) * per_cta;
    const long long part = (long long)(blockIdx.x % PARTS) * (THREADS * ITEMS) + threadIdx.x;
    const int end = min(first + per_cta, n_blocks);
    float acc = 0.f;
    int b = first;
    // Every 16-byte load of UNROLL blocks issued before any is summed: ITEMS x UNROLL x 2 loads in
    // flight per thread (unconditional, so the compiler does not interleave them with the sums).
    for (; b + UNROLL <= end; b += UNROLL) {
        uint4 kr[UNROLL][ITEMS], vr[UNROLL][ITEMS];
        long long row[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) row[u] = (long long)__ldg(table + b + u) * BLOCK_U4 + part;
#pragma unroll
        for (int u = 0; u < UNROLL; ++u)
#pragma unroll
            for (int i = 0; i < ITEMS; ++i) {
                kr[u][i] = LOAD(k + row[u] + i * THREADS);
                vr[u][i] = LOAD(v + row[u] + i * THREADS);
            }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u)
#pragma unroll
            for (int i = 0; i < ITEMS; ++i) { hold(kr[u][i]); hold(vr[u][i]); }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u)
#pragma unroll
            for (int i = 0; i < ITEMS; ++i) acc += bf16x8_sum(kr[u][i]) + bf16x8_sum(vr[u][i]);
    }
    for (; b < end; ++b) {  // the rest, one block at a time
        const long long row = (long long)__ldg(table + b) * BLOCK_U4 + part;
        uint4 kr[ITEMS], vr[ITEMS];
#pragma unroll
        for (int i = 0; i < ITEMS; ++i) {
            kr[i] = LOAD(k + row + i * THREADS);
            vr[i] = LOAD(v + row + i * THREADS);
        }
#pragma unroll
        for (int i = 0; i < ITEMS; ++i) { hold(kr[i]); hold(vr[i]); }
#pragma unroll
        for (int i = 0; i < ITEMS; ++i) acc += bf16x8_sum(kr[i]) + bf16x8_sum(vr[i]);
    }
    cta_sum_store(acc, out);
}
"""

_FLAT = r"""
extern "C" __global__ void __launch_bounds__(THREADS, MIN_CTAS) read_flat(
        const uint4* __restrict__ k, const uint4* __restrict__ v, float* __restrict__ out, int n_u4) {
    const long long base = (long long)blockIdx.x * (THREADS * ITEMS) + threadIdx.x;
    uint4 kr[ITEMS], vr[ITEMS];
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
        const long long at = base + i * THREADS;
        kr[i] = at < n_u4 ? LOAD(k + at) : make_uint4(0, 0, 0, 0);
        vr[i] = at < n_u4 ? LOAD(v + at) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) { hold(kr[i]); hold(vr[i]); }
    float acc = 0.f;
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) acc += bf16x8_sum(kr[i]) + bf16x8_sum(vr[i]);
    cta_sum_store(acc, out);
}
"""


def _defines(**values) -> str:
    return "".join(f"#define {name} {value}\n" for name, value in values.items())


@functools.lru_cache(maxsize=None)
def _paged_kernel(threads: int, items: int, unroll: int, load: str, block_u4: int, parts: int, min_ctas: int):
    source = _defines(THREADS=threads, ITEMS=items, UNROLL=unroll, BLOCK_U4=block_u4, LOAD=f"LOAD_{load}",
                      PARTS=parts, MIN_CTAS=min_ctas)
    return torch.cuda._compile_kernel(source + _COMMON + _PAGED, "read_paged_blocks")


@functools.lru_cache(maxsize=None)
def _flat_kernel(threads: int, items: int, load: str, min_ctas: int):
    source = _defines(THREADS=threads, ITEMS=items, LOAD=f"LOAD_{load}", MIN_CTAS=min_ctas)
    return torch.cuda._compile_kernel(source + _COMMON + _FLAT, "read_flat")


def _block_u4(cache: torch.Tensor) -> int:
    if cache.dtype != torch.bfloat16 or not cache.is_contiguous():
        raise ValueError("cuda_reads: a contiguous bfloat16 cache [blocks, block_size, kv heads, head_size]")
    return cache[0].numel() * cache.element_size() // 16


def read_paged_blocks(k_cache, v_cache, table_row, seq_len: int, per_cta=1, unroll=1, threads=256, load="ldg",
                      parts=1, min_ctas=1):
    """Whole blocks of one sequence (``table_row``: its int32 block table), full blocks only; with
    ``parts`` > 1 each block is read by that many CTAs (``per_cta`` must then be 1). ``min_ctas``:
    __launch_bounds__'s minimum CTAs per SM (1 lets ptxas keep more loads in flight per thread)."""
    block_u4 = _block_u4(k_cache)
    if block_u4 % (threads * parts) or (parts > 1 and per_cta != 1):
        raise ValueError(f"a block's {block_u4} 16-byte words do not split over {parts} x {threads} threads")
    n_blocks = seq_len // k_cache.shape[1]
    ctas = -(-n_blocks // per_cta) * parts
    out = torch.empty(ctas, dtype=torch.float32, device=k_cache.device)
    kernel = _paged_kernel(threads, block_u4 // (threads * parts), unroll, load, block_u4, parts, min_ctas)
    kernel(grid=(ctas, 1, 1), block=(threads, 1, 1), args=[k_cache, v_cache, table_row, out, n_blocks, per_cta])
    return out


def read_flat(k_cache, v_cache, items=4, threads=256, load="ldg", min_ctas=1):
    n_u4 = k_cache.numel() * k_cache.element_size() // 16
    _block_u4(v_cache)
    ctas = -(-n_u4 // (threads * items))
    out = torch.empty(ctas, dtype=torch.float32, device=k_cache.device)
    kernel = _flat_kernel(threads, items, load, min_ctas)
    # torch's launcher passes Python ints as C int: the kernels' integer parameters are int
    kernel(grid=(ctas, 1, 1), block=(threads, 1, 1), args=[k_cache, v_cache, out, n_u4])
    return out
