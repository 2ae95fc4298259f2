"""The key-span attention kernel (kernels_reference/ops/attention/key_mask.py) per tile choice, beside
SDPA's cuDNN kernel with the mask, on the masked cases of the multi_head_attention task (full
profile). Each choice is checked against cuDNN's output (relative L2 under the layer's AGREE_L2)
and timed as the mean of 200 back-to-back calls between two CUDA events, twice, the faster kept.

    python3 -m benchmarks key_mask_tiles
"""
import torch

from benchmarks.markdown import md_table
from fk_pytest.registry import get_task
from kernels_reference.L1.encoder_attention import AGREE_L2, _sdpa, split_heads
from kernels_reference.ops.attention import key_mask

TILES = [(m, n, w, s) for m, n in ((64, 64), (128, 64), (128, 32), (64, 32), (128, 128))
         for w in (4, 8) for s in (2, 3)]
CALLS = 200


def _us(fn) -> float:
    best = float("inf")
    for _ in range(2):
        fn()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(CALLS):
            fn()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) * 1e3 / CALLS)
    return best


def _launch(q, k, v, scale, mask, tile):
    """The kernel body with one fixed tile (the autotuner's configs and more)."""
    import triton
    m, n, w, s = tile
    b, sq, nq, d = q.shape
    out = torch.empty_like(q)
    flags = mask.view(torch.uint8)
    key_mask._key_mask_attention[(triton.cdiv(sq, m), b * nq)](
        q, k, v, out, flags, sq, k.shape[1], nq, nq // k.shape[2], scale * key_mask.LOG2E,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), out.stride(0), out.stride(1), out.stride(2),
        flags.stride(0), flags.stride(1), HEAD=d, HEAD_PAD=max(16, triton.next_power_of_2(d)),
        FLOAT32_DOTS=False, BLOCK_M=m, BLOCK_N=n, SCAN=min(1024, triton.next_power_of_2(k.shape[1])),
        num_warps=w, num_stages=s)
    return out


def main():
    device = torch.device("cuda")
    task = get_task("multi_head_attention")
    rows = []
    for case in task.cases("full"):
        if case["lengths"] is None or case.dtype != torch.bfloat16:
            continue
        inputs = task.make_inputs(case, torch.Generator(device=device).manual_seed(0), device)
        nq, d = case["num_heads"], case["head_size"]
        q, k, v = (split_heads(inputs[n], nq, d, leading=2) for n in ("query", "key", "value"))
        mask, scale = inputs["attention_mask"], d ** -0.5
        want = _sdpa(q, k, v, scale, mask, only_cudnn=True)
        valid = mask[..., None, None]

        def error(out):
            return float(((out.float() - want.float()) * valid).norm() / (want.float() * valid).norm())

        rows.append([case.id, "sdpa-cudnn-mask", _us(lambda: _sdpa(q, k, v, scale, mask, only_cudnn=True)), 0.0])
        rows.append([case.id, "autotuned", _us(lambda: key_mask.key_mask_attention(q, k, v, scale, mask)),
                     error(key_mask.key_mask_attention(q, k, v, scale, mask))])
        for tile in TILES:
            try:
                err = error(_launch(q, k, v, scale, mask, tile))
                us = _us(lambda: _launch(q, k, v, scale, mask, tile)) if err < AGREE_L2 else None
            except Exception as exc:  # a tile that does not fit is that row's result
                err, us = None, None
                print(f"{case.id} {tile}: {type(exc).__name__}: {str(exc)[:120]}")
            rows.append([case.id, "BLOCK_M %d BLOCK_N %d, %d warps, %d stages" % tile, us, err])
    print(md_table(["case", "kernel", "us", "rel. L2 vs cuDNN (valid rows)"], rows, ["", "", ".2f", ".4f"]))


if __name__ == "__main__":
    main()
