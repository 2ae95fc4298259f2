"""Split-K flash-decoding over a paged KV cache, in Triton (the decode half of ``Attention``).

Decode is bound by reading the KV cache once, so the kernels are organised around that read:

* one program per (sequence, kv head, split): all query heads of a GQA group are loaded as one tile
  and share every K/V block the program reads (K/V are read once per group, not once per head);
* an online softmax in float32 over tiles of several blocks, K and V requested together.

Three kernels, chosen by ``DecodeConfig.kernel`` (the third, ``"blocks"``, reads whole cache blocks
for every head; it lives in blocks.py, selectable as ``BLOCKS_CONFIG``: on the H200 it
is level with the two-pass kernel at B1 C8192 and faster at other batch-1 lengths, see there):

* ``"one-pass"`` (selectable, not the default). Split s takes tiles s, s+S, s+2S, ... of its sequence (balanced to one
  tile whatever the length); every split with work writes a partial and counts itself on an
  atomic counter per (sequence, kv head); the last to count merges the partials in the same
  launch and zeroes the counter again (so a replayed CUDA graph finds it zeroed). At a small batch
  (fewer (sequence, kv head) pairs than SMs) the split count is rounded *down* to what is resident
  at once: the compiled kernel's registers and shared memory say how many programs fit on an SM,
  and a second wave would pay the whole latency chain (sequence length -> block table -> K/V)
  again. Why: on the H200 the two-pass kernel at B1 C8192 compiles to 137 registers (3 programs
  per SM) but was launched as 4 per SM (528 programs), so a quarter ran in a second wave, followed
  by a merge launch; its fused merge spilled (255 registers, 2 per SM).
* ``"two-pass"`` (the default, ``TWO_PASS_CONFIG``): contiguous block ranges per split, a
  second small merge kernel, or (``fused_merge``) the last-program merge of one head at a time;
  optionally the batch-1 fixed-cost variants below.

Measured side by side on the H200 (benchmarks/decode.py, docs/perf/h200-decode-b1.md), the
one-pass kernel lost at every shape (B1 C8192: 22.2 us against 16.0; B32 C2048: 104 against 67),
and holding the two-pass kernel to one wave did not help either (17.1 us): the second-wave
diagnosis above was wrong. The one-pass kernel stays selectable for the next attempt; the
default is the two-pass kernel.

Batch-1 fixed cost: selectable two-pass variants (``DecodeConfig`` fields; the default uses none).
At B1 C8192 the two-pass kernel takes 16.0 us against 7.9 us of streaming the cache, while at
C32768 it reaches 0.82 of copy: about 6 us per call is fixed, and at 2 loop iterations per split
it is the chain seq_len -> split range -> table entries -> K/V, the partial stores, and a second
launch whose programs start only after the first kernel drained. Each variant removes one link
(benchmarks/decode.py times them side by side; tools/decode_sm90_compile.py shows their PTX order):

* ``interleaved``: split s takes tiles s, s+S, s+2S, ... (S splits), like the one-pass kernel.
  Where a split starts no longer depends on seq_len, so its first table read is issued together
  with the seq_len read, bounded only by the table's width (a shape); entries read past the
  sequence are never dereferenced (the K/V loads are masked by seq_len). Ranges cut from the
  table width would do the same but leave most splits idle when the table is max_model_len wide
  and the sequence short; interleaved tiles keep every split busy whatever the width, and the
  split count stays a function of shapes.
* ``pdl`` (programmatic dependent launch, sm_90+, Triton with ``launch_pdl`` and
  ``triton.language.extra.cuda.gdc_wait``): a dependent kernel is launched before the one ahead of
  it finishes and waits in ``gdc_wait`` until that kernel has completed and its writes are
  visible. ``"merge"``: the split kernel signals ``gdc_launch_dependents`` at its start, so the
  merge programs are resident when the last split finishes (no launch gap; the merge was already
  one memory round trip: the lse and partial loads are all issued before any is used).
  ``"all"``: the split kernel is launched dependent too (it waits before its first load, so it is
  safe after any kernel), hiding its own launch behind the previous kernel's tail.
  ``"early-metadata"``: as "all", but seq_len and (interleaved) the first table entries are read
  *before* the wait, taking that part of the chain off the critical path; valid only when the kernel
  launched just before decode does not write seq_lens or the block table (an engine uploads them
  before the step's first kernel; the KV store kernel just before decode writes only the cache,
  which is read after the wait). Rule for every PDL kernel here: nothing is written before the
  wait, so a reused workspace or output buffer is never written while the previous call reads it.
  Where PDL is missing (another Triton, an older GPU) ``paged_decode`` raises
  ``VariantUnavailable`` rather than run the plain kernel under the variant's name; the
  interpreter runs the same load order with the grid-dependency instructions compiled out.
* ``max_registers``: Triton's ``maxnreg``. The split kernel compiles to ~138 registers at
  Llama-3.1-8B's shapes (3 programs of 128 threads per SM) while the default launch asks for 4 per
  SM, so a quarter of the programs run in a second wave and pay the chain again; 128 registers
  (16 bytes of spill) lets all of them be resident at once.
* Fewer, longer splits, bigger tiles, deeper pipelines are the existing knobs
  (``blocks_per_iter``, ``num_warps``, ``num_stages``, ``small_batch_programs_per_sm``,
  ``max_splits``); the H200 script sweeps a grid of them on top of interleaved + PDL, and
  ``benchmarks/decode_configs.py`` times whole configurations on the attention task's serving
  batches. ``unsplit_tile_tokens`` (two-pass) widens the tile of a launch that does not split,
  where each program walks a whole sequence.

CUDA-graph contract (the engine captures decode once per batch size and replays it): nothing here
syncs with the host, and the launch (grid, number of splits, workspace size) is a function of
tensor *shapes* (number of sequences, ``block_tables.shape[1]``, heads, head size) and module
constants only (one-pass: and the compiled kernel's footprint, itself fixed by dtypes and
shapes), never of metadata values. A sequence with ``seq_len == 0`` (a padded row of a
graph batch) produces zeros.

Files (imported one way: decode -> the kernels -> merge / config / device):

* ``decode.py``: ``paged_decode``, the entry point (checks, picks the kernel; ``DECODE_CONFIG``);
* ``config.py``: ``DecodeConfig``, the shipped configs, the shape-only split arithmetic;
* ``device.py``: SM count, PDL availability and stand-ins, launch options (shared with other ops);
* ``two_pass.py``, ``one_pass.py``, ``blocks.py``: the three kernels and their launches;
* ``merge.py``: the split workspace, the merge kernel and the in-kernel merge.
"""
from .config import (BLOCKS_CONFIG, KERNELS, LOG2E, ONE_PASS_CONFIG, PDL_MODES, TWO_PASS_CONFIG, DecodeConfig,
                     decode_num_splits, decode_workspace_bytes, small_batch_pdl)
from .decode import paged_decode
from .device import VariantUnavailable, pdl_unavailable_reason, sm_count

__all__ = ["BLOCKS_CONFIG", "KERNELS", "LOG2E", "ONE_PASS_CONFIG", "PDL_MODES", "TWO_PASS_CONFIG", "DecodeConfig",
           "VariantUnavailable", "decode_num_splits", "decode_workspace_bytes", "paged_decode", "pdl_unavailable_reason",
           "sm_count", "small_batch_pdl"]
