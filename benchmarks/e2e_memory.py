"""Where an end-to-end model's GPU memory goes while its reference is built, step by step.

On an H100 on 2026-12-07 the progress lines of Mixtral's 8-layer cut read 44.2 GiB in use before
the first engine existed, and DeepSeek-V2-Lite's 14-layer cut 30.3 GiB: twice their bf16 weights
(22.1 and 15.1 GiB), the reference's and the composed candidate's (``run_e2e`` composes the
candidate before it calibrates). To tell that from anything the build itself keeps, this prints
``torch.cuda.memory_allocated`` after each step of ``tasks.e2e.E2E.build_reference`` (the module
built, weights drawn, attention shaped, cast to the serving dtype), the parameters' own bytes,
and the largest live blocks of the allocator's snapshot with where they were allocated.

    python3 -m benchmarks e2e_memory --model mixtral-8x7b [--layers 2] [--device cpu]
    python3 -m benchmarks e2e_memory --model mixtral-8x7b --engines 2 --scenario chat

With ``--engines N`` (CUDA) it then starts N engines on the built model one after the other, each
with the scenario's engine arguments and its decode graphs captured, all kept alive, as the run
keeps the candidate's engine beside the reference's when it times them: per engine the memory in
use and reserved after its start and the peak while it started (on the H100 on 2026-12-07 the
reference tree's Mixtral chat case ran out of 80 GB capturing its decode graphs beside two copies
of the weights, where the example tree's had fitted; the reference's own classes added 0.36 GiB an
engine there). With ``--tree PATH`` it composes that candidate tree into a copy of the model as the
end-to-end run does (``compose_candidate``, the candidate holding its own weights) after the
build, a step of the table, and with ``--engines`` starts one engine more, on the candidate, beside
the reference's: the run's state when it captured the candidate's graphs.

On the CPU (``--device cpu``, with ``--layers`` to fit) "allocated" is the bytes of the distinct
storages of every live tensor, found through the garbage collector.
"""
import argparse
import gc
import warnings

import torch


def gib(n: int) -> str:
    return f"{n / 2 ** 30:.2f} GiB"


def driver_used(device: torch.device) -> str:
    """The device memory in use by every allocation of the process, the driver's count (what the
    caching allocator reserves, kernels' code and local memory, streams, graphs): "-" on the CPU."""
    if device.type != "cuda":
        return "-"
    free, total = torch.cuda.mem_get_info(device)
    return gib(total - free)


def live_bytes(device: torch.device) -> int:
    """Bytes allocated on ``device``: the CUDA allocator's count, or on the CPU the distinct
    storages of every live tensor there."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        return torch.cuda.memory_allocated(device)
    storages = {}
    with warnings.catch_warnings():  # isinstance on deprecated torch aliases warns
        warnings.simplefilter("ignore")
        for obj in gc.get_objects():
            try:
                if isinstance(obj, torch.Tensor) and obj.device == device:
                    storage = obj.untyped_storage()
                    storages[storage.data_ptr()] = storage.nbytes()
            except (RuntimeError, ReferenceError):  # meta and other storage-less tensors
                pass
    return sum(storages.values())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="mixtral-8x7b")
    ap.add_argument("--layers", type=int, default=0, help="cut the full profile's depth further (0: as served)")
    ap.add_argument("--top", type=int, default=8, help="largest live allocator blocks to list (CUDA)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--engines", type=int, default=0, help="engines with decode graphs to start on the model (CUDA)")
    ap.add_argument("--scenario", default="chat", help="the scenario whose engine arguments the engines take")
    ap.add_argument("--scale", type=float, default=0.1, help="the scenarios' scale (--fk-e2e-scale)")
    ap.add_argument("--tree", help="a candidate tree to compose into a copy of the model, as the end-to-end run does")
    args = ap.parse_args()
    import tasks.e2e as e2e
    from kernels_reference.L4.llama import init_random_weights, model_for

    cases = [c for c in e2e.E2E.cases("full", args.scale) if c["model"] == args.model]
    if not cases:
        raise SystemExit(f"no full-profile end-to-end case of model {args.model!r}")
    case = next((c for c in cases if c["scenario"] == args.scenario), None)
    if case is None:
        raise SystemExit(f"{args.model} has no scenario {args.scenario!r} (it has "
                         f"{', '.join(c['scenario'] for c in cases)})")
    config = e2e.model_config(args.model, "full")
    if args.layers:
        config = dict(config, num_hidden_layers=args.layers)
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.cuda.memory._record_memory_history(max_entries=100000)
    steps = []

    def note(step: str) -> None:
        gc.collect()
        steps.append((step, live_bytes(device), driver_used(device)))

    note("start")
    with torch.device(device):
        model = model_for(config)
    note(f"model_for ({next(model.parameters()).dtype})")
    init_random_weights(model, torch.Generator(device=device).manual_seed(e2e.WEIGHT_SEED))
    note("init_random_weights")
    model = e2e.shaped_attention(model, e2e.qk_norm_scale(args.model, "full"))
    note("shaped_attention")
    model = model.to(case.dtype).eval()
    note(f"to({case.dtype})")
    candidate = None
    if args.tree:
        candidate = compose_tree(model, args.tree)
        note(f"candidate composed from {args.tree}")
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    print(f"{args.model}, {config['num_hidden_layers']} layers: parameters {gib(weights)}, buffers {gib(buffers)}")
    print("| step | allocated | in use on the device (driver) |")
    print("|---|---|---|")
    for step, n, used in steps:
        print(f"| {step} | {gib(n)} | {used} |")
    if device.type != "cuda":
        return
    if args.engines:
        start_engines(model, case, args.engines, device, candidate)
    snapshot = torch.cuda.memory._snapshot()
    blocks = [(b["size"], b.get("frames") or [])
              for seg in snapshot["segments"] for b in seg["blocks"] if b["state"] == "active_allocated"]
    blocks.sort(key=lambda x: -x[0])
    print(f"largest live blocks ({len(blocks)} in all):")
    for size, frames in blocks[:args.top]:
        where = "; ".join(f"{f['filename'].rsplit('/', 2)[-1]}:{f['line']} {f['name']}" for f in frames
                          if "torch/" not in f["filename"])[:400]
        print(f"  {gib(size)}  {where}")


def compose_tree(model, tree: str):
    """``tree``'s classes swapped into a copy of ``model`` with its own weights, as ``run_e2e``
    composes a candidate; a class that fails to compose ends the benchmark with its reason."""
    from fk_pytest.candidates import CandidateSource
    from fk_pytest.compose import candidate_lookup
    from fk_pytest.e2e_run import compose_candidate

    candidate, composition = compose_candidate(model, candidate_lookup(CandidateSource(tree)))
    composition.raise_if_failed()
    print(f"composed from {tree}: {', '.join(composition.swapped) or 'no class of the model'}")
    return candidate


def start_engines(model, case, count: int, device: torch.device, candidate=None) -> list:
    """``count`` engines on ``model`` with the case's engine arguments and decode graphs, then one on
    ``candidate`` (with ``model`` as its reference) where given, all kept alive; a table of the
    memory each start added and the peak while it started."""
    import tasks.e2e as e2e
    from fk_pytest.e2e_run import _engine, _engine_args

    args, _ = _engine_args(e2e.E2E, case, device)
    print(f"engines for {case.id}: {', '.join(f'{k}={v}' for k, v in sorted(args.items()))}")
    print("| engine | allocated after start | reserved after start | peak allocated while starting | in use on the device (driver) |")
    print("|---|---|---|---|---|")
    engines = []
    runs = [(f"{i + 1}, reference", model) for i in range(count)]
    runs += [(f"{count + 1}, candidate", candidate)] if candidate is not None else []
    for label, served in runs:
        torch.cuda.reset_peak_memory_stats(device)
        try:
            engines.append(_engine(served, model, args))  # its decode graphs are captured here
        except (torch.OutOfMemoryError, RuntimeError) as exc:  # the allocator's, or the driver's (a stream, a graph)
            print(f"| {label} | {type(exc).__name__}: {str(exc).splitlines()[0][:160]} | {gib(torch.cuda.memory_reserved(device))} "
                  f"| {gib(torch.cuda.max_memory_allocated(device))} | {driver_used(device)} |")
            break
        torch.cuda.synchronize(device)
        print(f"| {label} | {gib(torch.cuda.memory_allocated(device))} | {gib(torch.cuda.memory_reserved(device))} "
              f"| {gib(torch.cuda.max_memory_allocated(device))} | {driver_used(device)} |")
    return engines


if __name__ == "__main__":
    main()
