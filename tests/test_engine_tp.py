"""The engine at tensor-parallel degree 2 on the CPU (two gloo ranks, ``engine.tensor_parallel``):
rank 0 schedules and samples, rank 1 runs every step rank 0 sends it, and the tokens generated and
decode-forced are the single-process engine's, through chunked prefill, mixed batches and the
padded decode path."""
import pytest

from kernels_reference.engine import LLM, SamplingParams
from kernels_reference.engine.tensor_parallel import serve_rank

transformers = pytest.importorskip("transformers")

PROMPTS = [[5, 17, 2, 88, 41, 3, 9], [7], [60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70, 71], [12, 40]]
ENGINE = dict(num_blocks=64, block_size=4, max_num_batched_tokens=6, padded_decode=True)


def tiny_qwen3():
    """Qwen3's layout (q/k norms, 4 query heads over 2 KV heads), randomised as the engine tests
    randomise it, as a config and a full float64 checkpoint."""
    from test_engine import _tiny

    hf, model = _tiny("qwen3")
    return hf.config, model.state_dict()


def serve(llm: LLM, sequences):
    generated = llm.generate(PROMPTS, SamplingParams(max_tokens=6))
    lens = [len(p) for p in PROMPTS]
    return {"generated": generated, "decode_forced": llm.score_decode(sequences, lens),
            "steps": sum(llm.runner.steps.values())}


def engine_rank(rank, world, payload):
    from kernels_reference.L4.llama import model_for

    def make_model():  # this rank's shard: the layers read the degree when built, the loader cuts
        model = model_for(payload["config"]).double()
        model.load_weights(payload["state"].items())
        return model

    return serve_rank(rank, world, None, make_model, ENGINE, lambda llm: serve(llm, payload["sequences"]))


def test_engine_at_tp_2_serves_the_single_process_tokens():
    """Rank 0's greedy tokens are the single-process engine's; fed back decode-forced (a step per
    token through the padded decode path), the same tokens come out again (float64: no tie is
    close). Teacher-forced scoring runs the prefill path that generate's first step already ran."""
    from fk_pytest.tp_ranks import run_ranks
    from kernels_reference.L4.llama import model_for

    config, state = tiny_qwen3()
    model = model_for(config).double()
    model.load_weights(state.items())
    alone = LLM(model, **ENGINE).generate(PROMPTS, SamplingParams(max_tokens=6))
    sequences = [p + g for p, g in zip(PROMPTS, alone)]  # its own greedy output, forced back
    leader, follower = run_ranks(engine_rank, 2, {"config": config, "state": state, "sequences": sequences}, 120.0)
    assert leader["generated"] == leader["decode_forced"] == alone
    assert follower == leader["steps"] > 0  # rank 1 ran every step rank 0 ran
