"""Workload pieces shared by the linear-attention and hybrid tasks (Mamba-2, Qwen3-Next's gated
DeltaNet): each model's layer dimensions, the batches of sequences a case runs, and cu_seqlens.

A scan's numerics change where a sequence crosses a chunk boundary and where a state is carried in,
so the cases are batches of sequence lengths, not token counts: variable-length prefill batches
whose lengths sit on both sides of the kernel's chunk (1, chunk - 1, chunk, chunk + 1, several
chunks), with and without an initial state per sequence, and decode batches (one token per
sequence, the state carried from earlier steps). On the full profile a model with a captured
serving workload (``tasks/workloads``: Mamba-2, Qwen3-Next) runs the representatives of its
captured calls instead, weighted by their shares (``captured_state_calls``), plus the hand-picked
chunk-edge batch and 32k-token sequence at a token weight (the edges are where scans go wrong; no
captured step reaches 32k tokens in one call). Elsewhere every case is hand-picked.

The CPU profile keeps the head counts small (Triton kernels run interpreted there) but the
per-head dimensions and chunk sizes real, so what is scanned per head is what a GPU scans.
"""
import dataclasses
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from .configs import load_config
from .workload import HAND_PICKED_WEIGHT

GATED_DELTA_MODELS = ("qwen3-next-80b-a3b",)
MAMBA2_MODELS = ("mamba2-2.7b",)
LINEAR_MODELS = GATED_DELTA_MODELS + MAMBA2_MODELS

# Chunk length of the chunked kernels: flash-linear-attention's gated delta rule uses 64; Mamba-2's
# is a config value (256 in mamba2-2.7b).
GATED_DELTA_CHUNK = 64


@dataclasses.dataclass(frozen=True)
class GatedDeltaDims:
    """Qwen3-Next's linear-attention layer (``Qwen3NextGatedDeltaNet``)."""
    hidden_size: int
    num_k_heads: int
    num_v_heads: int
    head_k_dim: int
    head_v_dim: int
    conv_kernel: int
    eps: float

    @property
    def key_dim(self) -> int:
        return self.num_k_heads * self.head_k_dim

    @property
    def value_dim(self) -> int:
        return self.num_v_heads * self.head_v_dim

    @property
    def conv_dim(self) -> int:  # q, k and v go through the short convolution together
        return 2 * self.key_dim + self.value_dim


@dataclasses.dataclass(frozen=True)
class Mamba2Dims:
    """Mamba-2's mixer (``MambaMixer2``)."""
    hidden_size: int
    num_heads: int
    head_dim: int
    state_size: int
    n_groups: int
    conv_kernel: int
    chunk_size: int
    eps: float

    @property
    def intermediate_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def conv_dim(self) -> int:  # x, B and C go through the short convolution together
        return self.intermediate_size + 2 * self.n_groups * self.state_size


# Head counts of the CPU profile: the per-head sizes stay real, the heads are few.
CPU_HEADS = {"qwen3-next-80b-a3b": (2, 4), "mamba2-2.7b": 4}


def gated_delta_dims(model: str, profile: str = "full") -> GatedDeltaDims:
    cfg = load_config(model)
    k_heads, v_heads = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    if profile == "cpu":
        k_heads, v_heads = CPU_HEADS[model]
    return GatedDeltaDims(cfg["hidden_size"], k_heads, v_heads, cfg["linear_key_head_dim"],
                          cfg["linear_value_head_dim"], cfg["linear_conv_kernel_dim"], cfg["rms_norm_eps"])


def mamba2_dims(model: str, profile: str = "full") -> Mamba2Dims:
    cfg = load_config(model)
    heads = CPU_HEADS[model] if profile == "cpu" else cfg["num_heads"]
    return Mamba2Dims(cfg["hidden_size"], heads, cfg["head_dim"], cfg["state_size"], cfg["n_groups"],
                      cfg["conv_kernel"], cfg["chunk_size"], cfg["layer_norm_epsilon"])


def prefill_batches(chunk: int, profile: str) -> List[Tuple[str, Tuple[int, ...]]]:
    """(name, sequence lengths) of the prefill cases of a kernel whose chunk is ``chunk`` tokens.

    One long sequence; one variable-length batch whose lengths straddle the chunk boundary; on the
    full profile a serving-sized mixed batch and a 32k-token sequence (the speed regime)."""
    edge = (1, chunk - 1, chunk, chunk + 1)
    if profile == "cpu":
        return [("one", (2 * chunk + 3,)), ("varlen", edge)]
    return [("one", (4096,)), ("varlen", edge + (3 * chunk + 5, 1000)),
            ("mixed", (512, 2048, 8192, 77, 1500)), ("long", (32768,))]


def decode_batches(profile: str) -> List[Tuple[str, int]]:
    """(name, sequences) of the decode cases: one new token per sequence, each carrying a state."""
    return [("B1", 1), ("B3", 3)] if profile == "cpu" else [("B1", 1), ("B32", 32), ("B128", 128), ("B256", 256)]

CAPTURED_STATE_CALLS = 4  # representative captured calls per phase of a state kernel (full profile)
HAND_PICKED_STATE_BATCHES = ("varlen", "long")  # kept beside a capture, at HAND_PICKED_WEIGHT


def captured_state_calls(model: str, profile: str, phases: Tuple[str, ...] = ("prefill", "decode")
                         ) -> Optional[List[Tuple[str, str, Tuple[int, ...], Tuple[bool, ...], float]]]:
    """(id part, phase, lengths, carried per sequence, weight) of the representative captured calls
    of a state kernel that runs ``phases``; None where hand-picked cases apply (the CPU profile, or
    no capture of ``model``). A prefill call is one step's prefill chunks (carried: the sequence has
    context, so an initial state); a decode call is one step's decodes."""
    from .workloads import load_capture, state_call_representatives

    if profile == "cpu" or load_capture(model) is None:
        return None
    out, seen = [], set()
    for phase, lengths, carried, weight in state_call_representatives(model, tuple(phases), CAPTURED_STATE_CALLS):
        ident = f"{phase}-B{len(lengths)}" + ("" if phase == "decode" else f"-Q{sum(lengths)}")
        ident += "" if phase == "decode" else f"-carry{sum(carried)}"  # a decode always carries
        base, n = ident, 2
        while ident in seen:  # two representatives alike in these numbers (different lengths)
            ident, n = f"{base}-v{n}", n + 1
        seen.add(ident)
        out.append((ident, phase, lengths, carried, weight))
    return out


def kept_prefill_batches(chunk: int, profile: str, captured) -> List[Tuple[str, Tuple[int, ...], float]]:
    """(name, lengths, weight) of the hand-picked prefill batches a scan task runs: all of them,
    weighted 1, without a capture (``captured`` None); beside one, only HAND_PICKED_STATE_BATCHES,
    at HAND_PICKED_WEIGHT."""
    if captured is None:
        return [(name, lengths, 1.0) for name, lengths in prefill_batches(chunk, profile)]
    return [(name, lengths, HAND_PICKED_WEIGHT) for name, lengths in prefill_batches(chunk, profile)
            if name in HAND_PICKED_STATE_BATCHES]


def captured_layer_steps(model: str, profile: str, hand: List[Tuple[str, List[int], List[int]]]
                         ) -> List[Tuple[str, List[int], List[int], float, str]]:
    """(name, context lens, query lens, weight, source) of the steps an L2/L3 state layer's task runs: on the
    full profile with a capture of ``model``, its representative captured steps (the same ones the
    attention tasks run, weighted by their share) and the ``hand`` steps named after
    HAND_PICKED_STATE_BATCHES at HAND_PICKED_WEIGHT; otherwise ``hand``, weighted 1."""
    from .paged import CAPTURED_BATCHES
    from .workloads import batch_name, batch_representatives, load_capture

    if profile == "cpu" or load_capture(model) is None:
        return [(name, ctx, q, 1.0, "hand-picked") for name, ctx, q in hand]
    out = [(batch_name(phase, ctx, q), list(ctx), list(q), w, "captured")
           for phase, ctx, q, w in batch_representatives(model, CAPTURED_BATCHES)]
    return out + [(name, ctx, q, HAND_PICKED_WEIGHT, "hand-picked") for name, ctx, q in hand
                  if any(name == f"prefill-{kept}" for kept in HAND_PICKED_STATE_BATCHES)]


def captured_layer_step_seqs(model: str, profile: str, hand: Sequence[Tuple[str, Sequence[Tuple[int, int]]]]
                             ) -> List[Tuple[str, List[Tuple[int, int]], float, str]]:
    """:func:`captured_layer_steps` for tasks that describe a step as (context, query) per sequence:
    (name, seqs, weight, source)."""
    lists = [(name, [c for c, _ in seqs], [q for _, q in seqs]) for name, seqs in hand]
    return [(name, list(zip(ctx, q)), weight, source)
            for name, ctx, q, weight, source in captured_layer_steps(model, profile, lists)]


def continuing_contexts(count: int, salt: int) -> List[int]:
    """Tokens already seen by continuing sequences: varied, some inside a chunk, some past several."""
    return [1 + (37 * (i + salt) + 11) % 300 for i in range(count)]


def layer_steps(chunk: int, profile: str) -> List[Tuple[str, List[int], List[int]]]:
    """(name, context lens, query lens) of the engine steps an L2 linear-attention layer's cases
    run: the kernel's prefill batches with fresh and continuing sequences alternating, the decode
    batches, and a mixed step (decodes first)."""
    out = []
    for name, lengths in prefill_batches(chunk, profile):
        if profile == "cpu" and name == "one":  # the varlen batch carries the CPU's chunk edges
            continue
        cont = continuing_contexts(len(lengths), 0)
        # alternate fresh and continuing sequences (the first, a 1-token prompt on the edge batch, fresh)
        out.append((f"prefill-{name}", [0 if i % 2 == 0 else c for i, c in enumerate(cont)], list(lengths)))
    for name, n in decode_batches(profile):
        out.append((f"decode-{name}", continuing_contexts(n, 1), [1] * n))
    decodes, prefills = (2, (23, 66)) if profile == "cpu" else (32, (512, 1500))
    out.append((f"mixed-D{decodes}-P{len(prefills)}", continuing_contexts(decodes, 2) + [0, 45],
                [1] * decodes + list(prefills)))
    return out

def draw_layer_step(draw, profile: str, edge_lengths: Sequence[int]) -> Tuple[List[int], List[int], str]:
    """A fuzzed engine step of an L2 linear-attention layer (inside a hypothesis ``composite``):
    up to 3 decodes on the CPU (64 on the full profile) before 0-2 prefills whose lengths sit on
    the kernel's edges or anywhere up to 150 (5000) tokens, fresh or continuing. Returns (context
    lens, query lens, an id for the case)."""
    from hypothesis import strategies as st

    longest = 150 if profile == "cpu" else 5000
    decodes = draw(st.integers(0, 3 if profile == "cpu" else 64))
    prefills = draw(st.integers(0 if decodes else 1, 2))
    length = st.one_of(st.sampled_from(list(edge_lengths)), st.integers(1, longest))
    query = [1] * decodes + [draw(length) for _ in range(prefills)]
    context = ([draw(st.integers(1, 500)) for _ in range(decodes)]
               + [draw(st.sampled_from([0, 0, 1, 3, 64, 200])) for _ in range(prefills)])
    ident = "_".join(f"{c}+{q}" for c, q in zip(context, query)) if len(query) <= 4 else f"{len(query)}seqs"
    return context, query, ident




def cu_seqlens(lengths: Sequence[int], device) -> torch.Tensor:
    """int32 [len(lengths) + 1] offsets of each sequence in the packed token dimension."""
    out = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    out[1:] = torch.cumsum(torch.tensor(list(lengths), dtype=torch.int64), 0).to(torch.int32)
    return out.to(device)


def zero_centred_norm_weights(module: torch.nn.Module, gen: torch.Generator) -> None:
    """Draw the weights of every zero-centred norm in ``module`` (``GemmaRMSNorm``: the scale is
    ``1 + w``) near zero, as trained ones are: a kernel that scales by ``w`` alone is then far off."""
    from kernels_reference.L1.gemma_rms_norm import GemmaRMSNorm
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, GemmaRMSNorm):
                m.weight.copy_(0.2 * torch.randn(m.weight.shape, generator=gen, device=m.weight.device))


# ---- the cases of a scan kernel's task (prefill from fresh and carried states, decode) ------------
def scan_cases(model: str, dtype: torch.dtype, chunk: int, profile: str, params: Dict) -> List:
    """A scan task's cases of one model: each prefill batch from fresh and from carried states, and
    decode batches (one token per sequence, every one carrying a state). ``params`` (head counts and
    dims) go into every case beside ``lengths`` and ``with_state``."""
    from fk_pytest import Case
    from fk_pytest.task import DTYPE_NAMES

    captured = captured_state_calls(model, profile)
    out = []
    for ident, _, lengths, carried, weight in captured or ():
        # one initial-state flag per call: every sequence starts from a state when any does
        out.append(Case(f"{model}-{ident}-{DTYPE_NAMES[dtype]}", dtype, model=model, weight=weight,
                        params=dict(params, lengths=tuple(lengths), with_state=any(carried), source="captured")))
    for name, lengths, weight in kept_prefill_batches(chunk, profile, captured):
        for state in ("fresh", "carried"):
            out.append(Case(f"{model}-prefill-{name}-{state}-{DTYPE_NAMES[dtype]}", dtype, model=model,
                            weight=weight, params=dict(params, lengths=tuple(lengths), with_state=state == "carried")))
    if captured is None:
        for name, n in decode_batches(profile):
            out.append(Case(f"{model}-decode-{name}-{DTYPE_NAMES[dtype]}", dtype, model=model,
                            params=dict(params, lengths=(1,) * n, with_state=True)))
    return out


def edge_lengths(chunk: int, extra: Sequence[int] = ()) -> Tuple[int, ...]:
    """Sequence lengths on both sides of one and two chunks, a token or two, and ``extra``."""
    return tuple(m * chunk + d for m in (1, 2) for d in (-1, 0, 1)) + (1, 2) + tuple(extra)


def draw_scan_lengths(draw, edges: Sequence[int], longest: int) -> Tuple[Tuple[int, ...], bool, str, str]:
    """A fuzzed step of a scan task: a decode batch (up to 8 sequences, carrying states) or 1-3
    prefill sequences at edge or random lengths, fresh or carried. Returns (lengths, with_state,
    phase, an id naming the lengths and the state)."""
    from hypothesis import strategies as st

    if draw(st.booleans()):
        lengths, with_state, phase = (1,) * draw(st.integers(1, 8)), True, "decode"
    else:
        length = st.one_of(st.sampled_from(list(edges)), st.integers(1, longest))
        lengths = tuple(draw(st.lists(length, min_size=1, max_size=3)))
        with_state, phase = draw(st.booleans()), "prefill"
    ident = "_".join(map(str, lengths)) if len(lengths) <= 4 else f"{len(lengths)}x1"
    return lengths, with_state, phase, f"{phase}-L{ident}-{'carried' if with_state else 'fresh'}"
