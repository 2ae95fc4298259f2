"""On the GPU: every reference module inside CUDA-graph capture and under torch.compile(fullgraph=True).

For each task (L1..L4), on one decode-sized and one prefill-sized case of the chosen profile:
eager ``forward`` is the baseline; a CUDA graph captured around ``forward`` is replayed on the same
inputs; ``torch.compile(forward, fullgraph=True)`` (Inductor) runs eagerly and inside a graph.
Each must agree with eager (bf16 tolerance). Prints one line per check and a table last; writes
``$OUT/compile_graphs.json``.

    PYTHONPATH=$PWD/src:$PWD python3 -m benchmarks compile_graphs [--profile full] [--budget-s 240]
"""
import argparse
import json
import os
import time

import torch

from fk_pytest.build import clone_inputs, instantiate, master_state
from fk_pytest.registry import all_tasks
from kernels_reference.cuda_graphs import warm_up


def _outputs(out):
    return [out] if isinstance(out, torch.Tensor) else [o for o in out if isinstance(o, torch.Tensor)]


def _agree(got, eager, truth):
    """Calibrated like the suite: the compiled/graphed outputs' normwise error against a float32
    run of the same module must stay within 2x the eager bf16 path's own error (compiled code fuses
    and rounds differently, so bit-equality is not the bar; a real bug is far outside it)."""
    worst = 0.0
    for a, e, t in zip(got, eager, truth):
        if a.shape != e.shape:
            return False, f"shape {tuple(a.shape)} != {tuple(e.shape)}"
        if not a.numel():
            continue
        t = t.double()
        scale = t.norm().clamp_min(1e-30)
        err, ref_err = (a.double() - t).norm() / scale, (e.double() - t).norm() / scale
        worst = max(worst, (err / ref_err.clamp_min(1e-7)).item() if ref_err > 1e-7 else (0.0 if err < 1e-6 else 1e9))
    return worst <= 2.0, f"error / eager error {worst:.2f}"


def _graph_run(task, module, inputs):
    """Capture one call in a CUDA graph, then replay it on the same (fresh-copied) inputs."""
    static = clone_inputs(inputs)
    warm_up([lambda: task.call(module, clone_inputs(inputs))])  # compilation, autotuning, lazy tables
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = task.call(module, static)
    for k, v in clone_inputs(inputs).items():  # undo the capture's own in-place writes (caches)
        if isinstance(v, torch.Tensor):
            static[k].copy_(v)
    graph.replay()
    torch.cuda.synchronize()
    return [o.clone() for o in _outputs(out)]


def check(task, case):
    state = master_state(task, case, seed=0, device="cuda")
    module = instantiate(task.reference, task, case, state, "cuda", case.dtype)
    inputs = task.make_inputs(case, torch.Generator(device="cuda").manual_seed(1), torch.device("cuda"))
    row = {"task": task.name, "case": case.id}
    with torch.no_grad():
        eager = [o.clone() for o in _outputs(task.call(module, clone_inputs(inputs)))]
        wide = instantiate(task.reference, task, case, state, "cuda", torch.float32)
        truth = [o.clone() for o in _outputs(task.call(wide, {k: v.float() if isinstance(v, torch.Tensor)
                                                             and v.is_floating_point() else v
                                                             for k, v in clone_inputs(inputs).items()}))]
        del wide
        for name, fn in (("graph", lambda: _graph_run(task, module, inputs)),
                         ("compile", lambda: _outputs(task.call(module, clone_inputs(inputs)))),
                         ("compile+graph", lambda: _graph_run(task, module, inputs))):
            if name == "compile":
                torch._dynamo.reset()
                module.forward = torch.compile(module.forward, fullgraph=True)
            t0 = time.time()
            try:
                ok, detail = _agree(fn(), eager, truth)
                row[name] = ("ok" if ok else "WRONG") + f" ({detail}, {time.time() - t0:.1f}s)"
            except Exception as exc:  # report, keep going
                torch.cuda.synchronize()
                row[name] = f"FAILED {type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
            print(f"  {task.name} {case.id} {name}: {row[name]}", flush=True)
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--profile", default="full")
    ap.add_argument("--budget-s", type=float, default=240)
    ap.add_argument("--tasks", default="")
    args = ap.parse_args()
    start, rows = time.time(), []
    names = args.tasks.split(",") if args.tasks else sorted(all_tasks())
    for name in names:
        task = all_tasks()[name]
        cases = task.cases(args.profile)
        for case in {c.id: c for c in (cases[0], cases[-1])}.values():
            if time.time() - start > args.budget_s:
                rows.append({"task": name, "case": case.id, "graph": "not run (budget)"})
                continue
            try:
                rows.append(check(task, case))
            except Exception as exc:  # set-up failed: report and go on
                rows.append({"task": name, "case": case.id, "graph": f"FAILED set-up {type(exc).__name__}: {exc}"[:200]})
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "compile_graphs.json"), "w") as f:
            json.dump({"torch": torch.__version__, "gpu": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)
    print("\n| task | case | CUDA graph | compile(fullgraph) | compile + graph |\n|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['task']} | {r['case']} | {r.get('graph', '-')} | {r.get('compile', '-')} | {r.get('compile+graph', '-')} |")


if __name__ == "__main__":
    main()
