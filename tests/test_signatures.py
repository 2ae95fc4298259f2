"""Call compatibility: candidates are accepted when the suite's real calls bind, and a rejection
names the class and shows the call that failed. Composed mode names the failing class."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fk_pytest import status
from fk_pytest.candidates import CandidateSource
from fk_pytest.correctness import evaluate_case
from fk_pytest.errors import CandidateError
from fk_pytest.evaluator import Evaluator, task_ref
from fk_pytest.registry import get_task
from fk_pytest.signatures import check_call, check_class

from conftest import CANDIDATES

MINIMAL = CANDIDATES / "minimal_signatures"


def _cases(task, where, limit=3):
    return [c for c in task.cases("cpu") if where in c.id][:limit]


def _statuses(task_name, cls, where="", limit=3):
    task = get_task(task_name)
    return [evaluate_case(task, case, 7, cls, "cpu") for case in _cases(task, where, limit)]


# ---- the rule -------------------------------------------------------------------------------------
def test_inherited_init_takes_no_arguments_and_says_so():
    class Bare(nn.Module):
        def forward(self, x):
            return x

    check_call(Bare, "__init__", (), {})  # SiluAndMul's constructor call: binds
    with pytest.raises(CandidateError) as err:
        check_call(Bare, "__init__", (), {"hidden_size": 4096, "eps": 1e-5})
    assert err.value.status == status.SIGNATURE_MISMATCH
    assert "Bare.__init__ is nn.Module's (it takes no arguments)" in err.value.message
    assert "Bare(hidden_size=4096, eps=1e-05)" in err.value.message


def test_a_class_without_forward_or_not_a_module_is_refused_before_any_call():
    class NoForward(nn.Module):
        pass

    class NotAModule:
        def forward(self, x):
            return x

    for cls, why in ((NoForward, "defines no forward"), (NotAModule, "not a torch.nn.Module")):
        with pytest.raises(CandidateError) as err:
            check_class(nn.Module, cls)
        assert err.value.status == status.SIGNATURE_MISMATCH and why in err.value.message


# ---- through the real verdict ------------------------------------------------------------------
@pytest.mark.parametrize("task_name, where", [("silu_and_mul", ""), ("rms_norm", "fused-add"),
                                               ("rms_norm", "norm-bf16"), ("rotary_emb", "decode")])
def test_minimal_and_unusual_but_compatible_signatures_pass(task_name, where):
    """Inherited __init__ (SiluAndMul), extra optional parameters and **kwargs (RMSNorm),
    *args/**kwargs in both methods (RotaryEmbedding): every call binds, every case passes."""
    cls = CandidateSource(MINIMAL).load_class(get_task(task_name))
    results = _statuses(task_name, cls, where)
    assert results and all(r.status == status.PASSED for r in results), [r.message for r in results]


class RenamedKeyword(nn.Module):  # the suite passes residual=...; this calls it res
    def __init__(self, hidden_size, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size))

    def forward(self, x, res=None):
        return F.rms_norm(x, x.shape[-1:], self.weight, self.eps)


class MissingArgument(RenamedKeyword):  # no residual at all
    def forward(self, x):
        return F.rms_norm(x, x.shape[-1:], self.weight, self.eps)


@pytest.mark.parametrize("cls, reason", [(RenamedKeyword, "unexpected keyword argument 'residual'"),
                                         (MissingArgument, "unexpected keyword argument 'residual'")])
def test_a_call_that_cannot_bind_is_a_named_signature_mismatch(cls, reason):
    results = _statuses("rms_norm", cls, "fused-add", limit=1)
    r = results[0]
    assert r.status == status.SIGNATURE_MISMATCH, r.message
    assert f"{cls.__name__}.forward" in r.message and reason in r.message
    assert "residual=<bfloat16 [" in r.message  # the call itself is shown


def test_a_constructor_missing_an_argument_is_refused_with_the_call():
    class NoHidden(nn.Module):
        def __init__(self, eps):
            super().__init__()

        def forward(self, x, residual=None):
            return x

    r = _statuses("rms_norm", NoHidden, limit=1)[0]
    assert r.status == status.SIGNATURE_MISMATCH
    assert "NoHidden(hidden_size=" in r.message and "hidden_size" in r.message


# ---- composed mode ---------------------------------------------------------------------------------
def _composed(tree, task_name, where):
    ev = Evaluator(str(tree), "cpu", "composed")
    task = get_task(task_name)
    case = _cases(task, where, limit=1)[0]
    return ev.evaluate(task_ref(task), case, 5, "workload")


def test_composed_mode_uses_a_minimal_tree_inside_the_decoder_layer():
    r = _composed(MINIMAL, "llama_decoder_layer", "qwen2.5-0.5b-decode")
    assert r.status == status.PASSED, r.message
    assert {"RMSNorm", "SiluAndMul", "RotaryEmbedding"} <= set(r.swapped)


def test_composed_mode_names_the_class_that_failed_and_keeps_the_rest(tmp_path):
    tree = tmp_path / "tree" / "L1"
    tree.mkdir(parents=True)
    for name in ("rms_norm.py", "rotary_emb.py"):
        (tree / name).write_text((MINIMAL / "L1" / name).read_text())
    (tree / "silu_and_mul.py").write_text("import torch\nraise RuntimeError('half-written kernel')\n")
    r = _composed(tree.parent, "llama_decoder_layer", "qwen2.5-0.5b-decode")
    assert r.status == status.IMPORT_ERROR, r.message
    assert "candidate class SiluAndMul (L1/silu_and_mul.py)" in r.message
    assert "half-written kernel" in r.message
    assert set(r.failed) == {"SiluAndMul"} and {"RMSNorm", "RotaryEmbedding"} <= set(r.swapped)


def test_composed_mode_is_not_attempted_only_without_any_class_of_the_tree(tmp_path):
    tree = tmp_path / "tree" / "L1"
    tree.mkdir(parents=True)
    (tree / "rms_norm.py").write_text((MINIMAL / "L1" / "rms_norm.py").read_text())
    r = _composed(tree.parent, "llama_mlp", "qwen2.5-0.5b-decode")  # the MLP holds no RMSNorm
    assert r.status == status.NOT_ATTEMPTED


# ---- where a candidate is built ------------------------------------------------------------------
class _Plain(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(4))


class _HostOnly(nn.Module):
    """A constructor that works only on the host: numpy on a tensor made on the default device."""

    def __init__(self):
        super().__init__()
        table = torch.arange(4.0).numpy() * 2
        self.weight = nn.Parameter(torch.from_numpy(table))


class _Unwritten(nn.Module):
    def __init__(self):
        super().__init__()
        raise NotImplementedError("not yet")


def test_a_candidate_is_built_on_the_device_it_runs_on_or_on_the_host_when_only_that_works():
    """A full-size candidate built on the host and then moved costs seconds a case on the GPU, so
    it is built on the case's device (the meta device stands in for a GPU here); a constructor
    that fails there is built on the host, as before, and a stub's constructor is not retried."""
    from fk_pytest.signatures import construct
    assert construct(_Plain, {}, "meta").weight.device.type == "meta"
    assert construct(_Plain, {}).weight.device.type == "cpu"
    host = construct(_HostOnly, {}, "meta")
    assert host.weight.device.type == "cpu" and host.weight.tolist() == [0.0, 2.0, 4.0, 6.0]
    with pytest.raises(CandidateError) as err:
        construct(_Unwritten, {}, "meta")
    assert err.value.status == status.NOT_IMPLEMENTED
