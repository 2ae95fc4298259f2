"""Compile, on a machine without a GPU, the Triton kernels a task's reference launches, for sm_90.

A device call that meets a kernel which does not compile for the GPU loses minutes of the scarcest
resource. This pre-flight runs each named task's reference on its CPU cases through its Triton path
(``forward_triton``) in Triton's interpreter with the GPU's tiles (``FK_GPU_TILES=1``), records
every launch (kernel, argument types, constexpr values, warps, stages), then, in a second process
without the interpreter, compiles each distinct launch for the H100/H200 (sm_90) with the installed
Triton and its ptxas (kernels whose ``EMULATE`` switch upcasts half products in the interpreter are
also compiled with it off, as the GPU runs them, and with their products' "ieee" input precision as
TF32, the GPU's choice for half inputs). One line per launch: compiled (seconds), or the
compiler's error. The GPU machine's Triton may be another version than this machine's: a kernel
that compiles here is likely, not certain, to compile there.

    python3 -m benchmarks hopper_compile rwkv7 gated_linear_attention mamba_chunk_scan
    python3 -m benchmarks hopper_compile gated_delta_rule --set kernels_reference.ops.gated_delta.chunk.STATE_PREFETCH=True

``--set MODULE.NAME=VALUE`` (repeatable) sets a module-level setting before the launches are
recorded: the choices a ``scan_tiles`` sweep will try, compiled before a device call tries them.
"""
import argparse
import importlib
import json
import os
import subprocess
import sys
import tempfile
import time

# constexprs the reference's host code sets True exactly when the kernel runs in the interpreter
# (``EMULATE`` of the gated delta rule's, GLA's and RWKV-7's products: half operands upcast to float32
# there), so False on the GPU for every dtype. (Mamba-2's and the MoE GEMM's ``F32_DOT`` also depends
# on the dtype, and the CPU cases' dtypes are not always the GPU's: not switched.)
INTERPRETER_SWITCHES = ("EMULATE",)
# Input precisions of tl.dot that the host code sets to "ieee" in the interpreter (GLA's scores,
# RWKV-7's pairwise sums): on the GPU, with half inputs, they are TF32. The GPU's variant of such a
# launch is compiled with this value too.
GPU_PRECISIONS = {"PRECISION": "tf32"}
_TORCH_TYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "float64": "fp64", "int32": "i32",
                "int64": "i64", "int16": "i16", "int8": "i8", "uint8": "u8", "bool": "i1"}


def _describe(value, constexpr: bool):
    """A launch argument as JSON: its Triton type (runtime arguments) or its value (constexprs)."""
    import torch
    import triton.language as tl
    if isinstance(value, tl.dtype):
        return {"tl_dtype": str(value)}
    if constexpr or value is None:
        return {"value": value}
    if isinstance(value, torch.Tensor):
        return {"type": "*" + _TORCH_TYPES[str(value.dtype).replace("torch.", "")]}
    if isinstance(value, bool):
        return {"type": "i1"}
    if isinstance(value, int):
        return {"type": "i32" if -2 ** 31 <= value < 2 ** 31 else "i64"}
    if isinstance(value, float):
        return {"type": "fp32"}
    raise TypeError(f"argument of type {type(value).__name__}")


def apply_settings(settings):
    """``MODULE.NAME=VALUE`` assignments (VALUE a Python literal) on imported modules."""
    import ast
    for text in settings:
        target, sep, value = text.partition("=")
        module_name, _, name = target.rpartition(".")
        if not sep or not module_name:
            raise SystemExit(f"--set wants MODULE.NAME=VALUE, got {text!r}")
        module = importlib.import_module(module_name)
        if not hasattr(module, name):
            raise SystemExit(f"--set: {module_name} has no setting {name!r}")
        try:
            setattr(module, name, ast.literal_eval(value))
        except (ValueError, SyntaxError):
            raise SystemExit(f"--set {target}: {value!r} is not a Python literal (quote a string: {name}='...')") from None


def record(tasks, out_path, settings=()):
    """Phase 1 (interpreter): the launches of each task's reference on its CPU cases."""
    apply_settings(settings)
    import torch
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    from fk_pytest.registry import get_task

    launches = {}
    original = InterpretedFunction.run

    def run(self, *args, grid, warmup, **kwargs):
        params = JITFunction(self.fn).params
        bound = dict(zip([p.name for p in params], args))
        bound.update({k: v for k, v in kwargs.items() if k in {p.name for p in params}})
        entry = {"module": self.fn.__module__, "name": self.fn.__name__,
                 "num_warps": kwargs.get("num_warps", 4), "num_stages": kwargs.get("num_stages", 3),
                 "args": {p.name: _describe(bound.get(p.name), p.is_constexpr) for p in params}}
        launches[json.dumps(entry, sort_keys=True, default=str)] = entry
        return original(self, *args, grid=grid, warmup=warmup, **kwargs)

    InterpretedFunction.run = run
    for name in tasks:
        task = get_task(name)
        for case in task.cases("cpu"):
            module = task.reference(**task.init_args(case))
            inputs = task.make_inputs(case, torch.Generator().manual_seed(0), torch.device("cpu"))
            if hasattr(module, "forward_triton"):
                with torch.no_grad():
                    module.forward_triton(**inputs)
    with open(out_path, "w") as f:
        json.dump(list(launches.values()), f)


def compile_all(in_path):
    """Phase 2 (no interpreter): each recorded launch compiled for sm_90."""
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, compile as triton_compile

    target = GPUTarget("cuda", 90, 32)
    failures = 0
    for launch in json.load(open(in_path)):
        fn = getattr(importlib.import_module(launch["module"]), launch["name"])
        signature, constexprs = {}, {}
        for name, arg in launch["args"].items():
            if "type" in arg:
                signature[name] = arg["type"]
            else:
                signature[name] = "constexpr"
                constexprs[name] = tl.dtype(arg["tl_dtype"]) if "tl_dtype" in arg else arg["value"]
        variants = [constexprs]
        # The interpreter-only switches are True in every recorded launch and False on the GPU:
        # that variant is compiled too.
        if any(constexprs.get(k) is True for k in INTERPRETER_SWITCHES):
            variants.append({k: (False if k in INTERPRETER_SWITCHES else v) for k, v in constexprs.items()})
        gpu = variants[-1]
        if any(gpu.get(k) == "ieee" for k in GPU_PRECISIONS):
            variants.append({k: (GPU_PRECISIONS[k] if k in GPU_PRECISIONS and v == "ieee" else v)
                             for k, v in gpu.items()})
        for values in variants:
            shown = ", ".join(f"{k}={v}" for k, v in values.items() if not isinstance(v, tl.dtype))[:110]
            start = time.perf_counter()
            try:
                triton_compile(ASTSource(fn, signature, values), target=target,
                               options=dict(num_warps=launch["num_warps"], num_stages=launch["num_stages"]))
                print(f"ok     {time.perf_counter() - start:5.1f} s  {launch['module']}.{launch['name']}  {shown}")
            except Exception as exc:  # one launch's failure is that line's result
                failures += 1
                first = " | ".join(str(exc).strip().splitlines()[-3:]) if str(exc).strip() else type(exc).__name__
                print(f"FAILED          {launch['module']}.{launch['name']}  {shown}\n"
                      f"    {type(exc).__name__}: {first[:300]}")
    return failures


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tasks", nargs="*")
    parser.add_argument("--set", action="append", default=[], metavar="MODULE.NAME=VALUE",
                        help="a module-level setting to record the launches with (repeatable)")
    parser.add_argument("--record", help=argparse.SUPPRESS)
    parser.add_argument("--compile", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.record:
        return record(args.tasks, args.record, args.set)
    if args.compile:
        return 1 if compile_all(args.compile) else 0
    if not args.tasks:
        parser.error("name at least one task")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "launches.json")
        me = [sys.executable, "-m", "benchmarks", "hopper_compile"]
        env = dict(os.environ, TRITON_INTERPRET="1", FK_GPU_TILES="1")
        subprocess.run(me + args.tasks + [f"--set={x}" for x in args.set] + ["--record", path], env=env, check=True)
        env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "FK_GPU_TILES")}
        sys.exit(subprocess.run(me + ["--compile", path], env=env).returncode)


if __name__ == "__main__":
    sys.exit(main())
