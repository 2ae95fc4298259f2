"""Encoder attention (EncoderOnlyAttention over a packed batch, MultiHeadAttention over a padded
one): the native definition against torch's SDPA in float64, the layers' metadata rules, the
padded rows left unscored, and the two tasks' verdicts on the honest candidates (the example
tree's Triton kernel runs interpreted there) and on four wrong ones, each failing exactly on the
cases that can see its bug."""
import pytest
import torch
import torch.nn.functional as F

from fk_pytest import status
from fk_pytest.registry import get_task
from kernels_reference.forward_context import AttentionMetadata, set_forward_context
from kernels_reference.L1.encoder_attention import (EncoderOnlyAttention, MultiHeadAttention, compact_keys,
                                                    padded_attention_native, valid_keys_first)

from conftest import EXAMPLES, ROOT
from test_verdicts import assert_fails_exactly, assert_passes_every_case, verdicts


def _sdpa(q, k, v, scale, mask=None):
    """[B, L, heads, d] through torch's SDPA (no causal mask), GQA by its enable_gqa."""
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                         attn_mask=None if mask is None else mask[:, None, None, :], scale=scale,
                                         enable_gqa=k.shape[2] != q.shape[2])
    return out.transpose(1, 2)


@pytest.mark.parametrize("num_heads, num_kv_heads, head_size", [(12, 12, 32), (8, 2, 72)])
def test_packed_native_is_sdpa_per_sequence_in_float64(num_heads, num_kv_heads, head_size):
    gen = torch.Generator().manual_seed(head_size)
    lengths = [7, 1, 20, 4]
    t, scale = sum(lengths), 0.7 * head_size ** -0.5  # a custom scale must be the one used
    q = torch.randn(t, num_heads * head_size, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(t, num_kv_heads * head_size, generator=gen, dtype=torch.float64) for _ in range(2))
    layer = EncoderOnlyAttention(num_heads, head_size, scale, num_kv_heads)
    with set_forward_context(AttentionMetadata.build([0] * len(lengths), lengths, block_size=16)):
        out = layer(q, k, v)
    want, first = [], 0
    for n in lengths:
        rows = slice(first, first + n)
        want.append(_sdpa(q[None, rows].unflatten(-1, (num_heads, head_size)),
                          k[None, rows].unflatten(-1, (num_kv_heads, head_size)),
                          v[None, rows].unflatten(-1, (num_kv_heads, head_size)), scale)[0].flatten(-2))
        first += n
    torch.testing.assert_close(out, torch.cat(want), rtol=1e-12, atol=1e-12)
    # no metadata: the whole batch is one sequence
    whole = _sdpa(*(x[None].unflatten(-1, (-1, head_size)) for x in (q, k, v)), scale)[0].flatten(-2)
    torch.testing.assert_close(layer(q, k, v), whole, rtol=1e-12, atol=1e-12)


def test_packed_layer_has_no_cache():
    layer = EncoderOnlyAttention(2, 16, 0.25)
    x = torch.randn(5, 32)
    with set_forward_context(AttentionMetadata.build([3], [5], block_size=16)), \
            pytest.raises(ValueError, match="no KV cache"):
        layer(x, x, x)


def test_compiled_packed_layer_is_one_op_and_lengths_are_no_guards():
    """Under torch.compile the packed layer is one opaque op reading its host lengths from the
    forward context: new lengths (same token and sequence counts) reuse the graph."""
    torch._dynamo.reset()
    graphs = []

    def recording_backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    layer = EncoderOnlyAttention(4, 16, 0.25)
    compiled = torch.compile(layer, fullgraph=True, backend=recording_backend, dynamic=False)
    x = torch.randn(10, 64, generator=torch.Generator().manual_seed(0))
    for lengths in ([3, 7], [5, 5], [1, 9]):
        with set_forward_context(AttentionMetadata.build([0, 0], lengths, block_size=16)):
            torch.testing.assert_close(compiled(x, x, x), layer.forward_native(x, x, x), rtol=0, atol=0)
    assert len(graphs) == 1
    targets = [str(n.target) for n in graphs[0].graph.nodes if n.op == "call_function"]
    assert targets == ["fk.encoder_only_attention.default"]


@pytest.mark.parametrize("masked", [False, True], ids=["images", "padded-sentences"])
def test_padded_native_is_sdpa_in_float64(masked):
    """Every row, padded query rows too, is SDPA's (they attend to their entry's real keys)."""
    gen = torch.Generator().manual_seed(3)
    b, s, heads, d = 3, 11, 6, 64
    q, k, v = (torch.randn(b, s, heads * d, generator=gen, dtype=torch.float64) for _ in range(3))
    mask = torch.arange(s)[None, :] < torch.tensor([11, 5, 1])[:, None] if masked else None
    layer = MultiHeadAttention(heads, d, d ** -0.5)
    want = _sdpa(*(x.unflatten(-1, (heads, d)) for x in (q, k, v)), d ** -0.5, mask).flatten(-2)
    torch.testing.assert_close(layer(q, k, v, mask), want, rtol=1e-12, atol=1e-12)
    # [B, S, heads, d] inputs, as vLLM's layer also takes them
    torch.testing.assert_close(layer(*(x.unflatten(-1, (heads, d)) for x in (q, k, v)), attention_mask=mask),
                               want, rtol=1e-12, atol=1e-12)


TASKS = ("encoder_only_attention", "multi_head_attention")


class ZeroPaddedRows(MultiHeadAttention):
    """The definition with padded query rows written as zeros (an unpad-attend-pad kernel's output)."""

    def forward(self, query, key, value, attention_mask=None):
        out = self.forward_native(query, key, value, attention_mask)
        return out if attention_mask is None else out * attention_mask[..., None]


def test_valid_keys_first_then_attention_over_the_count_is_the_masked_attention():
    """The CUDA path for a masked padded batch moves each entry's valid keys to its front and attends
    over that many (FlashAttention's seqused_k): the same attention, for any mask (right-padded,
    left-padded, holes), since attention does not depend on the order of the keys."""
    gen = torch.Generator().manual_seed(5)
    mask = torch.tensor([[1, 1, 1, 0, 0, 0], [0, 0, 1, 1, 1, 1], [1, 0, 1, 0, 0, 1], [1, 1, 1, 1, 1, 1]], dtype=torch.bool)
    q, k, v = (torch.randn(4, 6, 2, 8, generator=gen, dtype=torch.float64) for _ in range(3))
    order, counts = valid_keys_first(mask)
    assert counts.tolist() == [3, 4, 3, 6]
    assert order.tolist() == [[0, 1, 2, 3, 4, 5], [2, 3, 4, 5, 0, 1], [0, 2, 5, 1, 3, 4], [0, 1, 2, 3, 4, 5]]
    kc, vc = compact_keys(k, order), compact_keys(v, order)
    got = torch.stack([F.scaled_dot_product_attention(*(x[b, :n if x is not q else None].transpose(0, 1)
                                                         for x in (q, kc, vc)), scale=0.3).transpose(0, 1)
                       for b, n in enumerate(counts.tolist())])
    torch.testing.assert_close(got, padded_attention_native(q, k, v, 0.3, mask), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype, num_heads, num_kv_heads, head_size, seq, block",
                         [(torch.float32, 4, 2, 32, 40, 64), (torch.bfloat16, 3, 3, 72, 70, 64),
                          (torch.float32, 2, 1, 16, 150, 16)])
def test_key_span_kernel_is_the_masked_attention_for_any_mask(monkeypatch, dtype, num_heads, num_kv_heads,
                                                             head_size, seq, block):
    """The Triton kernel of the CUDA path's masked option sweeps each entry's keys from its first to
    its last valid one (interpreted here): equal to the float64 definition for right-padded,
    left-padded and holed masks and an unpadded entry, with GQA, a head size that is no power of
    two and (16-token tiles) spans that start and end inside a tile; the query rows of the padded
    positions included."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    from kernels_reference.ops.attention import key_mask
    monkeypatch.setattr(key_mask, "INTERPRETER_BLOCK", block)
    gen = torch.Generator().manual_seed(seq)
    q = torch.randn(4, seq, num_heads, head_size, generator=gen).to(dtype)
    k, v = (torch.randn(4, seq, num_kv_heads, head_size, generator=gen).to(dtype) for _ in range(2))
    mask = torch.zeros(4, seq, dtype=torch.bool)
    mask[0, :seq // 2] = True  # right-padded
    mask[1, seq - 23:] = True  # left-padded
    mask[2, 5:seq - 3] = True  # both, with a hole
    mask[2, 17:29] = False
    mask[3] = True
    got = key_mask.key_mask_attention(q, k, v, 0.3, mask)
    want = padded_attention_native(*(x.double() for x in (q, k, v)), 0.3, mask)
    error = ((got.double() - want).norm() / want.norm()).item()
    assert error < (1e-6 if dtype == torch.float32 else 8e-3), error
    with pytest.raises(ValueError, match="key_mask must be bool"):
        key_mask.key_mask_attention(q, k, v, 0.3, mask.to(torch.int8))


def test_the_faster_kernel_is_kept_only_if_it_computes_the_same_attention():
    """The CUDA path's choice between kernels (``ops.attention.fastest.time_options``): an option that raises or
    whose output is not the first option's is dropped, however fast; of the rest the faster wins."""
    from kernels_reference.ops.attention import fastest

    out = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))

    def broken():
        raise RuntimeError("no kernel for this shape")

    options = {"established": lambda: out, "wrong": lambda: out * 1.5, "raises": broken,
               "rounded": lambda: out + 1e-4}
    fake_ms = {id(options["established"]): 3.0, id(options["wrong"]): 0.1, id(options["rounded"]): 1.0}
    with pytest.warns(UserWarning, match="wrong kernel's output differs"):
        times = fastest.time_options(options, timer=lambda call: fake_ms[id(call)])
    assert times["wrong"] == times["raises"] == float("inf")
    assert min(times, key=times.get) == "rounded"
    with pytest.raises(RuntimeError, match="no kernel"):
        fastest.time_options({"raises": broken}, timer=lambda call: 0.0)


def test_padded_query_rows_are_not_scored():
    """Padded query rows may hold any finite value: zeros there pass the padded cases."""
    padded = [c for c in get_task("multi_head_attention").cases("cpu") if c["lengths"] is not None]
    counts, results = verdicts("multi_head_attention", ZeroPaddedRows, padded)
    assert padded and counts == {status.PASSED: len(padded)}, [r.message for r in results]


@pytest.mark.parametrize("task_name", TASKS)
@pytest.mark.parametrize("tree", [EXAMPLES, ROOT / "kernels_reference"], ids=["examples-triton", "reference-tree"])
def test_honest_candidates_pass_every_case(tree, task_name):
    assert_passes_every_case(task_name, tree)


@pytest.mark.parametrize("tree, task_name, failing", [
    # every case has a sequence of several tokens, whose first tokens then miss the rest
    ("enc_attn_causal", "encoder_only_attention", lambda c: True),
    ("enc_attn_causal", "multi_head_attention", lambda c: True),
    # a single packed sequence has no neighbour to leak into
    ("enc_attn_across_sequences", "encoder_only_attention", lambda c: len(c["lengths"]) > 1),
    # images carry no mask; only padded sentences have padding to attend to
    ("enc_attn_mask_ignored", "multi_head_attention", lambda c: c["lengths"] is not None),
    # a softmax sqrt(d) times flatter moves every output
    ("enc_attn_scale_1_over_d", "encoder_only_attention", lambda c: True),
    ("enc_attn_scale_1_over_d", "multi_head_attention", lambda c: True),
], ids=["causal-packed", "causal-padded", "across-sequences", "mask-ignored", "scale-packed", "scale-padded"])
def test_wrong_candidates_fail_exactly_where_expected(tree, task_name, failing):
    some_pass = tree in ("enc_attn_across_sequences", "enc_attn_mask_ignored")
    assert_fails_exactly(task_name, tree, failing, some_pass=some_pass)
