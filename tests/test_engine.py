"""The engine on tiny models on the CPU: block manager, scheduler, and greedy tokens that do not
depend on batching, chunking or preemption, and equal HF transformers' generate; the CUDA-graph
decode path (static buffers padded to a bucket) run eagerly, per-prompt sampling, teacher-forced
scoring, and torch.compile of the model body."""
import pytest
import torch

from kernels_reference.engine import LLM, SamplingParams
from kernels_reference.engine.block_manager import BlockManager
from kernels_reference.engine.scheduler import Scheduler
from kernels_reference.engine.sequence import Sequence, Status

transformers = pytest.importorskip("transformers")


def seq(i, n, max_tokens=4):
    return Sequence(i, list(range(1, n + 1)), n, max_tokens)


def test_block_manager_accounts_for_every_block():
    bm = BlockManager(num_blocks=4, block_size=4)
    a, b = seq(0, 6), seq(1, 9)
    bm.grow(a, 6)
    assert len(a.block_table) == 2 and len(bm.free_blocks) == 2
    assert not bm.can_grow(b, 9)
    a.num_cached = 6
    bm.grow(a, 2)  # fits in the second block's free slots
    assert len(a.block_table) == 2
    a.num_cached = 8
    bm.grow(a, 1)
    assert len(a.block_table) == 3
    bm.free(a)
    assert sorted(bm.free_blocks) == [0, 1, 2, 3] and a.block_table == [] and a.num_cached == 0
    with pytest.raises(RuntimeError, match="out of KV-cache blocks"):
        bm.grow(b, 17)


def test_scheduler_budget_chunking_and_decode_first():
    sched = Scheduler(BlockManager(64, 4), max_num_batched_tokens=8, chunked_prefill=True)
    long, short = seq(0, 13), seq(1, 3)
    sched.add(long)
    sched.add(short)
    batch = sched.schedule()
    assert [(s.seq_id, n) for s, n in batch] == [(0, 8)]  # the long prompt, chunked to the budget
    long.num_cached = 8
    batch = sched.schedule()
    assert [(s.seq_id, n) for s, n in batch] == [(0, 5), (1, 3)]
    long.num_cached, short.num_cached = 13, 3
    long.token_ids.append(7)
    short.token_ids.append(7)
    assert [(s.seq_id, n) for s, n in sched.schedule()] == [(0, 1), (1, 1)]  # decodes

    whole = Scheduler(BlockManager(64, 4), max_num_batched_tokens=8, chunked_prefill=False)
    whole.add(seq(2, 13))
    with pytest.raises(RuntimeError, match="never be scheduled"):
        whole.schedule()


def test_scheduler_preempts_when_blocks_run_out():
    sched = Scheduler(BlockManager(3, 4), max_num_batched_tokens=64)
    a, b = seq(0, 4), seq(1, 4)
    sched.add(a)
    sched.add(b)
    assert len(sched.schedule()) == 2
    a.num_cached = b.num_cached = 4
    a.token_ids.append(9)
    b.token_ids.append(9)
    batch = sched.schedule()  # each needs a new block; only one is free: b is preempted
    assert [(s.seq_id, n) for s, n in batch] == [(0, 1)]
    assert b.status is Status.WAITING and b.num_cached == 0 and sched.waiting[0] is b


def _tiny(arch="llama"):
    from test_hf_llama import CONFIGS

    torch.manual_seed(0)
    config = CONFIGS[arch]()
    hf = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    from kernels_reference.L4.llama import model_for

    ours = model_for(config)
    ours.load_weights(hf.state_dict().items())
    return hf.double(), ours.double()


PROMPTS = [[5, 17, 2, 88, 41, 3, 9], [7], [60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70, 71], [12, 40]]


def test_greedy_tokens_do_not_depend_on_batching_chunking_or_preemption():
    _, model = _tiny()
    params = SamplingParams(max_tokens=10)
    alone = [LLM(model, num_blocks=16, block_size=4, chunked_prefill=False).generate([p], params)[0]
             for p in PROMPTS]
    batched = LLM(model, num_blocks=64, block_size=4, max_num_batched_tokens=5).generate(PROMPTS, params)
    assert batched == alone
    tight = LLM(model, num_blocks=9, block_size=4, max_num_batched_tokens=6)  # forces preemption
    assert tight.generate(PROMPTS, params) == alone


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "mistral"])
def test_greedy_tokens_equal_hf_generate(arch):
    hf, model = _tiny(arch)
    ours = LLM(model, num_blocks=64, block_size=4, max_num_batched_tokens=8).generate(PROMPTS, SamplingParams(max_tokens=8))
    for prompt, out in zip(PROMPTS, ours):
        ref = hf.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False, min_new_tokens=8,
                          eos_token_id=None, pad_token_id=0)[0, len(prompt):].tolist()
        assert out == ref


def test_temperature_sampling_is_seeded():
    _, model = _tiny()
    llm = LLM(model, num_blocks=64, block_size=4)
    a = llm.generate(PROMPTS, SamplingParams(max_tokens=6, temperature=1.0, seed=3))
    b = llm.generate(PROMPTS, SamplingParams(max_tokens=6, temperature=1.0, seed=3))
    greedy = llm.generate(PROMPTS, SamplingParams(max_tokens=6))
    assert a == b and a != greedy


# ---- the decode path of CUDA graphs (static buffers padded to a bucket), run eagerly here -------

def test_graph_batch_sizes_and_bucket_choice():
    from kernels_reference.engine.decode_graphs import bucket_for, graph_batch_sizes

    assert graph_batch_sizes(64) == [1, 2, 4, 8, 16, 32, 48, 64]
    assert graph_batch_sizes(20) == [1, 2, 4, 8, 16, 20]
    assert graph_batch_sizes(5) == [1, 2, 4, 5] and graph_batch_sizes(1) == [1]
    sizes = graph_batch_sizes(64)
    assert [bucket_for(n, sizes) for n in (1, 2, 3, 5, 8, 9, 17, 33, 49, 64)] == [1, 2, 4, 8, 8, 16, 32, 48, 64, 64]
    assert bucket_for(65, sizes) is None
    with pytest.raises(ValueError):
        graph_batch_sizes(0)


def _spy_decoder(llm):
    """Records (sequences, bucket) of every step that took the padded path."""
    calls, run = [], llm.runner.decoder.run

    def spy(batch, graphs):
        calls.append((len(batch), llm.runner.decoder.bucket(len(batch))))
        return run(batch, graphs)

    llm.runner.decoder.run = spy
    return calls


def _caches(model, num_blocks):
    return [torch.stack([c[:num_blocks].clone() for c in layer.self_attn.attn.kv_cache])
            for layer in model.model.layers]


@pytest.mark.parametrize("num_prompts", [3, 5])
def test_padded_decode_path_gives_the_plain_path_tokens_and_cache(num_prompts):
    _, model = _tiny()
    prompts = (PROMPTS + [[3, 1, 4, 1, 5], [9, 2, 6]])[:num_prompts]
    params = SamplingParams(max_tokens=9)
    plain = LLM(model, num_blocks=64, block_size=4, max_num_batched_tokens=8)
    want = plain.generate(prompts, params)
    want_cache = _caches(model, 64)
    padded = LLM(model, num_blocks=64, block_size=4, max_num_batched_tokens=8, padded_decode=True, max_num_seqs=8)
    calls = _spy_decoder(padded)
    assert padded.generate(prompts, params) == want
    assert any(bucket > n for n, bucket in calls), calls  # padding rows really ran
    assert sum(n for n, _ in calls) >= num_prompts * params.max_tokens // 2  # most steps decode
    # Padding rows (slot -1, length 0) left every real block as the plain path wrote it.
    for got, ref in zip(_caches(model, 64), want_cache):
        torch.testing.assert_close(got, ref, rtol=1e-12, atol=1e-12)


def test_padded_decode_under_preemption_and_a_batch_beyond_the_buckets():
    _, model = _tiny()
    params = SamplingParams(max_tokens=10)
    want = LLM(model, num_blocks=64, block_size=4).generate(PROMPTS, params)
    tight = LLM(model, num_blocks=9, block_size=4, max_num_batched_tokens=6, padded_decode=True, max_num_seqs=4)
    assert tight.generate(PROMPTS, params) == want
    small = LLM(model, num_blocks=64, block_size=4, padded_decode=True, graph_batch_sizes=[1, 2])
    calls = _spy_decoder(small)
    assert small.generate(PROMPTS, params) == want  # 4 decoding sequences > bucket 2: eager steps
    assert all(n <= 2 for n, _ in calls)


def test_engine_arguments_are_checked():
    _, model = _tiny()
    with pytest.raises(ValueError, match="cuda_graphs=True needs a CUDA model"):
        LLM(model, cuda_graphs=True)
    with pytest.raises(ValueError, match="contradicts"):
        LLM(model, cuda_graphs=True, padded_decode=False)
    llm = LLM(model, num_blocks=64, block_size=4, max_model_len=12)
    with pytest.raises(ValueError, match="exceeds max_model_len=12"):
        llm.generate([[1] * 2, [1] * 8], SamplingParams(max_tokens=5))
    assert not llm.scheduler.has_work()  # nothing of a refused call stays queued
    assert len(llm.generate([[1] * 8], SamplingParams(max_tokens=4))[0]) == 4
    assert LLM(model, num_blocks=10, block_size=4).max_model_len == 40  # what the cache holds


def test_per_prompt_sampling_params_in_one_batch():
    _, model = _tiny()
    llm = LLM(model, num_blocks=64, block_size=4, padded_decode=True, max_num_seqs=8)
    greedy = SamplingParams(max_tokens=7)
    alone = llm.generate(PROMPTS, greedy)
    hot = [SamplingParams(max_tokens=5, temperature=2.0, seed=s) for s in (1, 2)]
    mixed = [greedy, hot[0], SamplingParams(max_tokens=3), hot[1]]
    first, second = llm.generate(PROMPTS, mixed), llm.generate(PROMPTS, mixed)
    assert first == second  # seeded rows reproduce
    assert first[0] == alone[0] and first[2] == alone[2][:3]  # greedy rows unaffected by their neighbours
    assert [len(o) for o in first] == [7, 5, 3, 5]
    assert (first[1], first[3]) != (alone[1][:5], alone[3][:5])  # temperature 2 on a tiny vocab: not greedy
    with pytest.raises(ValueError, match="4 prompts but 2 SamplingParams"):
        llm.generate(PROMPTS, hot)


def test_a_per_row_sampler_replacement_still_works():
    _, model = _tiny()
    llm = LLM(model, num_blocks=64, block_size=4)

    class Last:  # no sample_batch: the engine calls it once per row
        def reset(self):
            pass

        def __call__(self, logits, params):
            return logits.shape[-1] - 1

    llm.sampler = Last()
    out = llm.generate(PROMPTS, SamplingParams(max_tokens=3))
    assert out == [[model.config.vocab_size - 1] * 3] * len(PROMPTS)


def test_score_is_teacher_forced_greedy_through_the_engine():
    _, model = _tiny()
    outs = LLM(model, num_blocks=64, block_size=4).generate(PROMPTS, SamplingParams(max_tokens=6))
    seqs = [p + o for p, o in zip(PROMPTS, outs)]
    lens = [len(p) for p in PROMPTS]
    # Greedy outputs scored by the model that made them: every prediction is the given token.
    tight = LLM(model, num_blocks=9, block_size=4, max_num_batched_tokens=5)  # chunks and preemption
    assert tight.score(seqs, lens) == outs
    # Changing an earlier output token changes the predictions after it, not those before it.
    edited = [list(s) for s in seqs]
    edited[0][lens[0] + 1] = (edited[0][lens[0] + 1] + 1) % model.config.vocab_size
    got = LLM(model, num_blocks=64, block_size=4).score(edited, lens)
    assert got[0][:2] == outs[0][:2] and got[1:] == outs[1:]
    assert LLM(model, num_blocks=64, block_size=4).score([[4, 5, 6]], [3]) == [[]]
    with pytest.raises(ValueError, match="prompt_len 0 outside"):
        tight.score([[1, 2]], [0])


def test_scoring_crosses_chunk_boundaries_the_serving_budget_would_not():
    """``scoring_chunk_tokens`` splits scored prompts into chunks (more steps, the same greedy
    predictions) while generate, the timed path, keeps the serving budget."""
    _, model = _tiny()
    params = SamplingParams(max_tokens=6)
    outs = LLM(model, num_blocks=64, block_size=4).generate(PROMPTS, params)
    seqs, lens = [p + o for p, o in zip(PROMPTS, outs)], [len(p) for p in PROMPTS]
    whole, split = LLM(model, num_blocks=64, block_size=4), LLM(model, num_blocks=64, block_size=4,
                                                                 scoring_chunk_tokens=3)
    for llm in (whole, split):
        assert llm.score(seqs, lens) == outs and llm.score_decode(seqs, lens) == outs
    assert sum(split.runner.steps.values()) > sum(whole.runner.steps.values())
    assert split.scheduler.budget == whole.scheduler.budget == 2048  # restored after scoring
    whole.runner.steps.clear()
    split.runner.steps.clear()
    assert split.generate(PROMPTS, params) == whole.generate(PROMPTS, params) == outs
    assert split.runner.steps == whole.runner.steps  # the same steps: no chunking when serving
    with pytest.raises(ValueError, match="scoring_chunk_tokens must be a positive"):
        LLM(model, num_blocks=8, scoring_chunk_tokens=0)


def test_compile_gives_the_eager_tokens():
    """torch.compile of the body with the padded decode path (aot_eager backend: Dynamo and AOT
    tracing as Inductor gets them, without its slow C++ code generation on this CPU)."""
    _, model = _tiny()
    params = SamplingParams(max_tokens=5)
    want = LLM(model, num_blocks=64, block_size=4, max_num_batched_tokens=8).generate(PROMPTS, params)
    torch._dynamo.reset()
    llm = LLM(model, num_blocks=64, block_size=4, max_num_batched_tokens=8, padded_decode=True,
              max_num_seqs=4, compile={"backend": "aot_eager"})
    try:
        assert llm.generate(PROMPTS, params) == want
    finally:
        torch._dynamo.reset()


class _StandInGraph:
    """A CPU stand-in for a decode bucket's CUDA graph: an honest one runs the step on the static
    buffers; a dishonest one ignores their lengths (as a graph whose attention planned its work from
    stale host lengths)."""

    def __init__(self, decoder, size, honest):
        self.decoder, self.size, self.honest = decoder, size, honest

    def replay(self):
        d = self.decoder
        lens = d.seq_lens[:self.size].tolist() if self.honest else [0] * self.size
        d.out_logits[:self.size] = d._run_eager(self.size, lens)


def test_the_replay_path_and_its_check_against_eager():
    """CPU stand-ins for CUDA graphs: one replays honestly (runs the step on the static buffers),
    one ignores them (as a graph whose attention planned work from stale host lengths)."""
    _, model = _tiny()
    params = SamplingParams(max_tokens=6)
    want = LLM(model, num_blocks=64, block_size=4).generate(PROMPTS, params)

    for honest in (True, False):
        llm = LLM(model, num_blocks=64, block_size=4, padded_decode=True, max_num_seqs=4)
        llm.runner.cuda_graphs = True
        decoder = llm.runner.decoder
        decoder.graphs = {s: _StandInGraph(decoder, s, honest) for s in decoder.sizes}
        if honest:
            assert llm.generate(PROMPTS, params) == want
            assert decoder._checked  # each bucket used was checked once
        else:
            with pytest.raises(RuntimeError, match="disagrees with the same step run eagerly"):
                llm.generate(PROMPTS, params)


def test_the_replay_check_allows_a_step_its_own_spread_and_no_more():
    """A step that does not repeat bitwise (atomic adds; here the head's logits moved by a fresh
    3% at every run) makes an honest replay miss the 2e-2 bar against one eager run: the check
    measures the step against itself and allows that. A replay that ignores the lengths stays
    far outside it."""
    _, model = _tiny()
    params = SamplingParams(max_tokens=6)

    gen = torch.Generator().manual_seed(0)
    for honest in (True, False):
        llm = LLM(model, num_blocks=64, block_size=4, padded_decode=True, max_num_seqs=4)
        llm.runner.cuda_graphs = True
        decoder = llm.runner.decoder
        head = decoder.logits
        decoder.logits = lambda h, head=head: head(h) * (1 + 0.03 * torch.randn(h.shape[0], 1, generator=gen))
        decoder.graphs = {s: _StandInGraph(decoder, s, honest) for s in decoder.sizes}
        if honest:
            llm.generate(PROMPTS, params)
            assert decoder._checked
        else:
            with pytest.raises(RuntimeError, match=r"differ from the first by up to 0\.0\d+"):
                llm.generate(PROMPTS, params)


@pytest.mark.parametrize("engine_args", [
    dict(num_blocks=64, block_size=4),
    dict(num_blocks=9, block_size=4, max_num_batched_tokens=5),  # chunks, mixed steps, preemption
    dict(num_blocks=64, block_size=4, padded_decode=True, max_num_seqs=3),  # padded buckets 1, 2, 3
])
def test_decode_forced_scoring_of_greedy_output_replays_generate(engine_args):
    """The reference scored decode-forced on its own greedy output predicts every token it
    generated (the same steps run), through decode steps, not one packed prefill."""
    _, model = _tiny()
    outs = LLM(model, **engine_args).generate(PROMPTS, SamplingParams(max_tokens=7))
    seqs, lens = [p + o for p, o in zip(PROMPTS, outs)], [len(p) for p in PROMPTS]
    llm = LLM(model, **engine_args)
    assert llm.score_decode(seqs, lens) == outs
    decode_steps = sum(n for kind, n in llm.runner.steps.items() if kind.startswith("decode") or kind == "mixed")
    assert decode_steps >= 6 and "teacher-forced" not in llm.runner.steps
    if engine_args.get("padded_decode"):
        assert llm.runner.steps["decode-padded"] >= 6


def test_decode_forced_predictions_follow_the_given_tokens_not_the_model_samples():
    _, model = _tiny()
    outs = LLM(model, num_blocks=64, block_size=4).generate(PROMPTS, SamplingParams(max_tokens=6))
    seqs, lens = [p + o for p, o in zip(PROMPTS, outs)], [len(p) for p in PROMPTS]
    edited = [list(s) for s in seqs]
    edited[0][lens[0] + 1] = (edited[0][lens[0] + 1] + 1) % model.config.vocab_size
    got = LLM(model, num_blocks=64, block_size=4).score_decode(edited, lens)
    # The edited token is fed as given: predictions before it are unchanged, and they agree with
    # prefill-forced scoring of the same edited sequences at every position.
    assert got[0][:2] == outs[0][:2] and got[1:] == outs[1:]
    assert got == LLM(model, num_blocks=64, block_size=4).score(edited, lens)
    assert LLM(model, num_blocks=64, block_size=4).score_decode([[4, 5, 6]], [3]) == [[]]
    with pytest.raises(ValueError, match="prompt_len 0 outside"):
        LLM(model, num_blocks=64, block_size=4).score_decode([[1, 2]], [0])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: CUDA-graph decode")
def test_decode_forced_scoring_through_cuda_graphs_replays_generate():
    """On the GPU, decode-forced steps are graph replays at padded batch sizes; scoring the
    reference's own greedy output that way predicts every token it generated."""
    _, model = _tiny()
    model = model.to("cuda", torch.bfloat16)
    args = dict(num_blocks=64, block_size=4, cuda_graphs=True, max_num_seqs=3, max_num_batched_tokens=6)
    outs = LLM(model, **args).generate(PROMPTS, SamplingParams(max_tokens=9))
    llm = LLM(model, **args)
    assert llm.score_decode([p + o for p, o in zip(PROMPTS, outs)], [len(p) for p in PROMPTS]) == outs
    assert llm.runner.steps["decode-graph"] >= 8
