"""The peer benchmark: the reference against the kernels a user could pick instead, timed the suite's way.

    fk-peers --device cuda --profile full --ops rms_norm,attention --json peers.json --md peers.md

For every op (an L1 task) and each selected workload case:

1. build the reference on the case's weights and inputs with the suite's own helpers, so every
   implementation sees exactly the task's inputs (strided views, paged caches, metadata);
2. build each peer the suite names for the op (``<suite>.peers.OPS``: torch eager, torch.compile,
   Liger-Kernel, SDPA backends, flex_attention, ...); a peer that cannot run the case is recorded
   as ``unsupported`` or ``skipped`` with the reason;
3. check every peer's outputs (and the inputs it must write, e.g. the KV cache) against the float64
   truth with the task's calibrated compare; a ``wrong`` peer is reported and never "best";
4. time the reference and the surviving peers interleaved in one loop with :mod:`fk_pytest.timing`
   (CUDA-graph replay where capturable, L2 flush outside the timed window, one input set each, as
   in the suite's default timing);
5. derive TB/s, TFLOP/s, the fraction of the roofline measured at start, the best peer and
   ``ratio = best peer time / reference time`` (above 1: the reference is faster).

Per op: geomean and minimum of the ratio over the cases, and the op's bandwidth targets for the
reference, each said to hold or not. Cases run round-robin over the ops (target cases first), so a
``--time-budget`` cut still leaves every op measured. Output: JSON (``SCHEMA``) and markdown; the
JSON is rewritten after every case (``"complete": false`` until the end).

The package, one module per job:

* :mod:`.contract`: what the suite declares per op (peers, targets) and the eager/compile peers;
* :mod:`.selection`: which cases run;
* :mod:`.measure`: one case (build, check, time, rates);
* :mod:`.verdicts`: best peer and ratio per case, targets per op;
* :mod:`.run`: the whole run (:func:`benchmark`) and its JSON document;
* :mod:`.text`: progress line, terminal summary, markdown;
* :mod:`.cli`: the command line (``fk-peers``, ``python -m fk_pytest.peers``).

Everything the suite's peer definitions (``tasks/peers.py``), the tests and the ``fk-peers`` entry point
import is re-exported here.
"""
from __future__ import annotations

from .cli import main
from .contract import (COMPILE, EAGER, FRAMEWORK, PEER_KINDS, PRODUCTION, REFERENCE, Ceiling, OpPeers, Peer,
                       PeerContext, PeerNotRun, Skipped, Target, Unsupported, compiled_native, package_version, suite_ops,
                       suite_peers_module)
from .measure import Options, check_outputs, measure_case, rates
from .run import SCHEMA, benchmark
from .selection import Selected, select_cases, shape_key
from .text import format_summary, progress_line, summary_rows, to_markdown
from .verdicts import (RATIO_GEOMEAN_TARGET, RATIO_SHAPE_FLOOR, TIMING_NOISE, case_verdict, geomean,
                       op_summary)

__all__ = [
    "COMPILE", "EAGER", "FRAMEWORK", "PEER_KINDS", "PRODUCTION", "REFERENCE", "Ceiling", "OpPeers", "Peer",
    "PeerContext", "PeerNotRun", "Skipped", "Target", "Unsupported", "compiled_native", "package_version", "suite_ops",
    "suite_peers_module",
    "Selected", "select_cases", "shape_key",
    "Options", "check_outputs", "measure_case", "rates",
    "RATIO_GEOMEAN_TARGET", "RATIO_SHAPE_FLOOR", "TIMING_NOISE", "case_verdict", "geomean", "op_summary",
    "SCHEMA", "benchmark",
    "format_summary", "progress_line", "summary_rows", "to_markdown",
    "main",
]
