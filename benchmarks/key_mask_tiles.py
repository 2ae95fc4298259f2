"""The key-span attention kernel (kernels_reference/ops/attention/key_mask.py) per tile choice, beside
SDPA's cuDNN kernel with the mask and flex_attention (compiled, its key-padding block mask built
once outside the timed calls, as the task's flex peer does), on the masked cases of the multi_head_attention task (full
profile). Each choice is checked against cuDNN's output (relative L2 under the layer's AGREE_L2)
and timed with the layer's own option timer (``kernels_reference.ops.attention.fastest.graph_ms``: a
CUDA graph of five calls, replayed between two CUDA events), twice, the faster kept.

    python3 -m benchmarks key_mask_tiles
"""
import torch

from benchmarks.markdown import md_table
from fk_pytest.registry import get_task
from kernels_reference.L1.encoder_attention import _sdpa, split_heads
from kernels_reference.ops.attention.fastest import AGREE_L2, TUNE_CALLS, graph_ms
from kernels_reference.ops.attention import key_mask

TILES = [(m, n, w, s) for m, n in ((64, 64), (128, 64), (128, 32), (64, 32), (128, 128), (64, 128))
         for w in (4, 8) for s in (2, 3)]


def _us(fn) -> float:
    """Per call, the faster of two windows of the layer's own option timer (what its choice sees)."""
    fn()
    return min(graph_ms(fn) for _ in range(2)) * 1e3 / TUNE_CALLS


def _flex_call(q, k, v, scale, mask):
    """flex_attention over [B, S, heads, d] with a key-padding block mask built here, once."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    flex = torch.compile(flex_attention, dynamic=False)
    block_mask = create_block_mask(lambda b, h, qi, ki: mask[b, ki], q.shape[0], None, q.shape[1], k.shape[1],
                                   device=q.device)
    qh, kh, vh = (x.transpose(1, 2) for x in (q, k, v))

    def call():
        with torch.no_grad():
            return flex(qh, kh, vh, block_mask=block_mask, scale=scale,
                        enable_gqa=k.shape[2] != q.shape[2]).transpose(1, 2)

    return call


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
        flex = _flex_call(q, k, v, scale, mask)
        rows.append([case.id, "flex_attention (block mask built once)", _us(flex), error(flex())])
        rows.append([case.id, "autotuned", _us(lambda: key_mask.key_mask_attention(q, k, v, scale, mask)),
                     error(key_mask.key_mask_attention(q, k, v, scale, mask))])
        for tile in TILES:
            try:
                def call(tile=tile):
                    return key_mask.key_mask_attention(q, k, v, scale, mask, tile=tile)
                err = error(call())
                us = _us(call) if err < AGREE_L2 else None
            except Exception as exc:  # a tile that does not fit is that row's result
                err, us = None, None
                print(f"{case.id} {tile}: {type(exc).__name__}: {str(exc)[:120]}")
            rows.append([case.id, "BLOCK_M %d BLOCK_N %d, %d warps, %d stages" % tile, us, err])
    print(md_table(["case", "kernel", "us", "rel. L2 vs cuDNN (valid rows)"], rows, ["", "", ".2f", ".4f"]))


if __name__ == "__main__":
    main()
