"""Tensor-parallel layers on the CPU (gloo): each sharded linear, the routed experts and the vocabulary-parallel embedding
and head, built inside a group of 2 and of 4 ranks and loaded from the same full checkpoint as the
single-GPU layers, give the single-GPU result (column outputs gathered, row partial sums reduced);
the state reads as vLLM's interface does, and a degree that does not divide is refused."""
import pytest
import torch

from kernels_reference.checkpoint import load_checkpoint
from kernels_reference.L1.fused_moe import FusedMoE
from kernels_reference.L1.linear import (ColumnParallelLinear, MergedColumnParallelLinear, QKVParallelLinear,
                                         RowParallelLinear)
from kernels_reference.L1.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding
from kernels_reference.parallel_state import (get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size,
                                              tensor_model_parallel_all_reduce, tensor_parallel)

HIDDEN, HEAD, HEADS, KV_HEADS, INTER, VOCAB, TOKENS = 32, 8, 4, 2, 48, 100, 5  # VOCAB: padding needed at TP > 1
EXPERTS = 4


class Block(torch.nn.Module):
    """The sharded layers of a Llama block and its model's ends, named as a checkpoint names them."""

    def __init__(self):
        super().__init__()
        self.attn = torch.nn.Module()
        self.attn.qkv_proj = QKVParallelLinear(HIDDEN, HEAD, HEADS, KV_HEADS, bias=True)
        self.attn.o_proj = RowParallelLinear(HEADS * HEAD, HIDDEN, bias=True)
        self.mlp = torch.nn.Module()
        self.mlp.gate_up_proj = MergedColumnParallelLinear(HIDDEN, [INTER, INTER])
        self.mlp.down_proj = RowParallelLinear(INTER, HIDDEN)
        self.q_b_proj = ColumnParallelLinear(HIDDEN, 2 * HIDDEN, gather_output=True)
        self.embed_tokens = VocabParallelEmbedding(VOCAB, HIDDEN)
        self.lm_head = ParallelLMHead(VOCAB, HIDDEN, bias=True)
        self.experts = FusedMoE(EXPERTS, 2, HIDDEN, INTER)  # loaded from per-expert w1/w3/w2 names


def checkpoint():
    g = torch.Generator().manual_seed(0)

    def w(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    kv = KV_HEADS * HEAD
    return {"attn.q_proj.weight": w(HEADS * HEAD, HIDDEN), "attn.k_proj.weight": w(kv, HIDDEN),
            "attn.v_proj.weight": w(kv, HIDDEN), "attn.q_proj.bias": w(HEADS * HEAD), "attn.k_proj.bias": w(kv),
            "attn.v_proj.bias": w(kv), "attn.o_proj.weight": w(HIDDEN, HEADS * HEAD), "attn.o_proj.bias": w(HIDDEN),
            "mlp.gate_proj.weight": w(INTER, HIDDEN), "mlp.up_proj.weight": w(INTER, HIDDEN),
            "mlp.down_proj.weight": w(HIDDEN, INTER), "q_b_proj.weight": w(2 * HIDDEN, HIDDEN),
            "embed_tokens.weight": w(VOCAB, HIDDEN), "lm_head.weight": w(VOCAB, HIDDEN), "lm_head.bias": w(VOCAB),
            **{f"experts.{e}.{m}.weight": w(*shape) for e in range(EXPERTS)
               for m, shape in (("w1", (INTER, HIDDEN)), ("w3", (INTER, HIDDEN)), ("w2", (HIDDEN, INTER)))}}


def run_block(x, ids):
    """What each layer gives on this rank, the row-parallel layers fed this rank's input slice as
    the column-parallel layer before them would hand it over."""
    block = Block().double()
    load_checkpoint(block, checkpoint().items())
    tp, rank = get_tensor_model_parallel_world_size(), get_tensor_model_parallel_rank()
    attn_in = torch.randn(TOKENS, HEADS * HEAD, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    mlp_in = torch.randn(TOKENS, INTER, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    heads, inter = HEADS * HEAD // tp, INTER // tp
    return {"qkv": block.attn.qkv_proj(x), "o": block.attn.o_proj(attn_in[:, rank * heads:(rank + 1) * heads]),
            "gate_up": block.mlp.gate_up_proj(x), "down": block.mlp.down_proj(mlp_in[:, rank * inter:(rank + 1) * inter]),
            "q_b": block.q_b_proj(x), "embed": block.embed_tokens(ids), "logits": block.lm_head(x),
            "experts": block.experts.forward_native(x, torch.randn(TOKENS, EXPERTS, generator=torch.Generator()
                                                                   .manual_seed(4), dtype=torch.float64))}


def expected_shard(full, name, tp, rank):
    """The single-GPU output's part that rank ``rank`` of ``tp`` computes (whole where reduced or gathered)."""
    if name == "qkv":
        q, k, v = full.split([HEADS * HEAD, KV_HEADS * HEAD, KV_HEADS * HEAD], dim=-1)
        kv_heads = max(KV_HEADS // tp, 1)
        kv_index = rank // max(tp // KV_HEADS, 1)
        qs = HEADS * HEAD // tp
        kvs = kv_heads * HEAD
        return torch.cat([q[:, rank * qs:(rank + 1) * qs], k[:, kv_index * kvs:(kv_index + 1) * kvs],
                          v[:, kv_index * kvs:(kv_index + 1) * kvs]], dim=-1)
    if name == "gate_up":
        gate, up = full.split([INTER, INTER], dim=-1)
        n = INTER // tp
        return torch.cat([gate[:, rank * n:(rank + 1) * n], up[:, rank * n:(rank + 1) * n]], dim=-1)
    return full


def sharded_layer_errors(rank, world, payload):
    """One rank of a group of 4 (fk_pytest.tp_ranks): each layer at degree 4 and, in two groups of
    2 made from the same ranks, at degree 2, against the single-GPU layers' outputs."""
    import torch.distributed as dist
    pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]  # every rank makes every group, in order
    x = torch.randn(TOKENS, HIDDEN, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    ids = torch.tensor([0, 7, 63, 64, 99])
    out = {}
    with tensor_parallel(1, 0):
        full = run_block(x, ids)
    for tp, group, r in ((4, None, rank), (2, pairs[rank // 2], rank % 2)):
        with tensor_parallel(tp, r, group):
            for name, got in run_block(x, ids).items():
                out[f"tp{tp}/{name}"] = (got - expected_shard(full[name], name, tp, r)).abs().max().item()
            out[f"tp{tp}/all_reduce"] = (tensor_model_parallel_all_reduce(torch.ones(3, dtype=torch.float64))
                                        - tp).abs().max().item()
    return out


def test_sharded_layers_at_tp_2_and_4_give_the_single_gpu_result():
    from fk_pytest.tp_ranks import run_ranks
    results = run_ranks(sharded_layer_errors, 4, None, timeout_s=120)
    for rank, errors in enumerate(results):
        assert len(errors) == 18
        bad = {k: v for k, v in errors.items() if v > 1e-12}
        assert not bad, f"rank {rank}: {bad}"


def test_degree_one_is_the_single_gpu_layer_and_state_reads_like_vllm():
    assert (get_tensor_model_parallel_world_size(), get_tensor_model_parallel_rank()) == (1, 0)
    layer = RowParallelLinear(8, 4)
    assert layer.weight.shape == (4, 8) and layer.init_args == {"input_size": 8, "output_size": 4, "bias": False}
    assert QKVParallelLinear(32, 8, 4, 2).weight.shape == (64, 32)
    assert VocabParallelEmbedding(100, 16).weight.shape == (100, 16)  # no padding on one GPU
    with tensor_parallel(4, 3):
        assert (get_tensor_model_parallel_world_size(), get_tensor_model_parallel_rank()) == (4, 3)
        qkv = QKVParallelLinear(32, 8, 4, 2)  # 4 ranks, 2 KV heads: each KV head on two ranks
        assert (qkv.num_heads, qkv.num_kv_heads, qkv.kv_replicas, qkv.weight.shape) == (1, 1, 2, (24, 32))
        assert VocabParallelEmbedding(100, 16).weight.shape == (32, 16)  # 128 padded rows / 4
        assert RowParallelLinear(8, 4, reduce_results=False).init_args["reduce_results"] is False
    assert get_tensor_model_parallel_world_size() == 1


@pytest.mark.parametrize("build, words", [
    (lambda: ColumnParallelLinear(8, 6), "6 is not divisible by the tensor-parallel size 4"),
    (lambda: QKVParallelLinear(32, 8, 4, 3), "tensor-parallel size 4 exceeds the 3 KV heads but is not a multiple"),
])
def test_a_degree_that_does_not_divide_is_refused(build, words):
    with tensor_parallel(4, 0), pytest.raises(ValueError, match=words):
        build()


# ---- tensor-parallel cases of a task (fk_pytest.tp_eval): the reference, honest and wrong trees -----
def tp_verdicts(tree=None, degrees=(2, 4)):
    from conftest import CANDIDATES, EXAMPLES
    from fk_pytest.candidates import CandidateSource
    from fk_pytest.correctness import evaluate_case
    from fk_pytest.registry import get_task

    task = get_task("row_parallel_linear")
    cls = task.reference if tree is None else CandidateSource(
        EXAMPLES if tree == "examples" else CANDIDATES / tree).load_class(task)
    cases = [c for c in task.cases("cpu") if c.params.get("tp") in degrees]
    assert len(cases) == len(degrees)
    return [evaluate_case(task, case, 1234, cls, "cpu") for case in cases]


def test_the_reference_passes_its_own_row_parallel_case_at_tp_2():
    # (the main job scores the example tree on every tensor-parallel case at degrees 2 and 4)
    (result,) = tp_verdicts(degrees=(2,))
    assert result.status == "PASSED", result.message


@pytest.mark.parametrize("tree, verdict, words", [
    ("tp_row_no_all_reduce", "WRONG_RESULT", "rank 1 differs from rank 0's"),
    ("tp_row_reduces_twice", "WRONG_RESULT", "relative L2 error"),
    ("tp_row_single_gpu", "RUNTIME_ERROR", "does not shard at degree 2"),
    ("tp_row_rank1_raises", "RUNTIME_ERROR", "rank 1 of 2 raised RuntimeError: rank 1 lost its way"),
])
def test_wrong_tensor_parallel_candidates_get_named_verdicts(tree, verdict, words):
    (result,) = tp_verdicts(tree, degrees=(2,))
    assert result.status == verdict and words in result.message, result.message


def test_a_rank_that_hangs_ends_its_case_with_a_timeout(monkeypatch):
    import fk_pytest.tp_eval as tp_eval
    monkeypatch.setattr(tp_eval, "RANK_TIMEOUT_S", 3.0)
    (result,) = tp_verdicts("tp_row_rank0_reduces_alone", degrees=(2,))
    assert result.status == "TIMEOUT" and "rank(s) [0] of 2 did not finish within 3 s" in result.message, \
        result.message


# ---- the all-reduce tasks -------------------------------------------------------------------------
def task_tp_verdicts(task_name, tree):
    from conftest import CANDIDATES, EXAMPLES
    from fk_pytest.candidates import CandidateSource
    from fk_pytest.correctness import evaluate_case
    from fk_pytest.registry import get_task

    task = get_task(task_name)
    cls = CandidateSource(EXAMPLES if tree == "examples" else CANDIDATES / tree).load_class(task)
    return {c["tp"]: evaluate_case(task, c, 99, cls, "cpu") for c in task.cases("cpu") if c.params.get("tp") == 2}


@pytest.mark.parametrize("task_name, tree, words", [
    ("all_reduce", "ar_no_reduction", "rank 1 differs from rank 0's"),
    ("all_reduce", "ar_mean_not_sum", "relative L2 error"),
    ("all_reduce_fused_add_rms_norm", "ar_norm_before_reduce", "relative L2 error"),
])
def test_wrong_all_reduces_fail(task_name, tree, words):
    results = task_tp_verdicts(task_name, tree)
    assert all(r.status == "WRONG_RESULT" and words in r.message for r in results.values()), \
        [r.message for r in results.values()]


# ---- attention at tensor parallelism: per-rank heads and KV cache ---------------------------------
def attention_tp_verdict(tree, model="qwen3-0.6b", tp=2):
    """llama_attention's decode batch at degree ``tp`` on ``model``'s heads, for ``tree`` (None: the
    reference)."""
    from conftest import CANDIDATES, EXAMPLES
    from fk_pytest import Case
    from fk_pytest.candidates import CandidateSource
    from fk_pytest.correctness import evaluate_case
    from fk_pytest.registry import get_task

    task = get_task("llama_attention")
    cls = task.reference if tree is None else CandidateSource(
        EXAMPLES if tree == "examples" else CANDIDATES / tree).load_class(task)
    case = Case(f"{model}-decode-B3-bf16-tp{tp}", torch.bfloat16, model=model,
                params=dict(context=[40, 17, 63], query=[1, 1, 1], model=model, tp=tp))
    return evaluate_case(task, case, 7, cls, "cpu")


def test_attention_with_replicated_kv_heads_is_assembled_and_passes():
    """Qwen3-Next's full-attention heads (16 query, 2 KV) at degree 4: each KV head lives on two
    ranks, both write it to their own cache, and the assembled cache must match the single-GPU one.
    The example tree passes (the reference runs in the same group run: a reference whose replicas
    disagreed would end the case as the task's error)."""
    result = attention_tp_verdict("examples", "qwen3-next-80b-a3b", 4)
    assert result.status == "PASSED", result.message


def test_attention_without_the_output_all_reduce_fails_naming_the_rank():
    result = attention_tp_verdict("tp_attn_no_all_reduce")
    assert result.status == "WRONG_RESULT" and "rank 1 differs from rank 0's" in result.message, result.message


def test_composed_mode_composes_the_tree_on_every_rank(tmp_path):
    """The decoder layer's TP-2 case in composed mode with a tree whose L1 SiluAndMul is wrong (its
    L2..L4 classes honest): each rank composes the tree into its shard, so the case fails and names
    the classes composed (before 8560997 a TP case ran the tree's top class alone and passed)."""
    import shutil

    from conftest import CANDIDATES
    from fk_pytest.candidates import CandidateSource
    from fk_pytest.compose import candidate_lookup
    from fk_pytest.correctness import evaluate_case
    from fk_pytest.registry import get_task

    tree = tmp_path / "tree"
    shutil.copytree(CANDIDATES / "composed", tree)
    (tree / "L1").mkdir()
    shutil.copy(CANDIDATES / "silu_swapped/L1/silu_and_mul.py", tree / "L1/silu_and_mul.py")
    source = CandidateSource(tree)
    task = get_task("llama_decoder_layer")
    case = next(c for c in task.cases("cpu") if c.params.get("tp") == 2)
    result = evaluate_case(task, case, 3, source.load_class(task), "cpu", compose=candidate_lookup(source))
    assert result.status == "WRONG_RESULT", result.message
    assert {"LlamaDecoderLayer", "LlamaMLP", "SiluAndMul"} <= set(result.swapped), result.swapped


def test_routed_experts_at_tp_2_pass_and_a_missing_reduction_is_named():
    """FusedMoE at degree 2 (each rank every expert's slice of the intermediate features), on the
    fused_moe task's first prefill case: the example tree passes, a class that never sums the
    ranks' partial outputs is told which rank differs. (The task itself has no TP case: a bare
    single-GPU MoE class is a fair candidate at degree 1.)"""
    from conftest import CANDIDATES, EXAMPLES
    from fk_pytest.candidates import CandidateSource
    from fk_pytest.correctness import evaluate_case
    from fk_pytest.registry import get_task
    from fk_pytest.task import at_degree

    task = get_task("fused_moe")
    case = at_degree(next(c for c in task.cases("cpu") if "prefill" in c.id), 2)
    honest = evaluate_case(task, case, 5, CandidateSource(EXAMPLES).load_class(task), "cpu")
    assert honest.status == "PASSED", honest.message
    wrong = evaluate_case(task, case, 5, CandidateSource(CANDIDATES / "tp_moe_no_all_reduce").load_class(task), "cpu")
    assert wrong.status == "WRONG_RESULT" and "rank 1 differs from rank 0's" in wrong.message, wrong.message


def _hanging_job(rank, tp, pid_dir):
    import os
    import time
    open(os.path.join(pid_dir, str(os.getpid())), "w").close()
    time.sleep(600)


def test_ranks_end_themselves_when_the_process_that_started_them_is_killed(tmp_path):
    """A sterile worker killed for its time limit must not leave its ranks behind."""
    import os
    import signal
    import subprocess
    import sys
    import time

    code = ("import sys; sys.path[:0] = sys.argv[1:3]; from fk_pytest.tp_ranks import run_ranks; "
            "from test_tensor_parallel import _hanging_job; run_ranks(_hanging_job, 2, sys.argv[3], 600)")
    here = os.path.dirname(__file__)
    starter = subprocess.Popen([sys.executable, "-c", code, here, os.path.join(here, "..", "src"), str(tmp_path)])
    deadline = time.monotonic() + 60
    while len(os.listdir(tmp_path)) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    ranks = [int(p) for p in os.listdir(tmp_path)]
    assert len(ranks) == 2
    starter.send_signal(signal.SIGKILL)
    starter.wait()

    def alive(pid):
        try:
            os.kill(pid, 0)
        except OSError:
            return False
        with open(f"/proc/{pid}/stat") as f:  # a zombie waiting for its reaper has ended
            return f.read().split()[2] != "Z"

    deadline = time.monotonic() + 10
    while any(alive(p) for p in ranks) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(alive(p) for p in ranks)


@pytest.mark.parametrize("task_name", ["llama_decoder_layer", "mixtral_decoder_layer", "mixtral_for_causal_lm"])
def test_a_copy_of_the_reference_tree_shards_on_the_ranks(task_name):
    """A tree that is the reference's files (relative imports and all) reads the degree and rank
    the ranks set, not a private copy of the parallel state that says degree 1: its layers shard
    and pass. Mixtral's layer also splits every expert over the ranks and all-reduces their
    outputs; the whole Mixtral cut at degree 2 as well: vocabulary-parallel embedding and LM head,
    per-rank KV caches. (Neither Mixtral task has a TP case of its own, for the main job's time.)"""
    from conftest import ROOT
    from fk_pytest.candidates import CandidateSource
    from fk_pytest.correctness import evaluate_case
    from fk_pytest.registry import get_task
    from fk_pytest.task import at_degree

    task = get_task(task_name)
    cases = task.cases("cpu")
    case = next((c for c in cases if c.params.get("tp") == 2), None) or at_degree(
        next(c for c in cases if "-decode-" in c.id), 2)
    result = evaluate_case(task, case, 7, CandidateSource(ROOT / "kernels_reference").load_class(task), "cpu")
    assert result.status == "PASSED", result.message


def test_mixtral_layer_at_tp_2_without_the_expert_reduction_fails():
    """The Mixtral layer's first decode batch at TP 2 sees a FusedMoE that never sums the ranks'
    partial outputs."""
    from conftest import CANDIDATES
    from fk_pytest.candidates import CandidateSource
    from fk_pytest.correctness import evaluate_case
    from fk_pytest.registry import get_task

    from fk_pytest.compose import candidate_lookup

    from fk_pytest.task import at_degree

    task = get_task("mixtral_decoder_layer")
    case = at_degree(next(c for c in task.cases("cpu") if "-decode-" in c.id), 2)
    wrong = evaluate_case(task, case, 7, task.reference, "cpu",
                          compose=candidate_lookup(CandidateSource(CANDIDATES / "tp_moe_no_all_reduce")))
    assert wrong.status == "WRONG_RESULT" and wrong.swapped == ["FusedMoE"], (wrong.status, wrong.swapped)
    assert "rank 1 differs from rank 0's" in wrong.message, wrong.message
