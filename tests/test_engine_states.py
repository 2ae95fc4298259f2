"""The engine serving models whose layers carry a per-sequence state (Mamba-2; Qwen3-Next's hybrid
of gated DeltaNet and paged full attention): greedy tokens through chunked prefill, mixed steps,
preemption and the padded decode path equal HF transformers' model recomputing each whole sequence,
decode-forced scoring replays them, and every state slot is free after a run.

Tiny random-weight configs in float32 (the HF tests' shapes: Mamba-2's 16-token scan chunks, so
prompts cross them; Qwen3-Next's 3 linear : 1 full layer pattern with a routed MoE)."""
import math

import pytest
import torch

from kernels_reference.engine import LLM, SamplingParams

from tasks.state_steps import draw_hf_state_model

transformers = pytest.importorskip("transformers")
mamba2 = pytest.importorskip("transformers.models.mamba2.modeling_mamba2")
qwen3_next = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")

MAMBA2 = dict(hidden_size=64, num_heads=4, head_dim=32, expand=2, state_size=16, n_groups=2, conv_kernel=4,
              chunk_size=16, use_conv_bias=True, use_bias=False, layer_norm_epsilon=1e-5, num_hidden_layers=2,
              vocab_size=97, tie_word_embeddings=True)
QWEN3_NEXT = dict(hidden_size=64, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
                  linear_value_head_dim=8, linear_conv_kernel_dim=4, rms_norm_eps=1e-6, vocab_size=96,
                  intermediate_size=96, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                  head_dim=32, partial_rotary_factor=0.25, rope_theta=1e6, max_position_embeddings=512,
                  num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                  shared_expert_intermediate_size=48, norm_topk_prob=True, tie_word_embeddings=False)

# Lengths that cross Mamba-2's 16-token scan chunks and the 8-token budget below; Qwen3-Next's
# 70-token prompt crosses the delta rule's 64-token chunk.
PROMPT_LENS = {"mamba2": [5, 23, 40, 11], "qwen3_next": [5, 23, 70, 11]}


def _hf_mamba2(gen):
    hf = mamba2.Mamba2ForCausalLM(mamba2.Mamba2Config(**MAMBA2)).eval()
    heads = MAMBA2["num_heads"]
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith("A_log"):  # decay rates from slow to fast, as mamba-ssm draws them
                p.copy_(torch.linspace(1.0, 16.0, heads).log())
            elif name.endswith("dt_bias"):  # softplus(dt_bias) spread over [1e-3, 0.1]
                step = torch.exp(torch.linspace(math.log(1e-3), math.log(0.1), heads))
                p.copy_(step + torch.log(-torch.expm1(-step)))
            elif name.endswith("conv1d.weight"):
                p.copy_(0.5 * torch.randn(p.shape, generator=gen))
            elif name.endswith("conv1d.bias"):
                p.copy_(0.2 * torch.randn(p.shape, generator=gen))
            elif p.dim() == 1:  # D and the norms
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            elif name.endswith("embeddings.weight"):
                p.copy_(torch.randn(p.shape, generator=gen))
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * p.shape[-1] ** -0.5)
    return hf


def _hf_qwen3_next(gen):
    cfg = qwen3_next.Qwen3NextConfig(**QWEN3_NEXT)
    cfg._attn_implementation = "eager"
    return draw_hf_state_model(qwen3_next.Qwen3NextForCausalLM(cfg).eval(), gen, centred_norms=True)


_CACHE = {}


def setup(name):
    """(HF model, our model's state_dict source, prompts, HF greedy continuations), built once."""
    if name not in _CACHE:
        gen = torch.Generator().manual_seed(0)
        hf = _hf_mamba2(gen) if name == "mamba2" else _hf_qwen3_next(gen)
        vocab = hf.config.vocab_size
        prompts = [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in PROMPT_LENS[name]]
        expected = [greedy_reference(hf, p, MAX_TOKENS) for p in prompts]
        _CACHE[name] = hf, prompts, expected
    return _CACHE[name]


MAX_TOKENS = 6


@torch.no_grad()
def greedy_reference(hf, prompt, max_tokens):
    """Greedy tokens without any engine or cache: the whole sequence so far through HF's model,
    argmax of the last row, appended; repeated."""
    tokens = list(prompt)
    for _ in range(max_tokens):
        tokens.append(int(hf(input_ids=torch.tensor([tokens]), use_cache=False).logits[0, -1].argmax()))
    return tokens[len(prompt):]


def our_llm(hf, device="cpu", **engine_args):
    from kernels_reference.L4.llama import model_for

    model = model_for(hf.config.to_dict())  # the architecture registry builds both from HF configs
    model.load_weights(hf.state_dict().items())
    return LLM(model.float().to(device), **engine_args)


def assert_slots_free(llm):
    blocks = llm.blocks
    assert sorted(blocks.free_slots) == list(range(blocks.num_state_slots)), "a state slot leaked"
    assert sorted(blocks.free_blocks) == list(range(blocks.num_blocks))


def served(llm, prompts):
    """Greedy outputs, then decode-forced scoring of them (which must return them token for token)."""
    out = llm.generate(prompts, SamplingParams(max_tokens=MAX_TOKENS))
    assert_slots_free(llm)
    scored = llm.score_decode([p + o for p, o in zip(prompts, out)], [len(p) for p in prompts])
    assert scored == out
    assert_slots_free(llm)
    return out


@pytest.mark.parametrize("padded", [False, True], ids=["eager", "padded"])
@pytest.mark.parametrize("name", ["mamba2", "qwen3_next"])
def test_chunked_prefill_and_mixed_steps_equal_hf(name, padded):
    """An 8-token budget splits the longer prompts over steps while earlier ones decode: prefill,
    mixed and decode steps, states carried across chunks in each sequence's slot."""
    hf, prompts, expected = setup(name)
    # One bucket of 4: every decode step of fewer sequences has padding rows, which must write
    # their states to the spare slot, not to a running sequence's.
    llm = our_llm(hf, num_blocks=64, block_size=4, max_num_seqs=4, max_num_batched_tokens=8,
                  padded_decode=padded, graph_batch_sizes=[4])
    assert served(llm, prompts) == expected
    steps = llm.runner.steps
    assert steps["mixed"] > 0 and steps["prefill"] > 0
    assert steps["decode-padded" if padded else "decode-eager"] > 0


@pytest.mark.parametrize("padded", [False, True], ids=["eager", "padded"])
@pytest.mark.parametrize("name", ["mamba2", "qwen3_next"])
def test_preemption_recomputes_states(name, padded):
    """Fewer slots than prompts and blocks so tight that running sequences are preempted: each is
    recomputed from its tokens with a fresh state (possibly in another slot), same tokens."""
    hf, prompts, expected = setup(name)
    longest = max(len(p) for p in prompts) + MAX_TOKENS
    llm = our_llm(hf, num_blocks=-(-longest // 4) + 3, block_size=4, max_num_seqs=2, max_num_batched_tokens=16,
                  padded_decode=padded, graph_batch_sizes=[2])
    preempted = []
    original = llm.scheduler._preempt

    def preempt(seq):
        preempted.append((seq.seq_id, seq.state_slot))
        original(seq)
    llm.scheduler._preempt = preempt
    assert served(llm, prompts) == expected
    assert preempted, "the run was meant to preempt"
    assert all(slot is not None for _, slot in preempted)


def step_logits(llm, prompts):
    """Every engine step's logits (a copy), in order, over a greedy run of ``prompts`` and the
    decode-forced scoring of its output (where slot 0's sequence still runs beside padding)."""
    seen, run = [], llm.runner.run

    def recording(batch):
        out = run(batch)
        seen.append(out.detach().clone())
        return out
    llm.runner.run = recording
    out = llm.generate(prompts, SamplingParams(max_tokens=MAX_TOKENS))
    llm.score_decode([p + o for p, o in zip(prompts, out)], [len(p) for p in prompts])
    return seen


@pytest.mark.parametrize("name", ["mamba2", "qwen3_next"])
def test_padded_decode_steps_give_the_eager_steps_logits(name):
    """Tokens alone can hide a state written to the wrong slot: the tiny Mamba-2's top-1 margins are
    0.8-24 logits, so a padding row that overwrote a running sequence's state (slot 0 instead of the
    spare) left every token unchanged. Each step's logits must match the unpadded engine's."""
    hf, prompts, _ = setup(name)
    args = dict(num_blocks=64, block_size=4, max_num_seqs=4, max_num_batched_tokens=24)
    eager = step_logits(our_llm(hf, **args), prompts)
    padded = step_logits(our_llm(hf, padded_decode=True, graph_batch_sizes=[4], **args), prompts)
    assert len(padded) == len(eager)
    for a, b in zip(padded, eager):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_block_manager_state_slots():
    """A slot is taken when a sequence is first given blocks, kept while it grows, returned with
    its blocks; none is handed out when the pool is empty."""
    from kernels_reference.engine.block_manager import BlockManager
    from kernels_reference.engine.sequence import Sequence

    bm = BlockManager(num_blocks=8, block_size=4, num_state_slots=2)
    a, b, c = (Sequence(i, [1] * 6, 6, 2) for i in range(3))
    bm.grow(a, 4)
    slot = a.state_slot
    a.num_cached = 4
    bm.grow(a, 2)
    assert a.state_slot == slot
    bm.grow(b, 6)
    assert {a.state_slot, b.state_slot} == {0, 1}
    assert not bm.can_grow(c, 1)
    with pytest.raises(RuntimeError, match="state slots"):
        bm.grow(c, 1)
    bm.free(a)
    assert a.state_slot is None and bm.can_grow(c, 1)
    bm.grow(c, 1)
    assert c.state_slot == slot
    assert BlockManager(4, 4).free_slots == []  # a model without states: no slots


def test_scheduler_puts_decodes_before_prompt_chunks():
    """A running sequence still in its prompt's chunks comes before a later-admitted one that
    decodes in the running list; the step still lists the decode first (state layers run the
    leading one-token continuing sequences through their decode kernels)."""
    from kernels_reference.engine.block_manager import BlockManager
    from kernels_reference.engine.scheduler import Scheduler
    from kernels_reference.engine.sequence import Sequence, Status

    sched = Scheduler(BlockManager(64, 4, num_state_slots=4), max_num_batched_tokens=24)
    long, short = Sequence(0, [1] * 20, 20, 2), Sequence(1, [1] * 3, 3, 2)
    for s, cached in ((long, 8), (short, 3)):
        sched.blocks.grow(s, cached)
        s.num_cached, s.status = cached, Status.RUNNING
        sched.running.append(s)
    short.token_ids.append(5)
    assert [(s.seq_id, n) for s, n in sched.schedule()] == [(1, 1), (0, 12)]


@pytest.mark.parametrize("name", ["mamba2", "qwen3_next"])
def test_random_weights_from_a_config_decay_and_centre_as_trained_ones(name):
    """``LLM.from_config`` draws random weights; the generic rule (vectors 1 + noise) would make
    Mamba-2's A positive (states that grow) and Qwen3-Next's zero-centred norms scale by about 2.
    The layers' own redraws fix those; the engine then generates finite logits."""
    from kernels_reference.L1.gemma_rms_norm import GemmaRMSNorm
    from kernels_reference.L2.mamba_mixer2 import MambaMixer2
    from kernels_reference.L2.qwen3_next_gated_delta_net import Qwen3NextGatedDeltaNet

    config = dict(MAMBA2, architectures=["Mamba2ForCausalLM"]) if name == "mamba2" else \
        dict(QWEN3_NEXT, architectures=["Qwen3NextForCausalLM"])
    llm = LLM.from_config(config, dtype=torch.float32, max_num_seqs=4)
    modules = list(llm.model.modules())
    for m in modules:
        if isinstance(m, MambaMixer2):
            assert bool((m.A < 0).all()) and bool((m.D == 1).all())
            assert bool((torch.nn.functional.softplus(m.dt_bias) <= 0.1 + 1e-6).all())
        if isinstance(m, Qwen3NextGatedDeltaNet):
            assert float(m.A_log.exp().min()) >= 1.0 and bool((m.dt_bias == 1).all())
        if isinstance(m, GemmaRMSNorm):
            assert float(m.weight.abs().max()) < 0.6
    assert any(isinstance(m, (MambaMixer2, Qwen3NextGatedDeltaNet)) for m in modules)
    out = llm.generate([[3, 5, 7, 11]], SamplingParams(max_tokens=3))
    assert len(out[0]) == 3


def plain_tokens(hf, prompts):
    """Greedy tokens of the engine on the CPU without padding, graphs or chunking: what the paths
    below must reproduce. (Against this rather than HF's own greedy output, which moved between
    transformers 5.17 and 5.25 for one of these Mamba-2 prompts while ours did not.)"""
    return our_llm(hf, num_blocks=64, block_size=4).generate(prompts, SamplingParams(max_tokens=MAX_TOKENS))


class SlotGraph:
    """CPU stand-in for a captured decode graph: replays the step on the static buffers, or (stale)
    with every row's state slot frozen at the spare slot that capture ran with."""

    def __init__(self, decoder, size, stale):
        self.decoder, self.size, self.stale = decoder, size, stale

    def replay(self):
        d, n = self.decoder, self.size
        slots = d.state_slots[:n].clone()
        if self.stale:
            d.state_slots[:n] = d.spare_slot
        d.out_logits[:n] = d._run_eager(n, d.seq_lens[:n].tolist())
        d.state_slots[:n] = slots


@pytest.mark.parametrize("name", ["mamba2", "qwen3_next"])
def test_the_replay_check_puts_the_states_back(name):
    """The first replay of each bucket is checked against the same step run eagerly. A decode step
    advances the states, so the check must restore the rows the replay advanced before its eager
    run: an honest replay passes (and the tokens equal the plain engine's), one that reads stale
    slots is caught."""
    hf, prompts, _ = setup(name)
    expected = plain_tokens(hf, prompts)
    for stale in (False, True):
        llm = our_llm(hf, num_blocks=64, block_size=4, max_num_seqs=4, max_num_batched_tokens=8,
                      padded_decode=True, graph_batch_sizes=[1, 2, 4])
        llm.runner.cuda_graphs = True
        decoder = llm.runner.decoder
        decoder.graphs = {s: SlotGraph(decoder, s, stale) for s in decoder.sizes}
        if stale:
            with pytest.raises(RuntimeError, match="disagrees with the same step run eagerly"):
                llm.generate(prompts, SamplingParams(max_tokens=MAX_TOKENS))
        else:
            assert served(llm, prompts) == expected
            assert decoder._checked


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: CUDA-graph decode")
@pytest.mark.parametrize("name", ["mamba2", "qwen3_next"])
def test_cuda_graph_decode_equals_the_plain_engine(name):
    """On the GPU, decode steps are replays of graphs captured at padded batch sizes: each replay
    reads and writes the states through the slot indices copied into the graph's buffers (padding
    rows to the spare slot), so greedy tokens equal the plain engine's on the CPU (itself checked
    against HF above), and decode-forced scoring replays them."""
    hf, prompts, _ = setup(name)
    expected = plain_tokens(hf, prompts)
    llm = our_llm(hf, "cuda", num_blocks=64, block_size=4, max_num_seqs=4, max_num_batched_tokens=8,
                  cuda_graphs=True, graph_batch_sizes=[1, 2, 4])
    assert served(llm, prompts) == expected
    assert llm.runner.steps["decode-graph"] > 0


# ---- the example tree's state layers on the path the GPU captures ---------------------------------
STATE_LAYER_FILES = {"L1": ("linear", "mamba_chunk_scan", "rms_norm_gated", "selective_state_update",
                            "short_convolution", "gated_delta_rule"),
                     "L2": ("mamba_mixer2", "qwen3_next_gated_delta_net")}


def _state_layer_tree(tmp_path, edit=None):
    """The example tree's two state layers and the L1 files they import (plain PyTorch), alone."""
    from conftest import EXAMPLES

    for level, names in STATE_LAYER_FILES.items():
        (tmp_path / level).mkdir()
        for name in names:
            text = (EXAMPLES / level / f"{name}.py").read_text()
            (tmp_path / level / f"{name}.py").write_text(edit(name, text) if edit else text)
    return tmp_path


def _decode_steps_without_host_syncs(name, tree):
    """Serve through padded decode steps (the steps the GPU captures, run eagerly here) with every
    module of the candidate tree checked on those steps for operations a CUDA-graph capture cannot
    run. Prefill steps run eagerly on a GPU too, so host reads there are allowed."""
    from fk_pytest.candidates import CandidateSource
    from fk_pytest.compose import candidate_lookup
    from conftest import check_candidate_host_syncs
    from fk_pytest.e2e_run import compose_candidate, engine_model
    from kernels_reference.forward_context import get_forward_context
    from kernels_reference.L4.llama import model_for

    hf, prompts, _ = setup(name)
    reference = model_for(hf.config.to_dict())
    reference.load_weights(hf.state_dict().items())
    reference = reference.float()
    model, _ = compose_candidate(reference, candidate_lookup(CandidateSource(tree)))
    decode_steps = []

    def padded_decode_step():
        meta = get_forward_context()
        if meta is None or meta.num_decodes is None:  # not a padded decode step
            return False
        decode_steps.append(sum(n == 0 for n in meta.seq_lens_cpu))  # its padding rows
        return True
    checked = check_candidate_host_syncs(model, name, when=padded_decode_step)
    assert any(hasattr(m, "state_cache") for m in checked), "no state layer of the tree was composed in"
    # Three sequences decode together: each decode batch is padded to the bucket of 4.
    llm = LLM(engine_model(model, reference), num_blocks=64, block_size=4, padded_decode=True, max_num_seqs=8)
    out = llm.generate(prompts[:3], SamplingParams(max_tokens=4))
    assert any(decode_steps), f"no decode step had padding rows: {decode_steps}"
    return out


@pytest.mark.parametrize("name", ["mamba2", "qwen3_next"])
def test_example_state_layers_decode_without_host_syncs(name, tmp_path):
    """On an H100 (2026-12-06) the example tree's Mamba-2 mixer sent the padding rows of a captured
    decode batch to its prefill scan (it ignored ``num_decodes``) and its gated DeltaNet split the
    batch with ``nonzero()``: both broke decode-graph capture end to end. The CPU never captures,
    so this check stands in for it."""
    _decode_steps_without_host_syncs(name, _state_layer_tree(tmp_path))


@pytest.mark.parametrize("name", ["mamba2", "qwen3_next"])
def test_host_sync_check_sees_the_state_layers_as_they_were(name, tmp_path):
    from fk_pytest.host_sync import NotCapturable

    def as_before(file, text):
        # Mamba-2: the host-length rule alone, as the tree had it (padding rows look like prompts);
        # Qwen3-Next: decodes counted on the device, a read of device values as nonzero() was.
        text = text.replace("nd = meta.num_decodes  #", "nd = None  #")
        return text.replace("nd = meta.num_decodes\n", "nd = int((meta.query_start_loc.diff() == 1).sum())\n")
    # the message names the line that read the device: the scan's cu_seqlens, the decode count
    line = r"L1/mamba_chunk_scan\.py:\d+" if name == "mamba2" else r"L2/qwen3_next_gated_delta_net\.py:\d+"
    with pytest.raises(NotCapturable, match=line):
        _decode_steps_without_host_syncs(name, _state_layer_tree(tmp_path, as_before))
