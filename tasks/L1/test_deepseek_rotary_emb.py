"""DeepseekScalingRotaryEmbedding (vLLM's, DeepSeek-V2's YaRN rope), interleaved style.

Production (``DeepseekV2MLAAttention``) passes the rope part of every query head, ``q[..., nope:]``
of the [T, heads, nope + rope] q projection (a per-head strided view), and the one shared rope key
``k_pe`` [T, 1, rope], a column slice of the kv_a_proj_with_mqa output; both are rotated in place.
Positions range over YaRN's extended context (DeepSeek-V2-Lite: 40 x 4096 = 163840).
"""
import torch
from hypothesis import strategies as st

from fk_pytest import Case, Task, standard_tests
from fk_pytest.fuzz import token_counts
from fk_pytest.task import DTYPE_NAMES
from kernels_reference.L1.deepseek_rotary_emb import DeepseekScalingRotaryEmbedding

from ..configs import load_config
from ..mla import MLA_MODEL, mla_dims
from ..workload import HAND_PICKED_WEIGHT, activations, fuzz_cap, model_dtype

TOKENS = {"cpu": {"decode": (1, 7), "prefill": (33,)},
          "full": {"decode": (1, 32, 128), "prefill": (1024, 8192, 16384)}}


def yarn_params(cfg) -> dict:
    s = cfg["rope_scaling"]
    return dict(max_pos=s["original_max_position_embeddings"], base=float(cfg["rope_theta"]),
                factor=float(s["factor"]), beta_fast=s["beta_fast"], beta_slow=s["beta_slow"],
                mscale=s["mscale"], mscale_all_dim=s["mscale_all_dim"], neox=False)


class DeepseekRotaryEmbeddingTask(Task):
    name = "deepseek_rotary_emb"
    level = 1
    family = "rope"
    module_path = "L1/deepseek_rotary_emb.py"
    reference = DeepseekScalingRotaryEmbedding
    may_mutate = ("query", "key")  # vLLM rotates in place and returns the same tensors

    def cases(self, profile):
        cfg = load_config(MLA_MODEL)
        dims = mla_dims(MLA_MODEL, "full")  # all 16 heads: the rope is cheap even interpreted
        out = []
        for phase, counts in TOKENS[profile].items():
            for t in counts:
                weight = HAND_PICKED_WEIGHT if t >= 16384 else 1.0
                params = dict(yarn_params(cfg), heads=dims["heads"], nope=dims["nope"], rope=dims["rope"],
                              tokens=t, phase=phase)
                out.append(Case(f"{MLA_MODEL}-{phase}-T{t}-bf16", model_dtype(MLA_MODEL), model=MLA_MODEL,
                                params=params, weight=weight))
        return out

    def init_args(self, case):
        return dict(head_size=case["rope"], rotary_dim=case["rope"], max_position_embeddings=case["max_pos"],
                    base=case["base"], is_neox_style=case["neox"], scaling_factor=case["factor"],
                    beta_fast=case["beta_fast"], beta_slow=case["beta_slow"], mscale=case["mscale"],
                    mscale_all_dim=case["mscale_all_dim"])

    def make_inputs(self, case, gen, device):
        t, h, nope, rope = case["tokens"], case["heads"], case["nope"], case["rope"]
        limit = int(case["max_pos"] * case["factor"])
        if case["phase"] == "prefill" and t <= limit:
            start = int(torch.randint(0, limit - t + 1, (1,), generator=gen, device=device))
            positions = torch.arange(start, start + t, device=device)
        else:
            positions = torch.randint(0, limit, (t,), generator=gen, device=device)
        q = activations((t, h, nope + rope), gen, device, case.dtype)
        latent = activations((t, 8 * rope + rope), gen, device, case.dtype)  # [kv_c | k_pe] rows
        return {"positions": positions, "query": q[..., nope:], "key": latent[:, None, 8 * rope:]}

    def output_names(self, case):
        return ("query", "key")

    def fuzz_strategy(self, dtype, profile):
        @st.composite
        def draw_case(draw):
            rope = draw(st.sampled_from([32, 64]))
            heads = draw(st.integers(1, 32))
            nope = draw(st.sampled_from([0, 64, 128]))
            t = fuzz_cap(draw(token_counts(512)), heads * (nope + rope), profile)
            mscale, mscale_all = draw(st.sampled_from([(0.707, 0.707), (1.0, 0.0), (1.0, 0.707)]))
            params = dict(max_pos=draw(st.sampled_from([2048, 4096])), base=draw(st.sampled_from([10000.0, 50000.0])),
                          factor=float(draw(st.sampled_from([1, 4, 40]))), beta_fast=32, beta_slow=1,
                          mscale=mscale, mscale_all_dim=mscale_all, neox=draw(st.booleans()), heads=heads,
                          nope=nope, rope=rope, tokens=t, phase=draw(st.sampled_from(["decode", "prefill"])))
            desc = (f"rot{rope}-h{heads}-nope{nope}-T{t}-f{params['factor']:g}-m{mscale}-{mscale_all}-"
                    f"{'neox' if params['neox'] else 'gptj'}")
            return Case(f"fuzz-{desc}-{DTYPE_NAMES[dtype]}", dtype, params=params)

        return draw_case()

    def io_bytes(self, case):
        t = case["tokens"]
        rotated = 2 * t * (case["heads"] + 1) * case["rope"] * torch.finfo(case.dtype).bits // 8
        return rotated + t * 8 + t * case["rope"] * 4

    def flops(self, case):
        return 3 * case["tokens"] * (case["heads"] + 1) * case["rope"]


TASK = DeepseekRotaryEmbeddingTask()
test_correctness, test_fuzz, test_speed = standard_tests(TASK)
