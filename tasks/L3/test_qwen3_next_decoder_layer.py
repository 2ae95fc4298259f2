"""Qwen3NextDecoderLayer (L3, vLLM): zero-centred RMSNorm with the residual add fused, the token
mixer, the second fused norm, and the MoE block with its shared expert; ``(hidden_states, residual)
-> (hidden_states, residual)`` over one engine step (``tasks/qwen3_next_layers.py``). On the full
profile the steps are the Qwen3-Next capture's representative ones (``captured_layer_step_seqs``, as
the attention tasks run) plus the hand-picked varlen prefill at a token weight, each case weighted
by its step's share times its kind's share of the layers (``layer_kind_shares``: 36 linear, 12
full); the CPU profile keeps two hand-picked steps.

One task, both layer kinds as cases (``linear`` = layer 0 of the 3 : 1 pattern, a gated DeltaNet;
``full`` = layer 3, gated attention): the class and its checkpoint are one, and the kind is the
config's ``layer_types`` entry, so a candidate must handle both. The memory a case hands the layer
follows its kind: a linear case binds the two state pools (inputs and in-place outputs, spare slots
unchanged, fresh slots' garbage unread), a full case the paged K/V cache pair. The task is a
StateTask and a PagedTask whose per-layer counts (``state_layers``, ``layers``) are set per case on
a copy of the task (``for_case``); the call picks the copy from the inputs it is given (pools or
caches), since the call has no case.

Routing-aware correctness: the MoE block is the layer's last step, so an undetermined token leaves
out only its own output row (``tasks/moe.py`` token rule). The full profile scores in float32
(``float32_cases``, as Qwen3-MoE's layer): on the H200 (2026-12-04) the bf16 reference's own
deviation after a gated DeltaNet left every token of a 4096-token prefill undetermined (the 10th and
11th of 512 experts are closer than that deviation); the bf16 MoE block is scored at L2.
"""
import copy

from fk_pytest import standard_tests
from kernels_reference.L3.qwen3_next_decoder_layer import Qwen3NextDecoderLayer

from ..linear_inputs import GATED_DELTA_MODELS, captured_layer_step_seqs
from ..moe import float32_cases, token_rule
from ..paged import PagedTask
from ..qwen3_next_layers import Qwen3NextStackTask, layer_flops, layer_weight_bytes, step_case, steps
from ..state_steps import StateTask
from ..workload import activations, model_dtype
from ..workloads import layer_kind_shares

LAYER_OF_KIND = {"linear": 0, "full": 3}  # the first layer of each kind in the 3 : 1 pattern
KIND_NAMES = {"linear": "linear_attention", "full": "full_attention"}  # the config's layer_types


class Qwen3NextDecoderLayerTask(Qwen3NextStackTask, StateTask, PagedTask):
    name = "qwen3_next_decoder_layer"
    level = 3
    family = "layer"
    module_path = "L3/qwen3_next_decoder_layer.py"
    reference = Qwen3NextDecoderLayer
    undetermined_rows = token_rule(("hidden_states",))
    fuzz_dtypes = ("bf16",)  # the served dtype

    def cases(self, profile):
        out = []
        for model in GATED_DELTA_MODELS:
            # On the full profile each kind runs the model's captured steps, weighted by the step's
            # share and the kind's share of the layers (three linear to one full in Qwen3-Next).
            shares = (layer_kind_shares(model) if profile == "full" else None) or {}
            for kind in LAYER_OF_KIND:
                share = shares.get(KIND_NAMES[kind], 1.0)
                for name, seqs, weight, source in captured_layer_step_seqs(model, profile, steps(profile)):
                    out.append(step_case(model, f"{kind}-{name}", seqs, model_dtype(model),
                                         dict(profile=profile, layer_type=kind, source=source),
                                         weight=weight * share))
        return float32_cases(out) if profile == "full" else out

    # ---- the layer kind decides the memory a case binds -------------------------------------------
    def for_case(self, case) -> "Qwen3NextDecoderLayerTask":
        return self._with_counts(linear=case["layer_type"] == "linear")

    def _with_counts(self, linear: bool) -> "Qwen3NextDecoderLayerTask":
        view = copy.copy(self)
        view.state_layers, view.layers = (1, 0) if linear else (0, 1)
        return view

    def init_args(self, case):
        return {"config": self.config(case), "layer_idx": LAYER_OF_KIND[case["layer_type"]]}

    def make_inputs(self, case, gen, device):
        view = self.for_case(case)
        inputs = view.add_state_pools(case, view.metadata_and_caches(case, gen, device), gen, device)
        shape = (sum(case["query"]), self.config(case).hidden_size)
        inputs["positions"] = inputs["metadata"].positions()
        inputs["hidden_states"] = activations(shape, gen, device, case.dtype)
        # The residual stream grows over the layers: larger than one block's output.
        inputs["residual"] = activations(shape, gen, device, case.dtype, scale=4.0)
        return inputs

    def call(self, module, inputs, method=None):
        view = self._with_counts(linear=self.pool_names()[0] in inputs)
        return StateTask.call(view, module, inputs, method)

    def output_names(self, case):
        return ("hidden_states", "residual")

    def inplace_outputs(self, case):
        return StateTask.inplace_outputs(self.for_case(case), case)

    def mutable_inputs(self, case):
        return StateTask.mutable_inputs(self.for_case(case), case) + ("hidden_states", "residual")

    # ---- cost -------------------------------------------------------------------------------------
    def _kind(self, case) -> str:
        return KIND_NAMES[case["layer_type"]]

    def io_bytes(self, case):
        act = 4 * sum(case["query"]) * self.config(case).hidden_size * case.dtype.itemsize
        attention = self.for_case(case).attention_io(case) if case["layer_type"] == "full" else 0
        return layer_weight_bytes(self.config(case), case, self._kind(case)) + act + attention

    def flops(self, case):
        attention = self.for_case(case).attention_flops(case) if case["layer_type"] == "full" else 0
        return layer_flops(self.config(case), case, self._kind(case)) + attention


TASK = Qwen3NextDecoderLayerTask()
test_correctness, test_fuzz, test_speed = standard_tests(TASK)
