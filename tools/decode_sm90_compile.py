"""Compile the two-pass decode kernels for sm_90 on a machine without a GPU (Triton's own
LLVM + ptxas), so a variant that the interpreter accepts but the compiler rejects is found before
the one GPU run, and the PDL variants' instruction order can be read in the PTX.

    python3 tools/decode_sm90_compile.py             # every structural variant of the H200 sweep
    python3 tools/decode_sm90_compile.py --json      # the same, one JSON object per line

Exit status 3: this Triton's ahead-of-time API does not fit (the default kernel did not compile
through it), nothing learnt. Must run *without* TRITON_INTERPRET (under it ``triton.jit`` gives interpreted functions that
cannot be compiled); tests and ``benchmarks/decode.py --tiny-cpu`` run it as a subprocess.

For each variant: the split kernel and the merge kernel at Llama-3.1-8B's shapes (group 4, d 128,
bf16 cache, block 16), with the divisibility hints the JIT would give (16-aligned pointers and
strides), and from the PTX: where the first ``griddepcontrol.wait`` stands relative to the global
loads and stores, whether ``griddepcontrol.launch_dependents`` is there, and the registers ptxas
reports (cuobjdump, when Triton ships it).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "src")]

if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
    sys.exit("decode_sm90_compile.py compiles real kernels: run it without TRITON_INTERPRET")

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from kernels_reference.ops.paged_decode import config as pd_config  # noqa: E402
from kernels_reference.ops.paged_decode import device as pd_device  # noqa: E402
from kernels_reference.ops.paged_decode import merge as pd_merge  # noqa: E402
from kernels_reference.ops.paged_decode import two_pass as pd_two_pass  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)
GROUP, HEAD_DIM, BLOCK, NUM_KV = 4, 128, 16, 8

POINTERS = {"q_ptr": "*bf16", "k_cache_ptr": "*bf16", "v_cache_ptr": "*bf16", "block_tables_ptr": "*i32",
            "seq_lens_ptr": "*i32", "out_ptr": "*bf16", "part_out_ptr": "*fp32", "part_lse_ptr": "*fp32",
            "counters_ptr": "*i32"}
NOT_DIVISIBLE = {"num_splits", "table_width", "per_split"}  # runtime values the JIT would not see as multiples of 16


class SignatureMismatch(Exception):
    """This script's picture of a kernel's parameters is out of date (a bug here, not a Triton
    version without the ahead-of-time API): reported as a failure, never as "unsupported"."""


def _check_signature(fn, constexprs):
    names = list(fn.arg_names)
    unknown = sorted(set(constexprs) - set(names))
    declared = {names[i] for i in getattr(fn, "constexprs", [])}
    missing = sorted(declared - set(constexprs))
    if unknown or missing:
        raise SignatureMismatch(f"{fn.__name__}: constexprs passed here but not kernel parameters {unknown}; "
                                f"kernel constexprs not passed here {missing}")


def _compile(kernel, constexprs, options, descriptors=None):
    """``descriptors``: tensor-descriptor parameters and their signature type (kv_loads="tma")."""
    fn = kernel
    _check_signature(fn, constexprs)
    signature, attrs = {}, {}
    for i, name in enumerate(fn.arg_names):
        if name in constexprs:
            signature[name] = "constexpr"
        elif descriptors and name in descriptors:
            signature[name] = descriptors[name]
        elif name in POINTERS:
            signature[name] = POINTERS[name]
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif name == "scale_log2":
            signature[name] = "fp32"
        else:
            signature[name] = "i32"
            if name not in NOT_DIVISIBLE:
                attrs[(i,)] = [["tt.divisibility", 16]]
    return triton.compile(ASTSource(fn, signature, constexprs, attrs), target=TARGET, options=options)


def _registers(compiled):
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    if "cubin" not in compiled.asm or not os.path.exists(tool):
        return None
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        try:
            text = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True, text=True,
                                  timeout=60).stdout
        except (OSError, subprocess.SubprocessError):
            return None
    regs, stack = re.search(r"REG:(\d+)", text), re.search(r"STACK:(\d+)", text)
    return {"regs": int(regs.group(1)) if regs else None, "stack": int(stack.group(1)) if stack else None}


def ptx_order(ptx: str) -> dict:
    """Global loads / stores / atomics before the first griddepcontrol.wait, and the markers."""
    lines = ptx.splitlines()
    wait = next((i for i, l in enumerate(lines) if "griddepcontrol.wait" in l), None)
    head = lines[:wait] if wait is not None else []
    return {"wait": wait is not None,
            "launch_dependents": any("griddepcontrol.launch_dependents" in l for l in lines),
            "loads_before_wait": sum("ld.global" in l for l in head),
            "stores_before_wait": sum(("st.global" in l) or ("atom." in l) or ("red." in l) for l in head),
            "loads_total": sum("ld.global" in l for l in lines)}


def compile_variant(config: "pd_config.DecodeConfig", splits: int = 66) -> dict:
    """The launch ``_launch_two_pass`` (or, kernel "blocks", ``launch_blocks``) makes on a CUDA
    device with PDL available, compiled."""
    gdc = config.pdl != "off"
    split_pdl = config.pdl in ("all", "early-metadata")
    merge_kernel = splits > 1 and not config.fused_merge
    options = dict(num_warps=config.num_warps, num_stages=config.num_stages,
                   **pd_device._launch_options(split_pdl, config.max_registers))
    if config.kernel == "blocks":
        from kernels_reference.ops.paged_decode import blocks as paged_decode_blocks
        meta = dict(NUM_HEADS=NUM_KV * GROUP, GROUP_PAD=16, GROUP=GROUP, NUM_KV=NUM_KV, KV_PAD=NUM_KV,
                    HEAD_DIM=HEAD_DIM, DIM_PAD=HEAD_DIM, BLOCK_SIZE=BLOCK, STEP_BLOCKS=config.blocks_per_iter,
                    SPLIT=splits > 1, F32_DOT=False, EARLY_METADATA=config.pdl == "early-metadata",
                    PDL_WAIT=split_pdl, PDL_TRIGGER=gdc and splits > 1, TMA=config.kv_loads == "tma")
        box = f"tensordesc<bf16[1,{NUM_KV},{BLOCK},{HEAD_DIM}]>"
        descriptors = {"k_desc": box, "v_desc": box} if meta["TMA"] else None
        if not descriptors:  # the launch passes None: a constexpr
            meta.update(k_desc=None, v_desc=None)
        split_k = _compile(paged_decode_blocks._decode_blocks_kernel, meta, options, descriptors)
    else:
        split_k = _compile(pd_two_pass._paged_decode_kernel, _two_pass_meta(config, splits, gdc, split_pdl), options)
    out = {"split": {**ptx_order(split_k.asm["ptx"]), **(_registers(split_k) or {}),
                     "shared": split_k.metadata.shared, "launch_pdl": bool(getattr(split_k.metadata, "launch_pdl", False))}}
    if merge_kernel:
        _, merge_meta = pd_merge.merge_launch(splits, HEAD_DIM, HEAD_DIM, config.merge_programs_per_head, gdc)
        merge_k = _compile(pd_merge._merge_splits_kernel, merge_meta, dict(num_warps=4, **pd_device._launch_options(gdc)))
        out["merge"] = {**ptx_order(merge_k.asm["ptx"]), **(_registers(merge_k) or {}),
                        "launch_pdl": bool(getattr(merge_k.metadata, "launch_pdl", False))}
    return out


def _two_pass_meta(config, splits, gdc, split_pdl) -> dict:
    merge_kernel = splits > 1 and not config.fused_merge
    return dict(GROUP=GROUP, GROUP_PAD=16, HEAD_DIM=HEAD_DIM, DIM_PAD=HEAD_DIM, BLOCK_SIZE=BLOCK,
                BLOCKS_PER_ITER=config.blocks_per_iter, SPLIT=splits > 1, FUSED_MERGE=config.fused_merge and splits > 1,
                GROUP_POW2=triton.next_power_of_2(GROUP) if config.fused_merge else 1,
                MERGE_CHUNK=pd_merge._merge_chunk(GROUP, HEAD_DIM, config.num_warps) if config.fused_merge else 1,
                F32_DOT=False, INTERLEAVED=config.interleaved,
                EARLY_METADATA=config.pdl == "early-metadata", PDL_WAIT=split_pdl, PDL_TRIGGER=gdc and merge_kernel)


def structural_variants() -> dict:
    base = pd_config.TWO_PASS_CONFIG
    return {"default": base,
            "interleaved": dataclasses.replace(base, interleaved=True),
            "pdl merge": dataclasses.replace(base, pdl="merge"),
            "pdl all": dataclasses.replace(base, pdl="all"),
            "interleaved pdl all": dataclasses.replace(base, interleaved=True, pdl="all"),
            "interleaved pdl early-metadata": dataclasses.replace(base, interleaved=True, pdl="early-metadata"),
            "contiguous pdl early-metadata": dataclasses.replace(base, pdl="early-metadata"),
            "maxnreg 128": dataclasses.replace(base, max_registers=128),
            "interleaved pdl all maxnreg 128": dataclasses.replace(base, interleaved=True, pdl="all", max_registers=128),
            "blocks early-metadata": dataclasses.replace(BLOCKS_KERNEL, pdl="early-metadata"),
            "blocks 2-block steps, 8 warps, 2 stages": dataclasses.replace(BLOCKS_KERNEL, blocks_per_iter=2,
                                                                           num_stages=2),
            "blocks tma early-metadata": dataclasses.replace(BLOCKS_KERNEL, kv_loads="tma", pdl="early-metadata")}


# Kernel "blocks" in its shipped form (paged_decode.BLOCKS_CONFIG).
BLOCKS_KERNEL = pd_config.BLOCKS_CONFIG


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    failed = 0
    for name, config in structural_variants().items():
        try:
            row = {"variant": name, **compile_variant(config)}
        except SignatureMismatch as exc:
            failed += 1
            row = {"variant": name, "error": f"SignatureMismatch: {exc}"[:500]}
        except Exception as exc:  # noqa: BLE001 - report every variant
            if name == "default":
                # The default kernel compiles on every GPU it has run on: failing here means this
                # script's use of Triton's ahead-of-time API does not fit this Triton version.
                print(json.dumps({"api_unsupported": f"triton {triton.__version__}: {type(exc).__name__}: {exc}"[:500]}))
                sys.exit(3)
            failed += 1
            row = {"variant": name, "error": f"{type(exc).__name__}: {exc}"[:500]}
        if args.json:
            print(json.dumps(row), flush=True)
        else:
            print(name, {k: v for k, v in row.items() if k != "variant"}, flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
