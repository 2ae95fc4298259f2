"""Mixture-of-experts: the tasks' verdicts on honest and wrong candidates, the reference's Triton
path (interpreted on the CPU) against its native definition, and the align step's freedom from
host syncs (what makes the layer CUDA-graph capturable)."""
import ast
import copy
import importlib
import inspect
import re
import textwrap

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from fk_pytest import status
from fk_pytest.compare import output_error
from fk_pytest.registry import _suite_package, get_task
from kernels_reference.L1.fused_moe import FusedMoE
from kernels_reference.L1.topk_softmax import TopKSoftmax

from conftest import CANDIDATES, EXAMPLES, ROOT
from test_verdicts import assert_passes_every_case, load, verdicts

pytest.importorskip("triton")
# the suite's MoE helpers, from wherever the registry finds the suite (checkout or installed fk_tasks)
_moe = importlib.import_module(_suite_package().__name__ + ".moe_inputs")
MOE_MODELS, check_tie_free, moe_shape = _moe.MOE_MODELS, _moe.check_tie_free, _moe.moe_shape
router_logits, tie_margin = _moe.router_logits, _moe.tie_margin


# ---- verdicts through the real machinery -----------------------------------------------------------
@pytest.mark.parametrize("task_name", ["fused_moe", "topk_softmax"])
@pytest.mark.parametrize("tree", [EXAMPLES, CANDIDATES / "moe_honest", ROOT / "kernels_reference"],
                         ids=["examples", "honest-dense", "reference-tree"])
def test_honest_moe_candidates_pass(task_name, tree):
    assert_passes_every_case(task_name, tree)


@pytest.mark.parametrize("tree, task_name, output, failing_models", [
    ("moe_no_renorm", "fused_moe", "out", {"mixtral-8x7b", "qwen3-30b-a3b"}),
    ("moe_no_renorm", "topk_softmax", "topk_weights", {"mixtral-8x7b", "qwen3-30b-a3b"}),
    ("moe_weight_before_act", "fused_moe", "out", set(MOE_MODELS)),
    ("moe_swapped_halves", "fused_moe", "out", set(MOE_MODELS)),
    ("topk_ascending_ids", "topk_softmax", "topk_ids", set(MOE_MODELS)),
])
def test_wrong_moe_candidates_fail(tree, task_name, output, failing_models):
    """Each bug fails with WRONG_RESULT naming the wrong output, on exactly the models it breaks
    (no renormalisation is right for DeepSeek-V2, which does not renormalise)."""
    counts, results = verdicts(task_name, load(CANDIDATES / tree, task_name))
    failing = [r for r in results if not r.passed]
    assert {r.status for r in failing} == {status.WRONG_RESULT}, counts
    assert all(f"output {output!r}" in r.message for r in failing), failing[0].message
    assert {r.case_id.split("-decode")[0].split("-prefill")[0] for r in failing} == failing_models
    # ... and on every case of those models with several tokens: the checks are not marginal (at T=1
    # a bug may be invisible by luck: k ids already in ascending order)
    several = [r for r in results if any(r.case_id.startswith(m) for m in failing_models) and "-T1-" not in r.case_id]
    assert several and all(not r.passed for r in several), [r.case_id for r in several if r.passed]


# ---- router logits ---------------------------------------------------------------------------------
@pytest.mark.parametrize("model", MOE_MODELS)
def test_router_logits_tie_free_and_skewed(model):
    shape = moe_shape(model)
    gen = torch.Generator().manual_seed(3)
    logits = router_logits(2048, shape.num_experts, shape.top_k, gen, "cpu", torch.bfloat16)
    # k+1 largest apart by at least 2 bf16 rounding units at the logits' magnitude, as stored
    scale = float(logits.float().abs().max())
    assert check_tie_free(logits, shape.top_k) >= tie_margin(torch.bfloat16, scale) / 2
    # skewed: the busiest expert gets well over the mean share of the pairs
    counts = torch.bincount(logits.float().topk(shape.top_k, dim=-1).indices.flatten(), minlength=shape.num_experts)
    assert counts.max() > 2 * counts.float().mean(), counts


# ---- the Triton paths against native ---------------------------------------------------------------
def _moe(e, k, h, i, renorm, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    m = FusedMoE(e, k, h, i, renorm)
    with torch.no_grad():
        m.w13_weight.copy_(torch.randn(m.w13_weight.shape, generator=g) * h ** -0.5)
        m.w2_weight.copy_(torch.randn(m.w2_weight.shape, generator=g) * i ** -0.5)
    return m.to(dtype), g


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("e, k, h, i, t, renorm", [
    (8, 2, 64, 32, 1, True),      # one token: k single-row tiles
    (16, 4, 48, 40, 9, False),    # partial K tiles in both GEMMs
    (64, 6, 32, 16, 33, False),   # many experts, most of them idle
    (8, 2, 128, 64, 40, True),    # more rows per expert than one 16-row tile
])
def test_fused_moe_triton_matches_native(dtype, e, k, h, i, t, renorm):
    m, g = _moe(e, k, h, i, renorm, dtype)
    x = (torch.randn(t, h, generator=g)).to(dtype)
    logits = router_logits(t, e, k, g, "cpu", dtype)
    logits[:, 1] = -30.0  # expert 1 gets no token at all
    with torch.no_grad():
        native, fast = m.forward_native(x, logits), m.forward_triton(x, logits)
        truth = copy.deepcopy(m).double().forward_native(x.double(), logits.double())
    assert fast.shape == native.shape and fast.dtype == native.dtype
    # bf16: the interpreter truncates where the GPU rounds, and the k expert outputs are rounded to
    # bf16 before their sum (as production does): a few times native's error, not more
    limit = 1.5 if dtype == torch.float32 else 4.0
    err = output_error("out", truth, [native], fast, dtype, truncating=True)
    assert err.ratio <= limit and err.elem_ratio <= 2 * limit, err


@pytest.mark.parametrize("e, k, renorm, t", [(8, 2, True, 1), (128, 8, True, 37), (64, 6, False, 70), (5, 4, False, 3)])
def test_topk_softmax_triton_matches_native(e, k, renorm, t):
    g = torch.Generator().manual_seed(1)
    logits = router_logits(t, e, k, g, "cpu", torch.bfloat16)
    m = TopKSoftmax(k, renorm)
    (w_ref, id_ref), (w, ids) = m.forward_native(logits), m.forward_triton(logits)
    assert ids.dtype == torch.int32 and w.dtype == torch.float32
    assert torch.equal(ids, id_ref)
    torch.testing.assert_close(w, w_ref, rtol=1e-5, atol=1e-7)
    # strided rows (a view of a wider buffer) read the same
    wide = torch.full((t, e + 7), -100.0, dtype=logits.dtype)
    wide[:, :e] = logits
    assert torch.equal(m.forward_triton(wide[:, :e])[1], id_ref)


# ---- the align step: sorted, padded, no host sync ----------------------------------------------------
def test_align_groups_pairs_by_expert_in_padded_tiles():
    from kernels_reference.ops.moe.kernels import align_to_blocks

    ids = torch.tensor([[3, 0], [3, 1], [0, 3], [3, 2], [3, 0]], dtype=torch.int32)
    a = align_to_blocks(ids, num_experts=6, block_m=4)
    n_pairs, flat = ids.numel(), ids.flatten()
    rows = int(a.padded_rows)
    assert rows == 4 * (1 + 1 + 1 + 2)  # experts 0, 1, 2 one tile each, expert 3 (5 pairs) two
    used = a.sorted_pairs[:rows]
    real = used[used < n_pairs]
    assert sorted(real.tolist()) == list(range(n_pairs))  # every pair exactly once
    assert (a.sorted_pairs[rows:] == n_pairs).all()  # worst-case slack is padding
    for tile in range(rows // 4):
        pairs = used[4 * tile: 4 * tile + 4]
        pairs = pairs[pairs < n_pairs]
        assert len(pairs) and (flat[pairs.long()] == a.block_expert[tile]).all()


@pytest.mark.parametrize("e, k, t, block_m", [
    (8, 2, 1, 16),      # one decode token: one launch
    (128, 8, 37, 16),   # Qwen3-like: 296 pairs in 5 chunks of 64 (count kernel + place kernel)
    (64, 6, 200, 64),   # many chunks, 64-row tiles
    (3, 1, 50, 16),     # fewer experts than a power of two, one slot
])
def test_triton_align_equals_the_torch_definition(e, k, t, block_m):
    """The Triton align kernels give exactly the torch-op alignment: the same stable order (pair order
    within an expert), padding, tile experts and padded length, single- and multi-chunk."""
    from kernels_reference.ops.moe import kernels as mk

    g = torch.Generator().manual_seed(t)
    ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)]).int()
    ids[ids == 1] = 0 if k == 1 else ids[ids == 1]  # with one slot, expert 1 stays idle
    got, want = mk.align_to_blocks(ids, e, block_m), mk.align_to_blocks_torch(ids, e, block_m)
    assert (mk.align_chunk(e) < t * k) == (t * k > 64 and e == 128 or t * k > 128 and e == 64)
    for name in ("sorted_pairs", "block_expert", "padded_rows"):
        assert torch.equal(getattr(got, name), getattr(want, name)), name


@pytest.mark.parametrize("split_k", [2, 3])
def test_split_k_down_gemm_matches_the_whole_k(split_k):
    """The down GEMM split over K (float32 partials summed with the k slots) computes the layer; a
    slice count that leaves the last slice short (3 over 5 K steps) too. Forced through the same
    override the GPU sweep uses."""
    from kernels_reference.ops.moe import kernels as mk

    m, g = _moe(4, 2, 48, 80, True, torch.float32)
    x, logits = torch.randn(9, 48, generator=g), router_logits(9, 4, 2, g, "cpu", torch.float32)
    with torch.no_grad():
        native = m.forward_native(x, logits)
        # 5 K steps of 16 in the down GEMM: 3 + 2 (split 2), 2 + 2 + 1 (split 3)
        with mk.override_configs(gate_up=mk.GemmConfig(128, 32), down=mk.GemmConfig(64, 16, split_k=split_k)):
            split = m.forward_triton(x, logits)
        whole = m.forward_triton(x, logits)
    torch.testing.assert_close(split, native, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(whole, native, rtol=1e-5, atol=1e-5)
    assert mk._OVERRIDES == {}  # the block restored the defaults
    with pytest.raises(ValueError, match="split_k"):
        mk.grouped_gemm(x, m.w2_weight, torch.empty(18, 48), mk.align_to_blocks(torch.zeros(9, 2).int(), 4, 16),
                        1, config=mk.GemmConfig(16, 16, split_k=2))


def test_decode_split_k_heuristic_fills_the_sms(monkeypatch):
    """At Mixtral T1 the down GEMM's 2 experts x 64 N tiles leave a 132-SM GPU half idle: split K 4
    ways; Qwen3 T1 (8 experts, K=768) splits 2 ways; a prefill-sized call autotunes (None)."""
    from kernels_reference.ops.moe import kernels as mk

    monkeypatch.setattr(mk, "autotune_here", lambda t: True)
    monkeypatch.setattr(mk, "sm_count", lambda i: 132)
    a = torch.empty(1, 1)
    assert mk.gemm_config("down", 2, 8, 4096, 14336, a).split_k == 4
    assert mk.gemm_config("down", 8, 128, 2048, 768, a).split_k == 2
    assert mk.gemm_config("gate_up", 2, 8, 28672, 4096, a).split_k == 1
    assert mk.gemm_config("down", 8 * 1024, 8, 4096, 14336, a) is None


# ---- the small-batch GEMV path -------------------------------------------------------------------------
def _launched(monkeypatch):
    """The names of the moe_kernels launches of the calls that follow (which path ran)."""
    from kernels_reference.ops.moe import kernels as mk

    names, launch = [], mk._launch

    def record(kernel, grid, *args, **kwargs):
        names.append(getattr(kernel, "__name__", None) or kernel.fn.__name__)
        return launch(kernel, grid, *args, **kwargs)
    monkeypatch.setattr(mk, "_launch", record)
    return names


_TAIL_CONFIGS = ({"gemv_gate_up": (32, 32), "gemv_down": (32, 16)},  # wrapped N blocks, partial K steps
                 {"gemv_gate_up": (16, 256), "gemv_down": (4, 256)})  # the H200 tile shapes


_GROUPED_OUTPUTS = {}  # test_gemv_path_matches_native_and_grouped's grouped-path outputs


@pytest.mark.parametrize("config", [None, *_TAIL_CONFIGS], ids=["default", "tails", "gpu-tiles"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("e, k, h, i, t, renorm", [
    (8, 2, 64, 32, 1, True),     # Mixtral-like routing, one token
    (8, 2, 64, 32, 4, True),     # the largest token count that takes the path
    (16, 4, 48, 40, 2, False),   # K and N not multiples of the tiles
    (16, 4, 64, 32, 3, True),
])
def test_gemv_path_matches_native_and_grouped(monkeypatch, config, dtype, e, k, h, i, t, renorm):
    """Up to GEMV_MAX_TOKENS tokens forward_triton runs the two GEMV kernels (no align, no grouped
    GEMM, no sum_slots) and computes the layer: against the float64 truth as the grouped path is
    held, and close to the grouped path itself (same routing, same gate_up rounding)."""
    from kernels_reference.ops.moe import kernels as mk

    m, g = _moe(e, k, h, i, renorm, dtype, seed=t)
    x = torch.randn(t, h, generator=g).to(dtype)
    logits = router_logits(t, e, k, g, "cpu", dtype)
    over = {name: mk.GemvConfig(*tile) for name, tile in (config or {}).items()}
    names = _launched(monkeypatch)
    with torch.no_grad():
        native = m.forward_native(x, logits)
        truth = copy.deepcopy(m).double().forward_native(x.double(), logits.double())
        with mk.override_configs(**over):
            fast = m.forward_triton(x, logits)
        assert names == ["_gemv_gate_up_kernel", "_gemv_down_sum_kernel"], names
        # The grouped path reads no GEMV config: its output for this layer and input (seeded by the
        # shape and dtype alone) is the same under the three configs, so it runs once per process.
        key = (e, k, h, i, t, renorm, dtype)
        if key not in _GROUPED_OUTPUTS:
            with mk.override_configs(path="grouped"):
                _GROUPED_OUTPUTS[key] = m.forward_triton(x, logits)
            assert "_moe_gemm_kernel" in names and "_sum_slots_kernel" in names
        grouped = _GROUPED_OUTPUTS[key]
    assert fast.shape == native.shape and fast.dtype == dtype and fast.is_contiguous()
    limit = 1.5 if dtype == torch.float32 else 4.0
    err = output_error("out", truth, [native], fast, dtype, truncating=True)
    assert err.ratio <= limit and err.elem_ratio <= 2 * limit, err
    # both paths round gate_up to bf16 and the output once; only the float32 summation order differs
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(fast, grouped, **tol)


def test_gemv_path_is_forced_either_way_and_restored(monkeypatch):
    """override_configs(path=...) picks the path at any token count (the H200 sweep compares them
    side by side); the default switches at GEMV_MAX_TOKENS; T=0 returns an empty output."""
    from kernels_reference.ops.moe import kernels as mk

    m, g = _moe(16, 4, 48, 40, True, torch.float32)
    names = _launched(monkeypatch)
    for t in (2, mk.GEMV_MAX_TOKENS + 1, 9):
        x, logits = torch.randn(t, 48, generator=g), router_logits(t, 16, 4, g, "cpu", torch.float32)
        with torch.no_grad():
            native = m.forward_native(x, logits)
            for path in (None, "gemv", "grouped"):
                names.clear()
                with mk.override_configs(path=path):
                    out = m.forward_triton(x, logits)
                gemv = path == "gemv" or path is None and t <= mk.GEMV_MAX_TOKENS
                assert ("_gemv_down_sum_kernel" in names) == gemv and ("_moe_gemm_kernel" in names) != gemv, names
                torch.testing.assert_close(out, native, rtol=1e-5, atol=1e-5)
    assert mk._OVERRIDES == {}
    with torch.no_grad(), mk.override_configs(path="gemv"):
        empty = m.forward_triton(torch.randn(0, 48), torch.randn(0, 16))
    assert empty.shape == (0, 48)
    with pytest.raises(ValueError, match="path"), mk.override_configs(path="dense"):
        pass


def test_gemv_path_reads_strided_hidden_states():
    """Hidden states that are a view (rows of a wider buffer, or a transpose) give exactly the
    output of their contiguous copy: the kernel indexes through x's strides."""
    m, g = _moe(8, 2, 64, 32, True, torch.bfloat16)
    x = torch.randn(3, 64, generator=g).bfloat16()
    logits = router_logits(3, 8, 2, g, "cpu", torch.bfloat16)
    wide = torch.zeros(3, 100, dtype=torch.bfloat16)
    wide[:, 20:84] = x
    transposed = x.t().contiguous().t()
    assert not wide[:, 20:84].is_contiguous() and transposed.stride() == (1, 3)
    with torch.no_grad():
        want = m.forward_triton(x, logits)
        for view in (wide[:, 20:84], transposed):
            assert torch.equal(m.forward_triton(view, logits), want)


@pytest.mark.parametrize("t", [1, 4])
def test_gemv_path_float64_is_float64_throughout(t):
    """float64 inputs accumulate in float64 (products, routing weight, k-sum): the GEMV path agrees
    with the float64 native loop to rounding, where the grouped path's float32 tiles do not."""
    from kernels_reference.ops.moe import kernels as mk

    m, g = _moe(16, 4, 48, 40, True, torch.float64)
    x = torch.randn(t, 48, generator=g, dtype=torch.float64)
    logits = router_logits(t, 16, 4, g, "cpu", torch.float64)
    with torch.no_grad(), mk.override_configs(gemv_gate_up=mk.GemvConfig(16, 16), gemv_down=mk.GemvConfig(16, 16)):
        fast, native = m.forward_triton(x, logits), m.forward_native(x, logits)
    assert fast.dtype == torch.float64
    torch.testing.assert_close(fast, native, rtol=1e-12, atol=1e-13)


def test_gemv_defaults_fill_the_sms(monkeypatch):
    """The fixed H200 launches give every one of 132 SMs >= 2 programs of each kernel at T=1 for the
    three models, with BLOCK_K a multiple of one warp's 16-byte vectors (no cross-warp sum)."""
    from kernels_reference.ops.moe import kernels as mk

    monkeypatch.setattr(mk, "autotune_here", lambda t: True)
    a = torch.empty(1, 1)
    for model in MOE_MODELS:
        s = moe_shape(model, "full")
        up = mk.gemv_config("gate_up", 2 * s.intermediate_size, s.hidden_size, a)
        down = mk.gemv_config("down", s.hidden_size, s.intermediate_size, a)
        assert (up, down) == (mk.GEMV_GATE_UP, mk.GEMV_DOWN)
        assert s.top_k * -(-2 * s.intermediate_size // up.block_n) >= 2 * 132, model
        assert -(-s.hidden_size // down.block_n) >= 2 * 132, model
        assert up.block_k % (32 * 8) == 0 and down.block_k % (32 * 8) == 0
    with mk.override_configs(gemv_down=mk.GemvConfig(8, 128)):
        assert mk.gemv_config("down", 2048, 768, a) == mk.GemvConfig(8, 128)


class _HostSyncs(TorchDispatchMode):
    """Records every op that makes the host wait for the device: reading a value back
    (``_local_scalar_dense``: .item(), .tolist(), bool(), int()) or an op whose output *size* depends
    on the data (nonzero, unique, bincount, masked_select, repeat_interleave by a tensor ...), which
    must read a count back before it can allocate. On CUDA these are all the ways torch syncs."""

    SYNCING = ("_local_scalar_dense", "nonzero", "unique", "bincount", "masked_select", "repeat_interleave",
               "_unique2", "unique_consecutive", "unique_dim", "histc", "equal", "is_nonzero")

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in self.SYNCING:
            self.seen.append(name)
        return func(*args, **(kwargs or {}))


def test_fused_moe_fast_path_has_no_host_sync():
    """Every torch op of forward_triton (routing, align, buffers, the final sum) runs under a mode that
    records syncing ops; the Triton launches themselves take device pointers only. The same check
    passes the example candidate's grouped GEMMs and catches its per-expert loop, which sorts with
    bincount(...).tolist()."""
    m, g = _moe(16, 4, 32, 16, True, torch.bfloat16)
    x, logits = torch.randn(7, 32, generator=g).bfloat16(), router_logits(7, 16, 4, g, "cpu", torch.bfloat16)
    from kernels_reference.ops.moe import kernels as moe_kernels

    # The interpreter's launches copy tensors to numpy (a CPU-only artefact), so every Triton launch
    # (moe_kernels._launch and the children's) runs outside the recording mode and only the torch
    # ops of the layer count; the launches themselves take device pointers only.
    mode = _HostSyncs()

    def outside_mode(launch):
        def wrapped(*args, **kwargs):
            mode.__exit__(None, None, None)
            try:
                return launch(*args, **kwargs)
            finally:
                mode.__enter__()
        return wrapped

    patches = [(moe_kernels, "_launch"), (m.topk, "forward_triton"), (m.act_fn, "forward_triton")]
    originals = [getattr(obj, name) for obj, name in patches]
    for (obj, name), orig in zip(patches, originals):
        setattr(obj, name, outside_mode(orig))
    try:
        with torch.no_grad(), mode:
            moe_kernels.align_to_blocks(logits.topk(4).indices.int(), 16, 16)
            moe_kernels.align_to_blocks(torch.randint(0, 16, (300, 4), generator=g).int(), 16, 16)  # 2 launches
            m.forward_triton(x, logits)  # 7 tokens: the grouped path
            m.forward_triton(x[:3], logits[:3])  # 3 tokens: the GEMV path
            with moe_kernels.override_configs(down=moe_kernels.GemmConfig(16, 16, split_k=2)):
                m.forward_triton(x, logits)
    finally:
        for (obj, name), orig in zip(patches, originals):
            if obj is moe_kernels:
                setattr(obj, name, orig)
            else:
                delattr(obj, name)  # back to the class's method
    assert mode.seen == []
    example = load(EXAMPLES, "fused_moe")(16, 4, 32, 16, True).to(torch.bfloat16)
    example.load_state_dict(m.state_dict())
    with torch.no_grad(), _HostSyncs() as grouped:  # the example's grouped GEMMs: ends on the device
        grouped_out = example(x, logits)
    assert grouped.seen == []
    example._grouped_gemm_fits = lambda x: False  # its per-expert loop, where that GEMM syncs
    with torch.no_grad(), _HostSyncs() as control:
        looped_out = example(x, logits)
    assert "bincount" in control.seen
    assert torch.equal(grouped_out, looped_out)  # one GEMM per expert either way on a CPU
    # .tolist()/.item() on a CPU tensor read memory without dispatching an op; on CUDA they sync.
    # The source of the fast path must not call them (nor move data to the host).
    source = "".join(_code_of(f) for f in (moe_kernels.align_to_blocks, moe_kernels.align_to_blocks_torch,
                                            moe_kernels.grouped_gemm, moe_kernels.sum_slots,
                                            moe_kernels.gemv_gate_up, moe_kernels.gemv_down_sum,
                                            moe_kernels.use_gemv, FusedMoE.forward_triton))
    assert "scatter_add_" in source and "_place_pairs_kernel" in source  # the parse saw the real bodies
    assert "_gemv_gate_up_kernel" in source and "_gemv_down_sum_kernel" in source
    assert not re.search(r"\.(item|tolist|cpu|numpy)\(|nonzero|bincount|unique", source)


def _code_of(fn) -> str:
    """A function's code without its docstring and comments (which may name what it avoids)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    body = tree.body[0].body
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant):
        tree.body[0].body = body[1:]
    return ast.unparse(tree)


# ---- peers -------------------------------------------------------------------------------------------
def test_grouped_mm_peer_computes_the_layer():
    """The torch._grouped_mm peer's algorithm (sort, grouped GEMMs, weighted sum) against the float64
    truth, where this torch runs _grouped_mm on the CPU (on the GPU the peer benchmark checks it)."""
    peers = importlib.import_module(_suite_package().__name__ + ".peers")
    m, g = _moe(16, 4, 64, 32, False, torch.bfloat16)
    x, logits = torch.randn(9, 64, generator=g).bfloat16(), router_logits(9, 16, 4, g, "cpu", torch.bfloat16)
    logits[:, 2] = -30.0  # an idle expert: an empty group
    try:
        out = peers.grouped_mm_moe(x, logits, m.w13_weight, m.w2_weight, 4, False)
    except (RuntimeError, NotImplementedError, AttributeError) as exc:
        pytest.skip(f"torch._grouped_mm does not run on this CPU build: {exc}")
    with torch.no_grad():
        truth = copy.deepcopy(m).double().forward_native(x.double(), logits.double())
        err = output_error("out", truth, [m.forward_native(x, logits)], out.detach(), torch.bfloat16)
    assert err.passed(2.0), err


def test_moe_peer_run_on_cpu_and_the_roofline_target():
    from fk_pytest.peers import Options, benchmark, op_summary

    peers = importlib.import_module(_suite_package().__name__ + ".peers")
    doc = benchmark(Options(device=torch.device("cpu"), profile="cpu", compile=False),
                    ["fused_moe", "topk_softmax"], keyword="qwen3 and T5", max_cases=1)
    by_op = {op["op"]: op for op in doc["ops"]}
    impls = by_op["fused_moe"]["cases"][0]["impls"]
    assert impls["reference"]["status"] == "ok" and impls["eager"]["status"] == "ok"
    assert impls["grouped_mm"]["status"] in ("skipped", "unsupported") and impls["compile"]["status"] == "skipped"
    assert by_op["topk_softmax"]["cases"][0]["impls"]["eager"]["status"] == "ok"
    # the prefill target reads the roofline fraction (GEMM peak), not the copy bandwidth
    task = get_task("fused_moe")
    case = next(c for c in task.cases("full") if c["tokens"] == 8192)
    record = {"case": case.id, "ratio": 1.0, "impls": {"reference": {"bw_frac": 0.05, "roofline_frac": 0.7}}}
    (prefill, decode) = op_summary([record], [peers.MOE_PREFILL, peers.MOE_DECODE], {case.id: case}, False)["targets"]
    assert prefill["held"] is True and prefill["metric"] == "roofline_frac" and prefill["worst_bw_frac"] == 0.7
    assert decode["held"] is None  # no decode case in this record
