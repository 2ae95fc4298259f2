"""Engine steps of layers that carry a state per sequence (Mamba-2's mixer, Qwen3-Next's gated
DeltaNet, GLA's layer, and the layers and models built on them).

Such a layer keeps, per sequence, a conv window and a recurrent state, each in a pool of slots that
it binds as ``state_cache = (conv_states, ssm_states)`` (as attention layers bind ``kv_cache``);
the step's metadata names each sequence's slot (``state_slots``) and whether it continues a state
(``has_initial_state``). A case is one step: ``context`` tokens already folded into each sequence's
state and ``query`` new tokens, decodes first (vLLM's order). The pools are inputs and in-place
outputs compared whole: every slot starts with random contents (the state of a continuing sequence,
and garbage that must not leak into a fresh one), and spare slots no sequence owns must come back
unchanged.

``StateTask`` gives the pools, their binding and the forward context; a task says how big a slot's
states are (``state_shapes``). A layer without a short convolution (GLA) keeps its recurrent state
alone: its task sets ``state_kinds = ("recurrent",)`` and the layer binds ``state_cache =
(recurrent_states,)``. RWKV-7's time-mix layer carries a token-shift row (the sequence's last
hidden state, [hidden] in the activation dtype) where a conv window would be: ``state_kinds =
("shift", "recurrent")``, ``state_shapes`` giving (hidden,) as the first shape, and the layer binds
``state_cache = (shift_states, recurrent_states)``. A hybrid with attention layers also derives from
:class:`tasks.paged.PagedTask` (listed after ``StateTask``), which adds the paged KV caches.
"""
import dataclasses
from typing import Dict, Optional, Tuple

import torch

from fk_pytest import Task
from kernels_reference.forward_context import AttentionMetadata, set_forward_context

from .workload import activations

SPARE_SLOTS = 3  # pool slots no sequence of the step owns: they must come back unchanged
BLOCK_SIZE = 16  # the metadata's block tables (only attention layers read them)


class StateTask(Task):
    state_layers = 1  # layers with a state_cache, in module order
    # The pools of one layer's state_cache, in binding order: a conv window and a recurrent state,
    # or (a layer without a conv) one kind naming the recurrent state alone.
    state_kinds: Tuple[str, ...] = ("conv", "ssm")

    def state_shapes(self, case) -> Tuple[Optional[Tuple[int, ...]], Tuple[int, ...], float]:
        """(conv window shape (a token-shift row's for RWKV-7; None without either), recurrent state
        shape) of one slot, and the state's typical scale."""
        raise NotImplementedError

    def pool_names(self) -> Tuple[str, ...]:
        if self.state_layers == 1:
            return tuple(f"{kind}_states" for kind in self.state_kinds)
        return tuple(f"{kind}_states_{i}" for i in range(self.state_layers) for kind in self.state_kinds)

    def step_inputs(self, case, gen, device) -> Dict:
        """The step's metadata (with state slots) and the state pools."""
        meta = AttentionMetadata.build(case["context"], case["query"], BLOCK_SIZE, device=device)
        return self.add_state_pools(case, {"metadata": meta}, gen, device)

    def layer_step_inputs(self, case, gen, device, hidden_size: int) -> Dict:
        """An L2 layer's step: :meth:`step_inputs` and the step's hidden states (one row per token)."""
        inputs = self.step_inputs(case, gen, device)
        inputs["hidden_states"] = activations((sum(case["query"]), hidden_size), gen, device, case.dtype)
        return inputs

    def add_state_pools(self, case, inputs: Dict, gen, device) -> Dict:
        """Give the step's sequences random slots of pools with spare slots, and fill every slot."""
        batch = len(case["query"])
        pool = batch + SPARE_SLOTS
        slots = torch.randperm(pool, generator=gen, device=device)[:batch].to(torch.int32)
        inputs["metadata"] = dataclasses.replace(inputs["metadata"], state_slots=slots)
        conv_shape, ssm_shape, ssm_scale = self.state_shapes(case)
        names, per_layer = self.pool_names(), len(self.state_kinds)
        for i in range(self.state_layers):
            layer_names = names[per_layer * i: per_layer * (i + 1)]
            if per_layer == 2:
                # A conv window holds earlier projected rows, a token-shift row an earlier hidden state (unit scale)
                inputs[layer_names[0]] = activations((pool, *conv_shape), gen, device, case.dtype)
            # a recurrent state the scale the layer's decay builds up; float32, as the engines keep it.
            inputs[layer_names[-1]] = ssm_scale * torch.randn((pool, *ssm_shape), generator=gen, device=device)
        return inputs

    def inplace_outputs(self, case):
        return tuple(super().inplace_outputs(case)) + self.pool_names()

    def mutable_inputs(self, case):
        return tuple(super().mutable_inputs(case)) + self.pool_names()

    def call(self, module, inputs, method=None):
        names = self.pool_names()
        layers = [m for m in module.modules() if hasattr(m, "state_cache")]
        if not layers and self.state_layers == 1:
            layers = [module]  # a block that reads its pools from an attribute set here
        if len(layers) != self.state_layers:
            raise ValueError(f"{type(module).__name__} has {len(layers)} layers with a state_cache, "
                             f"the task binds {self.state_layers}")
        per_layer = len(self.state_kinds)
        for i, layer in enumerate(layers):
            layer.state_cache = tuple(inputs[n] for n in names[per_layer * i: per_layer * (i + 1)])
        rest = {k: v for k, v in inputs.items() if k not in names}
        if "metadata" in rest and not _sets_its_own_context(self):
            meta = rest.pop("metadata")
            with set_forward_context(meta):
                return super().call(module, rest, method)
        return super().call(module, rest, method)


def _sets_its_own_context(task) -> bool:
    from .paged import PagedTask
    return isinstance(task, PagedTask)


@torch.no_grad()
def logits_over_steps(model, ids, steps, slots, block_size, tables=None, method="forward_native"):
    """Feed ``model`` the steps ``(sequences, tokens each)`` of token ids through its bound state
    pools (slot ``slots[s]`` per sequence) and, with ``tables``, its paged KV caches; each
    sequence's logits, concatenated over the steps."""
    done = {s: 0 for s in ids}
    got = {s: [] for s in ids}
    device = next(iter(ids.values())).device  # the metadata lives where the kernels read it
    for seqs, counts in steps:
        meta = AttentionMetadata.build([done[s] for s in seqs], list(counts), block_size, device=device,
                                       block_tables=[tables[s] for s in seqs] if tables else None,
                                       state_slots=[slots[s] for s in seqs])
        batch = torch.cat([ids[s][done[s]: done[s] + n] for s, n in zip(seqs, counts)])
        with set_forward_context(meta):
            hidden = getattr(model, method)(batch, meta.positions())
        logits = model.compute_logits(hidden, native=method == "forward_native")
        for s, part in zip(seqs, logits.split(list(counts))):
            got[s].append(part)
            done[s] += part.shape[0]
    return {s: torch.cat(parts) for s, parts in got.items()}


@torch.no_grad()
def draw_hf_state_model(hf, gen, centred_norms: bool):
    """An HF Qwen3-Next or Mamba-2 model's parameters at a trained scale: decay rates (``A_log``)
    from slow to fast; the plain RMSNorm weights near 1 (every norm of Mamba-2; Qwen3-Next's gated
    norm, ``linear_attn.norm``); other vectors near 0 (dt_bias, D, conv biases, and with
    ``centred_norms`` Qwen3-Next's zero-centred norms, whose scale is ``1 + w``); unit-size
    embedding rows; matrices, conv taps and stacked experts ([E, out, in]: fan_in is last) at
    1/sqrt(fan_in)."""
    def draw(shape):  # on the generator's device: a full-width model draws on the GPU in seconds
        return torch.randn(shape, generator=gen, device=gen.device)

    for name, p in hf.named_parameters():
        plain_norm = name.endswith("norm.weight") and (not centred_norms or name.endswith("linear_attn.norm.weight"))
        if name.endswith("A_log"):
            p.copy_(torch.linspace(0.02, 4.0, p.numel()).log().view(p.shape))
        elif plain_norm or name.endswith("norm_f.weight"):
            p.copy_(1.0 + 0.3 * draw(p.shape))
        elif p.dim() == 1:
            p.copy_(0.3 * draw(p.shape))
        elif name.endswith(("embed_tokens.weight", "embeddings.weight")):
            p.copy_(draw(p.shape))
        else:
            p.copy_(draw(p.shape) * p.shape[-1] ** -0.5)
    return hf

