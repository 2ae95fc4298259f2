"""Where an end-to-end model's GPU memory goes while its reference is built, step by step.

On an H100 on 2026-12-07 the progress lines of Mixtral's 8-layer cut read 44.2 GiB in use before
the first engine existed, and DeepSeek-V2-Lite's 14-layer cut 30.3 GiB: twice their bf16 weights
(22.1 and 15.1 GiB), the reference's and the composed candidate's (``run_e2e`` composes the
candidate before it calibrates). To tell that from anything the build itself keeps, this prints
``torch.cuda.memory_allocated`` after each step of ``tasks.e2e.E2E.build_reference`` (the module
built, weights drawn, attention shaped, cast to the serving dtype), the parameters' own bytes,
and the largest live blocks of the allocator's snapshot with where they were allocated.

    python3 -m benchmarks e2e_memory --model mixtral-8x7b [--layers 2] [--device cpu]

On the CPU (``--device cpu``, with ``--layers`` to fit) "allocated" is the bytes of the distinct
storages of every live tensor, found through the garbage collector.
"""
import argparse
import gc
import warnings

import torch


def gib(n: int) -> str:
    return f"{n / 2 ** 30:.2f} GiB"


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
    args = ap.parse_args()
    import tasks.e2e as e2e
    from kernels_reference.L4.llama import init_random_weights, model_for

    case = next(c for c in e2e.E2E.cases("full") if c["model"] == args.model)
    config = e2e.model_config(args.model, "full")
    if args.layers:
        config = dict(config, num_hidden_layers=args.layers)
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.cuda.memory._record_memory_history(max_entries=100000)
    steps = []

    def note(step: str) -> None:
        gc.collect()
        steps.append((step, live_bytes(device)))

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
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    print(f"{args.model}, {config['num_hidden_layers']} layers: parameters {gib(weights)}, buffers {gib(buffers)}")
    print("| step | allocated |")
    print("|---|---|")
    for step, n in steps:
        print(f"| {step} | {gib(n)} |")
    if device.type != "cuda":
        return
    snapshot = torch.cuda.memory._snapshot()
    blocks = [(b["size"], b.get("frames") or [])
              for seg in snapshot["segments"] for b in seg["blocks"] if b["state"] == "active_allocated"]
    blocks.sort(key=lambda x: -x[0])
    print(f"largest live blocks ({len(blocks)} in all):")
    for size, frames in blocks[:args.top]:
        where = "; ".join(f"{f['filename'].rsplit('/', 2)[-1]}:{f['line']} {f['name']}" for f in frames
                          if "torch/" not in f["filename"])[:400]
        print(f"  {gib(size)}  {where}")


if __name__ == "__main__":
    main()
