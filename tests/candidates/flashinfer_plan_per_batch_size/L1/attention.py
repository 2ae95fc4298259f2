"""WRONG: the FlashInfer tree with its plan cached by batch size, as if a step's page table and
lengths only changed with the number of sequences: a later step of as many sequences runs on the
first one's plan (and the layer's own staleness check is fooled the same way)."""
import importlib.util
from pathlib import Path

_path = Path(__file__).resolve().parents[4] / "examples" / "candidates" / "flashinfer" / "L1" / "attention.py"
_spec = importlib.util.spec_from_file_location("flashinfer_tree_attention", _path)
_base = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_base)


class _PlanPerBatchSize(_base._StepPlan):
    def plan(self, meta):
        if getattr(self, "_batch", None) == meta.num_seqs:
            self.planned, self.lengths = meta, (meta.query_lens_cpu, meta.seq_lens_cpu)
            return
        self._batch = meta.num_seqs
        super().plan(meta)


class Attention(_base.Attention):
    def _step_plan(self):
        cache = self.kv_cache[0]
        key = ("per-batch-size", cache.device, self.num_heads, self.num_kv_heads, self.head_size, cache.dtype)
        if key not in _base._PLANS:
            _base._PLANS[key] = _PlanPerBatchSize(cache.device, self.num_heads, self.num_kv_heads, self.head_size,
                                                  self.scale, cache.dtype)
        return _base._PLANS[key]
