"""Every reference module runs under ``torch.compile(fullgraph=True)``, as production compiles them.

vLLM compiles the model body with Dynamo and Inductor: the custom kernels' native paths are traced
(Inductor fuses them with their neighbours) and attention is an opaque custom op. A graph break in
any reference module would make that impossible, so each task's reference is compiled with
``fullgraph=True`` on its first and last CPU case and must agree with its eager self. ``aot_eager`` runs the
same Dynamo capture and AOT tracing (fake tensors, the custom ops' fake implementations) as
Inductor without its C++ code generation, which keeps this test fast; one Inductor run checks the
code generation path too. CUDA-graph capture is checked on the GPU (benchmarks/compile_graphs.py).
"""
import pytest
import torch

from fk_pytest.build import clone_inputs, instantiate, master_state
from fk_pytest.registry import all_tasks

TASKS = sorted(all_tasks())


def _outputs(out):
    return [out] if isinstance(out, torch.Tensor) else [o for o in out if isinstance(o, torch.Tensor)]


def _run(task, case, backend):
    torch._dynamo.reset()
    state = master_state(task, case, seed=0)
    module = instantiate(task.reference, task, case, state, "cpu", case.dtype)
    inputs = task.make_inputs(case, torch.Generator().manual_seed(1), torch.device("cpu"))
    with torch.no_grad():
        eager = [o.clone() for o in _outputs(task.call(module, clone_inputs(inputs)))]
        module.forward = torch.compile(module.forward, fullgraph=True, backend=backend)
        compiled = _outputs(task.call(module, clone_inputs(inputs)))
    assert len(compiled) == len(eager)
    for a, b in zip(compiled, eager):
        assert a.shape == b.shape and a.dtype == b.dtype
        torch.testing.assert_close(a.float(), b.float(), rtol=2e-2, atol=2e-2)


# Layers whose native paths plan their work on the host (the MoE expert loop, paged attention, the
# linear-attention recurrences and conv windows, which read cu_seqlens / slots) are opaque custom
# ops under compile, as vLLM makes them, so every task compiles in one graph.
# A task with one CPU case compiles it once ("first").
COMPILED = [(name, which) for name in TASKS for which in ("first", "last")
            if which == "first" or len(all_tasks()[name].cases("cpu")) > 1]


@pytest.mark.parametrize("name, which", COMPILED)
def test_reference_compiles_with_fullgraph(name, which):
    cases = all_tasks()[name].cases("cpu")  # decode-sized first, prefill/chunked last
    _run(all_tasks()[name], cases[0] if which == "first" else cases[-1], backend="aot_eager")


def test_inductor_codegen_on_fused_rms_norm():
    task = all_tasks()["rms_norm"]
    case = next(c for c in task.cases("cpu") if c["variant"] == "fused-add")
    _run(task, case, backend="inductor")


# ---- the opaque ops of the layers whose work cannot be traced ------------------------------------

def _recording_backend(graphs):
    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward
    return backend


def _op_targets(graphs):
    return [str(n.target) for gm in graphs for n in gm.graph.nodes if n.op == "call_function"]


def test_compiled_fused_moe_is_one_op_and_routing_values_are_no_guards():
    """The expert loop reads the routing on the host; under compile it lives in ``fk::fused_moe``,
    so new router values (other experts chosen) reuse the graph and the result is the eager one."""
    from kernels_reference.L1.fused_moe import FusedMoE

    torch._dynamo.reset()
    gen = torch.Generator().manual_seed(0)
    layer = FusedMoE(num_experts=6, top_k=2, hidden_size=16, intermediate_size=8)
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    graphs = []
    compiled = torch.compile(layer, fullgraph=True, backend=_recording_backend(graphs))
    for seed in range(2):
        gen.manual_seed(seed + 1)
        x, logits = torch.randn(5, 16, generator=gen), torch.randn(5, 6, generator=gen) * 3
        with torch.no_grad():
            torch.testing.assert_close(compiled(x, logits), layer(x, logits))
    assert len(graphs) == 1
    assert sum("fused_moe" in t for t in _op_targets(graphs)) == 1


def test_compiled_mla_is_one_op_that_stores_the_latent_cache():
    """``fk::mla_attention``: the cache store is a declared mutation (the compiled step leaves the
    cache as the eager one does) and new metadata values (lengths, block tables) reuse the graph."""
    from kernels_reference.L1.mla_attention import MLAAttention
    from kernels_reference.forward_context import AttentionMetadata, set_forward_context

    torch._dynamo.reset()
    heads, nope, rope, v, rank, block = 2, 8, 4, 8, 16, 4
    gen = torch.Generator().manual_seed(0)
    layer = MLAAttention(heads, 0.3, nope, rope, v, rank)
    with torch.no_grad():
        layer.kv_b_proj.weight.copy_(torch.randn(layer.kv_b_proj.weight.shape, generator=gen) * 0.3)
    graphs = []
    compiled = torch.compile(layer, fullgraph=True, backend=_recording_backend(graphs))
    # the same shapes (3 + 2 tokens, 2 blocks a table), other lengths and block tables
    for context, tables in (([5, 0], None), ([4, 1], [[5, 2], [7]])):
        meta = AttentionMetadata.build(context, [3, 2], block, block_tables=tables)
        t = 5
        q = torch.randn(t, heads * (nope + rope), generator=gen)
        kv_c, k_pe = torch.randn(t, rank, generator=gen), torch.randn(t, rope, generator=gen)
        cache = torch.randn(8, block, rank + rope, generator=gen)
        results = []
        for fn in (layer.forward_native, compiled):
            layer.kv_cache = cache.clone()
            with set_forward_context(meta), torch.no_grad():
                results.append((fn(q, kv_c, k_pe), layer.kv_cache))
        (want, want_cache), (got, got_cache) = results
        torch.testing.assert_close(got, want)
        assert not torch.equal(want_cache, cache) and torch.equal(got_cache, want_cache)
    assert len(graphs) == 1
    assert sum("mla_attention" in t for t in _op_targets(graphs)) == 1


def test_ops_declare_their_mutations_and_fake_shapes():
    """``opcheck``: the schema names every mutated input (the latent cache) and nothing else, and
    the fake implementations give the real outputs' shapes, which Inductor relies on."""
    from kernels_reference.L1.fused_moe import fused_moe
    from kernels_reference.L1.mla_attention import mla_attention
    from kernels_reference.forward_context import AttentionMetadata

    gen = torch.Generator().manual_seed(0)
    moe_args = (torch.randn(3, 16, generator=gen), torch.randn(3, 6, generator=gen),
                torch.randn(6, 16, 16, generator=gen), torch.randn(6, 16, 8, generator=gen), 2, True)
    torch.library.opcheck(fused_moe, moe_args, test_utils=("test_schema", "test_faketensor"))
    heads, nope, rope, v, rank = 2, 8, 4, 8, 16
    meta = AttentionMetadata.build([5, 0], [3, 2], 4)  # no forward context: the op derives host lengths
    mla_args = (torch.randn(5, heads * (nope + rope), generator=gen), torch.randn(5, rank, generator=gen),
                torch.randn(5, rope, generator=gen), torch.randn(8, 4, rank + rope, generator=gen),
                torch.randn(heads * (nope + v), rank, generator=gen), meta.query_start_loc, meta.seq_lens,
                meta.block_tables, meta.slot_mapping, heads, 0.3, nope, rope, v, rank)
    torch.library.opcheck(mla_attention, mla_args, test_utils=("test_schema", "test_faketensor"))
    # the linear-attention ops: the conv and the state update name their pools as mutated
    from kernels_reference.L1.gated_delta_rule import gated_delta_rule
    from kernels_reference.L1.gla import chunk_gla
    from kernels_reference.L1.mamba_chunk_scan import mamba_chunk_scan_combined
    from kernels_reference.L1.selective_state_update import selective_state_update_op
    from kernels_reference.L1.short_convolution import short_convolution

    cu = torch.tensor([0, 1, 4, 6], dtype=torch.int32)  # three sequences, 6 tokens
    slots, fresh = torch.tensor([4, 0, 2], dtype=torch.int32), torch.tensor([True, False, True])
    for args in ((torch.randn(6, 8, generator=gen), torch.randn(5, 3, 8, generator=gen),
                  torch.randn(8, 1, 4, generator=gen), torch.randn(8, generator=gen), cu, slots, fresh, "silu"),
                 (torch.randn(3, 8, generator=gen), torch.randn(5, 3, 8, generator=gen),
                  torch.randn(8, 1, 4, generator=gen), None, None, slots, None, None)):
        torch.library.opcheck(short_convolution, args, test_utils=("test_schema", "test_faketensor"))
    q, k = torch.randn(1, 6, 2, 8, generator=gen), torch.randn(1, 6, 2, 8, generator=gen)
    v, g = torch.randn(1, 6, 4, 8, generator=gen), -torch.rand(1, 6, 4, generator=gen)
    beta, h0 = torch.rand(1, 6, 4, generator=gen), torch.randn(3, 4, 8, 8, generator=gen)
    for final in (True, False):
        torch.library.opcheck(gated_delta_rule, (q, k, v, g, beta, None, h0, final, True, cu),
                              test_utils=("test_schema", "test_faketensor"))
    qg, kg, vg = (torch.randn(2, 3, 2, 8, generator=gen) for _ in range(3))
    for final in (True, False):
        torch.library.opcheck(chunk_gla, (qg, kg, vg, -torch.rand(2, 3, 2, 8, generator=gen), 0.5, None, final, None),
                              test_utils=("test_schema", "test_faketensor"))
    heads, p, n = 4, 8, 16
    x, dt = torch.randn(6, heads, p, generator=gen), torch.randn(6, heads, generator=gen)
    a, bc = -torch.rand(heads, generator=gen), torch.randn(6, 2, n, generator=gen)
    torch.library.opcheck(mamba_chunk_scan_combined,
                          (x, dt, a, bc, bc.flip(0), cu, torch.randn(heads, generator=gen), None,
                           torch.randn(heads, generator=gen), torch.randn(3, heads, p, n, generator=gen), None, 16,
                           True, [0.0, float("inf")]), test_utils=("test_schema", "test_faketensor"))
    state = torch.randn(5, heads, p, n, generator=gen)
    torch.library.opcheck(selective_state_update_op,
                          (state, x[:3], dt[:3, :, None].expand(-1, -1, p), a[:, None, None].expand(-1, p, n),
                           bc[:3], bc[3:], None, torch.randn(3, heads, p, generator=gen), None, slots, True),
                          test_utils=("test_schema", "test_faketensor"))


def _mixer2():
    from kernels_reference.L2.mamba_mixer2 import MambaMixer2

    block = MambaMixer2(hidden_size=16, ssm_state_size=8, conv_kernel_size=4, intermediate_size=32, use_conv_bias=True,
                        use_bias=False, n_groups=2, num_heads=4, head_dim=8, chunk_size=16)
    return block, (torch.randn(5, 3, block.conv_dim), torch.randn(5, 4, 8, 8))


def _gated_delta_net():
    from kernels_reference.L2.qwen3_next_gated_delta_net import Qwen3NextGatedDeltaNet

    block = Qwen3NextGatedDeltaNet(hidden_size=16, num_k_heads=2, num_v_heads=4, head_k_dim=8, head_v_dim=8)
    return block, (torch.randn(5, 3, block.conv_dim), torch.randn(5, 4, 8, 8))


@pytest.mark.parametrize("make", [_mixer2, _gated_delta_net], ids=["mamba_mixer2", "qwen3_next_gated_delta_net"])
def test_compiled_state_blocks_update_their_pools_as_eager(make):
    """The linear-attention blocks compile to graphs of opaque ops whose pool updates are declared
    mutations: over prefill, mixed and decode steps the compiled block leaves both pools, and gives
    the outputs, that the eager block does."""
    from kernels_reference.forward_context import AttentionMetadata, set_forward_context

    torch._dynamo.reset()
    torch.manual_seed(0)
    block, pools = make()
    with torch.no_grad():
        for prm in block.parameters():
            prm.copy_(torch.randn(prm.shape) * 0.3)
    graphs = []
    compiled = torch.compile(block.forward, fullgraph=True, backend=_recording_backend(graphs))
    eager_pools, compiled_pools = [p.clone() for p in pools], [p.clone() for p in pools]
    # (context, new tokens, slot) per sequence: fresh prompts, then a decode beside a continued
    # prompt and a fresh one, then decodes only
    for step in (((0, 5, 3), (0, 7, 1)), ((5, 1, 3), (7, 3, 1), (0, 4, 0)), ((6, 1, 3), (10, 1, 1), (4, 1, 0))):
        context, counts, slots = zip(*step)
        meta = AttentionMetadata.build(list(context), list(counts), 16, state_slots=list(slots))
        x = torch.randn(sum(counts), 16)
        results = []
        for fn, bound in ((block.forward, eager_pools), (compiled, compiled_pools)):
            block.state_cache = tuple(bound)
            with set_forward_context(meta), torch.no_grad():
                results.append(fn(x))
        torch.testing.assert_close(results[1], results[0])
        for got, want in zip(compiled_pools, eager_pools):
            torch.testing.assert_close(got, want)
    assert not torch.equal(eager_pools[1], pools[1])
    targets = " ".join(_op_targets(graphs))
    assert "fk.short_convolution" in targets
    assert ("fk.mamba_chunk_scan_combined" in targets and "fk.selective_state_update" in targets
            if make is _mixer2 else "fk.gated_delta_rule" in targets)
