"""The engine on tiny models on the CPU: block manager, scheduler, and greedy tokens that do not
depend on batching, chunking or preemption, and equal HF transformers' generate."""
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
