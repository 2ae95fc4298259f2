"""The MLA decode kernels (store, split decode, merge) against a float64 evaluation of the latent
attention, under the Triton interpreter on the CPU: forced split counts (the merge, empty splits),
a padded row (seq_len 0), more heads than one program's block, the rope part passed separately
and a transposed output buffer (the layouts ``MLAAttention`` hands the kernels)."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before Triton is imported: kernels run on the CPU

import pytest  # noqa: E402
import torch  # noqa: E402

from kernels_reference.ops.mla_decode import decode as mla  # noqa: E402

RANK, ROPE, BLOCK = 32, 16, 16


def _latent_attention(q, cache, tables, seq_lens, scale):
    """float64 truth: per sequence, softmax over its cached rows of q · row, times the latent rows."""
    out = torch.zeros(q.shape[0], q.shape[1], RANK, dtype=torch.float64)
    for i, n in enumerate(seq_lens.tolist()):
        if n == 0:
            continue
        rows = cache[tables[i].long()].reshape(-1, RANK + ROPE)[:n].double()
        probs = torch.softmax(q[i].double() @ rows.T * scale, -1)
        out[i] = probs @ rows[:, :RANK]
    return out


def _case(heads, seq_lens, seed=0):
    g = torch.Generator().manual_seed(seed)
    max_blocks = max(-(-n // BLOCK) for n in seq_lens) + 1
    order = torch.randperm(len(seq_lens) * max_blocks + 3, generator=g)
    tables = order[: len(seq_lens) * max_blocks].view(len(seq_lens), max_blocks).to(torch.int32)
    cache = torch.randn(len(order), BLOCK, RANK + ROPE, generator=g)
    q = torch.randn(len(seq_lens), heads, RANK + ROPE, generator=g)
    return q, cache, tables, torch.tensor(seq_lens, dtype=torch.int32)


@pytest.mark.parametrize("splits", [1, 3, 7, 20])  # 20 > MERGE_SPLITS_CHUNK: the merge runs in steps
def test_split_decode_and_merge_match_the_definition(splits):
    q, cache, tables, lens = _case(heads=20, seq_lens=[70, 0, 17])  # 2 head blocks, one padded row
    got = mla.mla_decode(q, cache, tables, lens, 0.3, RANK, num_splits=splits)
    want = _latent_attention(q, cache, tables, lens, 0.3)
    assert float((got.double() - want).norm() / want.norm()) < 1e-5
    assert torch.all(got[1] == 0)  # the padded row


def test_separate_rope_part_and_transposed_output_buffer():
    q, cache, tables, lens = _case(heads=4, seq_lens=[40, 33])
    q_lat = q[..., :RANK].transpose(0, 1).contiguous().transpose(0, 1)  # [B, H, R] view of [H, B, R]
    out = torch.full((4, 2, RANK), float("nan")).transpose(0, 1)  # [B, H, R] view of [H, B, R]
    mla.mla_decode(q_lat, cache, tables, lens, 0.2, RANK, out=out, num_splits=4, q_pe=q[..., RANK:].clone())
    want = _latent_attention(q, cache, tables, lens, 0.2)
    assert float((out.double() - want).norm() / want.norm()) < 1e-5


def test_wrong_scale_is_caught():
    """The comparison above can fail: a kernel given another scale is far from the definition."""
    q, cache, tables, lens = _case(heads=4, seq_lens=[40])
    got = mla.mla_decode(q, cache, tables, lens, 0.25, RANK, num_splits=2)
    want = _latent_attention(q, cache, tables, lens, 0.2)
    assert float((got.double() - want).norm() / want.norm()) > 1e-2


def test_split_plan_fills_the_gpu_from_shapes():
    config = mla.MLADecodeConfig(tokens_per_iter=32, programs_per_sm=2, max_splits=128)
    # B1 C8192 on 132 SMs: 264 programs wanted, capped at 128 splits (64 tokens each)
    assert mla.mla_num_splits(1, 1, 512, 16, 132, config) == 128
    assert mla.mla_num_splits(32, 1, 128, 16, 132, config) == 8  # 264 // 32: one wave
    assert mla.mla_num_splits(256, 1, 64, 16, 132, config) == 1  # a full batch is not split
    # ... unless its block table is wide enough for one sequence to outlast the others: the peer
    # table's 139-sequence step with a 7680-token sequence gets 7 splits (8 per SM at most)
    assert mla.mla_num_splits(139, 1, 480, 16, 132, config) == 7
    assert mla.mla_num_splits(256, 1, 480, 16, 132, config) == 4
    assert mla.mla_num_splits(139, 1, 64, 16, 132, config) == 1  # 1024 tokens: one program holds them
    assert mla.mla_num_splits(1, 1, 2, 16, 132, config) == 1  # never more splits than iterations
