"""End-to-end cases of the Llama-family LLMs: which models, which serving scenarios, how big.

Full profile: the real configs at full depth and vocabulary, the engine's serving scenarios shrunk
by ``FULL_SCALE`` (``--fk-e2e-scale``) so that one model's four scenarios fit a few GPU minutes.
CPU profile: Llama-3.1-8B cut to ``CPU_LAYERS`` layers and a 1/64 vocabulary shard (the real widths,
so the kernels see real rows), at most ``CPU_MAX_REQUESTS`` requests of at most ``CPU_MAX_PROMPT``
prompt tokens and ``CPU_OUTPUT`` output tokens: Triton candidates run interpreted there.
"""
from typing import List, Optional

import torch

from fk_pytest import Case
from fk_pytest.e2e import E2ESpec, Request
from kernels_reference.engine.scenarios import SCENARIOS
from kernels_reference.L4.llama import LlamaForCausalLM, init_random_weights

from .configs import load_config
from .paged import arch_config
from .workload import LLAMA_FAMILY, model_dtype

FULL_SCALE = 0.25
CPU_SCALE = 0.02
CPU_LAYERS, CPU_VOCAB_SHARD = 1, 64
CPU_MAX_REQUESTS, CPU_MAX_PROMPT, CPU_OUTPUT = 2, 16, 4
MODELS = {"cpu": ("llama-3.1-8b",), "full": LLAMA_FAMILY}
SCENARIO_NAMES = {"cpu": ("chat",), "full": ("chat", "long-context", "batch-1", "batch-32")}
WEIGHT_SEED = 0


class LlmE2E(E2ESpec):
    name = "llm_e2e"
    family = "llm"  # every Llama-architecture decoder LLM is one end-to-end family

    def cases(self, profile: str, scale: Optional[float] = None) -> List[Case]:
        scale = scale or (CPU_SCALE if profile == "cpu" else FULL_SCALE)
        cpu = profile == "cpu"
        return [Case(f"{model}-{scenario}", model_dtype(model), model=model,
                     params={"model": model, "scenario": scenario, "scale": scale, "profile": profile,
                             "layers": CPU_LAYERS if cpu else None,
                             "vocab_shard": CPU_VOCAB_SHARD if cpu else 1})
                for model in MODELS[profile] for scenario in SCENARIO_NAMES[profile]]

    def config(self, case):
        layers = case["layers"] or load_config(case["model"])["num_hidden_layers"]
        return arch_config(case["model"], layers, case["vocab_shard"])

    def build_reference(self, case, device) -> torch.nn.Module:
        """Random weights at a trained scale (as ``LLM.from_config``), seeded, in the model's dtype."""
        gen = torch.Generator(device=device).manual_seed(WEIGHT_SEED)
        with torch.device(device):
            model = LlamaForCausalLM(self.config(case))
        return init_random_weights(model, gen).to(case.dtype).eval()

    def requests(self, case) -> List[Request]:
        reqs = SCENARIOS[case["scenario"]].requests(self.config(case).vocab_size, seed=0, scale=case["scale"])
        if case["profile"] == "cpu":
            reqs = [(p[:CPU_MAX_PROMPT], CPU_OUTPUT) for p, _ in reqs[:CPU_MAX_REQUESTS]]
        return reqs

    def engine_args(self, case) -> dict:
        args = dict(SCENARIOS[case["scenario"]].engine_args)
        block = args.setdefault("block_size", 16)
        need = sum(-(-(len(p) + n) // block) for p, n in self.requests(case)) + 1
        args["num_blocks"] = need  # every request whole at once: no preemption changes the steps
        if case["profile"] == "cpu":
            args["max_num_batched_tokens"] = 32  # CPU prompts are tiny: keep chunked prefill in play
        return args

    def rebatched_engine_args(self, case) -> dict:
        """Another token budget (odd, so chunk boundaries move) and batch size: the steps, GEMM
        shapes and reduction orders change, the semantics do not."""
        args = self.engine_args(case)
        args.update(max_num_batched_tokens=max(8, args["max_num_batched_tokens"] // 3 + 1),
                    max_num_seqs=max(1, min(args.get("max_num_seqs", 64), len(self.requests(case))) // 2 + 1),
                    chunked_prefill=True)
        return args


E2E = LlmE2E()
