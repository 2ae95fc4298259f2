"""Every reference module runs under ``torch.compile(fullgraph=True)``, as production compiles them.

vLLM compiles the model body with Dynamo and Inductor: the custom kernels' native paths are traced
(Inductor fuses them with their neighbours) and attention is an opaque custom op. A graph break in
any reference module would make that impossible, so each task's reference is compiled with
``fullgraph=True`` on its first and last CPU case and must agree with its eager self. ``aot_eager`` runs the
same Dynamo capture and AOT tracing (fake tensors, the custom ops' fake implementations) as
Inductor without its C++ code generation, which keeps this test fast; one Inductor run checks the
code generation path too. CUDA-graph capture is checked on the GPU (tools/gpu_compile_graphs.py).
"""
import pytest
import torch

from fk_pytest.build import clone_inputs, instantiate, master_state
from fk_pytest.registry import all_tasks

TASKS = sorted(all_tasks())


def _outputs(out):
    return [out] if isinstance(out, torch.Tensor) else [o for o in out if isinstance(o, torch.Tensor)]


def _run(task, case, backend):
    torch._dynamo.reset()
    state = master_state(task, case, seed=0)
    module = instantiate(task.reference, task, case, state, "cpu", case.dtype)
    inputs = task.make_inputs(case, torch.Generator().manual_seed(1), torch.device("cpu"))
    with torch.no_grad():
        eager = [o.clone() for o in _outputs(task.call(module, clone_inputs(inputs)))]
        module.forward = torch.compile(module.forward, fullgraph=True, backend=backend)
        compiled = _outputs(task.call(module, clone_inputs(inputs)))
    assert len(compiled) == len(eager)
    for a, b in zip(compiled, eager):
        assert a.shape == b.shape and a.dtype == b.dtype
        torch.testing.assert_close(a.float(), b.float(), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("which", ["first", "last"])
@pytest.mark.parametrize("name", TASKS)
def test_reference_compiles_with_fullgraph(name, which):
    cases = all_tasks()[name].cases("cpu")  # decode-sized first, prefill/chunked last
    _run(all_tasks()[name], cases[0] if which == "first" else cases[-1], backend="aot_eager")


def test_inductor_codegen_on_fused_rms_norm():
    task = all_tasks()["rms_norm"]
    case = next(c for c in task.cases("cpu") if c["variant"] == "fused-add")
    _run(task, case, backend="inductor")
