"""Which kernel the encoder attention reference picks per shape, and the time of each option.

``EncoderOnlyAttention`` (one packed sequence) and ``MultiHeadAttention`` (a padded batch with a key
mask) time their kernels on the first call of a shape and keep the fastest
(``kernels_reference.ops.attention.fastest``). This calls both layers once on every case of
their tasks' full profile and prints the timings the choice was made on:

    python3 -m benchmarks encoder_choices
"""
import torch

from fk_pytest.registry import get_task
from kernels_reference.ops.attention import fastest


def main():
    device = torch.device("cuda")
    for name in ("encoder_only_attention", "multi_head_attention"):
        task = get_task(name)
        for case in task.cases("full"):
            module = task.reference(**task.init_args(case)).to(device=device, dtype=case.dtype)
            inputs = task.make_inputs(case, torch.Generator(device=device).manual_seed(0), device)
            before = set(fastest.TUNED)
            with torch.no_grad():
                task.call(module.eval(), inputs)
            torch.cuda.synchronize()
            for key in set(fastest.TUNED) - before:
                times = fastest.TUNED[key]
                chosen = min(times, key=times.get)
                per_call = ", ".join(f"{k} {v / fastest.TUNE_CALLS * 1e3:.1f} us" for k, v in times.items())
                print(f"{name:24s} {case.id:48s} -> {chosen:18s} ({per_call})")
            if not set(fastest.TUNED) - before:
                print(f"{name:24s} {case.id:48s} -> one kernel (no choice for this shape)")


if __name__ == "__main__":
    main()
