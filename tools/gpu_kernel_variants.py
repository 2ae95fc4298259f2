"""Where the reference's memory-bound kernels stand against Inductor, and what closes the gap.

    OUT=out PYTHONPATH=$PWD/src:$PWD python3 tools/gpu_kernel_variants.py      # on the H200, ~6 min

1. Inductor's generated Triton for the shapes where it led (fused-add RMSNorm 16384x4096, SiluAndMul
   16384x28672), saved to $OUT/inductor_code.txt (TORCH_LOGS=output_code's content).
2. RMSNorm (plain and fused add) and SiluAndMul at decode and prefill token counts: the reference,
   torch.compile of its plain-PyTorch definition, and kernel variants (constexpr widths, no masks
   where the shape is even, int32 offsets, 2-D silu grid), all timed with the suite's own amortised
   method (fk_pytest.timing: K calls per CUDA-graph replay on rotated inputs, L2 flushed before each
   replay; the single-call replay time beside it).
3. The amortised method itself: the reference against an identical copy (ratio must be 1.00 +-
   0.03) and against itself run twice per call (true ratio 0.5), at decode sizes; and CUPTI kernel
   durations (torch.profiler) beside the per-call times.
4. Paged decode at B1 C8192 over the DecodeConfig knobs, amortised.

Prints a short table last; writes $OUT/variants.json.
"""
from __future__ import annotations

import dataclasses
import json
import os
import statistics
import sys
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "src")]

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from fk_pytest.timing import L2Flusher, _GpuRunner, measure_roofline, time_pair_cuda  # noqa: E402
from kernels_reference.L1 import paged_decode as decode_mod  # noqa: E402
from kernels_reference.L1.rms_norm import RMSNorm  # noqa: E402
from kernels_reference.L1.silu_and_mul import SiluAndMul  # noqa: E402

torch._dynamo.config.recompile_limit = 256  # every shape recompiles forward_native; past 8 it runs eager
DEV = torch.device("cuda")
OUT = os.environ.get("OUT", "out")
os.makedirs(OUT, exist_ok=True)
RESULT = {"env": {"torch": torch.__version__, "triton": triton.__version__, "gpu": torch.cuda.get_device_name()}}
FLUSH = L2Flusher(DEV)
STARTED = time.time()


def save():
    with open(os.path.join(OUT, "variants.json"), "w") as f:
        json.dump(RESULT, f, indent=1, default=str)


def section(name, fn):
    t0 = time.time()
    try:
        RESULT[name] = fn()
    except Exception:  # noqa: BLE001 - one section failing must not lose the others
        RESULT[name] = {"error": traceback.format_exc()[-3000:]}
        print(f"[{name}] FAILED\n{RESULT[name]['error']}", flush=True)
    print(f"[{name}] {time.time() - t0:.0f} s (total {time.time() - STARTED:.0f} s)", flush=True)
    save()


def gen(seed):
    return torch.Generator(device=DEV).manual_seed(seed)


def timed(impls, make_set, budget_s=0.3):
    """{name: per-call us, single us, calls} for callables fn(inputs) timed interleaved."""
    sets = [make_set(i) for i in range(4)]
    runners = {n: _GpuRunner(fn, sets, True, lambda f, s: f(s)) for n, fn in impls.items()}
    timings = time_pair_cuda(runners, FLUSH, budget_s=budget_s, more_sets=lambda n: [make_set(4 + i) for i in range(n)])
    return {n: {"us": t.median_us, "single_us": t.single_us, "calls": t.calls, "spread": t.spread, "mode": t.mode}
            for n, t in timings.items()}


# ---- kernel variants -----------------------------------------------------------------------------
@triton.jit
def _rms_even(x_ptr, r_ptr, w_ptr, o_ptr, ro_ptr, n_rows, x_stride, r_stride, eps,
              WIDTH: tl.constexpr, BLOCK: tl.constexpr, HAS_RES: tl.constexpr, EVEN: tl.constexpr,
              EVICT: tl.constexpr):
    """One row per program, width constexpr, masks only where the row is padded, int32 offsets."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    if EVEN:
        x = tl.load(x_ptr + row * x_stride + cols, eviction_policy=EVICT).to(tl.float32)
        w = tl.load(w_ptr + cols, eviction_policy="evict_last").to(tl.float32)
    else:
        x = tl.load(x_ptr + row * x_stride + cols, mask=cols < WIDTH, other=0.0, eviction_policy=EVICT).to(tl.float32)
        w = tl.load(w_ptr + cols, mask=cols < WIDTH, other=0.0, eviction_policy="evict_last").to(tl.float32)
    if HAS_RES:
        if EVEN:
            x += tl.load(r_ptr + row * r_stride + cols, eviction_policy=EVICT).to(tl.float32)
            tl.store(ro_ptr + row * WIDTH + cols, x.to(ro_ptr.dtype.element_ty))
        else:
            x += tl.load(r_ptr + row * r_stride + cols, mask=cols < WIDTH, other=0.0, eviction_policy=EVICT).to(tl.float32)
            tl.store(ro_ptr + row * WIDTH + cols, x.to(ro_ptr.dtype.element_ty), mask=cols < WIDTH)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / WIDTH + eps)
    y = (x * rstd).to(o_ptr.dtype.element_ty).to(tl.float32) * w
    if EVEN:
        tl.store(o_ptr + row * WIDTH + cols, y.to(o_ptr.dtype.element_ty))
    else:
        tl.store(o_ptr + row * WIDTH + cols, y.to(o_ptr.dtype.element_ty), mask=cols < WIDTH)


def rms_variant(weight, eps, warps, evict):
    width = weight.numel()
    block = triton.next_power_of_2(width)

    def fn(s):
        x, r = s["x"], s["residual"]
        out = torch.empty_like(x)
        ro = torch.empty_like(x) if r is not None else out
        _rms_even[(x.shape[0],)](x, r if r is not None else x, weight, out, ro, x.shape[0], x.stride(0),
                                 (r if r is not None else x).stride(0), eps, WIDTH=width, BLOCK=block,
                                 HAS_RES=r is not None, EVEN=block == width, EVICT=evict, num_warps=warps)
        return out if r is None else (out, ro)
    return fn


@triton.jit
def _silu_2d(x_ptr, o_ptr, x_stride, D: tl.constexpr, XBLOCK: tl.constexpr, EVEN: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * XBLOCK + tl.arange(0, XBLOCK)
    src = x_ptr + row.to(tl.int64) * x_stride + cols
    if EVEN:
        g = tl.load(src).to(tl.float32)
        u = tl.load(src + D).to(tl.float32)
    else:
        g = tl.load(src, mask=cols < D, other=0.0).to(tl.float32)
        u = tl.load(src + D, mask=cols < D, other=0.0).to(tl.float32)
    y = (g / (1.0 + tl.exp(-g)) * u).to(o_ptr.dtype.element_ty)
    dst = o_ptr + row.to(tl.int64) * D + cols
    if EVEN:
        tl.store(dst, y)
    else:
        tl.store(dst, y, mask=cols < D)


@triton.jit
def _silu_flat_const(x_ptr, o_ptr, n_out, x_stride, D: tl.constexpr, XBLOCK: tl.constexpr):
    """The reference's flat range with the width as a compile-time constant (division by a
    constant is a multiply and shift; by a run-time value it is a long instruction sequence)."""
    offs = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
    mask = offs < n_out
    row = offs // D
    src = row * x_stride + (offs - row * D)
    g = tl.load(x_ptr + src, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(x_ptr + src + D, mask=mask, other=0.0).to(tl.float32)
    tl.store(o_ptr + offs, (g / (1.0 + tl.exp(-g)) * u).to(o_ptr.dtype.element_ty), mask=mask)


def silu_2d(xblock, warps):
    def fn(s):
        x = s["x"]
        d = x.shape[-1] // 2
        out = torch.empty(x.shape[0], d, dtype=x.dtype, device=x.device)
        _silu_2d[(x.shape[0], triton.cdiv(d, xblock))](x, out, x.stride(0), D=d, XBLOCK=xblock,
                                                       EVEN=d % xblock == 0, num_warps=warps)
        return out
    return fn


def silu_flat_const(xblock, warps):
    def fn(s):
        x = s["x"]
        d = x.shape[-1] // 2
        out = torch.empty(x.shape[0], d, dtype=x.dtype, device=x.device)
        n = out.numel()
        _silu_flat_const[(triton.cdiv(n, xblock),)](x, out, n, x.stride(0), D=d, XBLOCK=xblock, num_warps=warps)
        return out
    return fn


# ---- 1. Inductor's code ---------------------------------------------------------------------------
def inductor_code():
    from torch._inductor.utils import run_and_get_code
    texts = []
    norm = RMSNorm(4096, 1e-5).to(DEV, torch.bfloat16)
    x = torch.randn(16384, 4096, device=DEV, dtype=torch.bfloat16)
    r = torch.randn_like(x)
    _, code = run_and_get_code(torch.compile(norm.forward_native, dynamic=False), x, r)
    texts.append("# ==== fused-add RMSNorm 16384x4096 bf16 ====\n" + "\n".join(code))
    act = SiluAndMul()
    y = torch.randn(16384, 28672, device=DEV, dtype=torch.bfloat16)
    _, code = run_and_get_code(torch.compile(act.forward_native, dynamic=False), y)
    texts.append("# ==== SiluAndMul 16384x28672 bf16 ====\n" + "\n".join(code))
    with open(os.path.join(OUT, "inductor_code.txt"), "w") as f:
        f.write("\n\n".join(texts))
    return {"saved": "inductor_code.txt", "chars": sum(map(len, texts))}


# ---- 2. RMSNorm / SiluAndMul variants ----------------------------------------------------------------
def rms_rows():
    rows = []
    for hidden in (4096, 3584):
        for tokens in (1, 32, 256, 2048, 8192, 16384):
            for fused in (False, True):
                if hidden == 3584 and tokens not in (32, 16384):
                    continue
                norm = RMSNorm(hidden, 1e-5).to(DEV, torch.bfloat16)
                with torch.no_grad():
                    norm.weight.copy_(1 + 0.1 * torch.randn(hidden, device=DEV))

                def make(i, tokens=tokens, hidden=hidden, fused=fused):
                    g = gen(i)
                    x = torch.randn(tokens, hidden, generator=g, device=DEV).to(torch.bfloat16)
                    return {"x": x, "residual": 4 * torch.randn(tokens, hidden, generator=g, device=DEV)
                            .to(torch.bfloat16) if fused else None}
                compiled = torch.compile(norm.forward_native, dynamic=False)
                impls = {"reference": lambda s, m=norm: m(s["x"], s["residual"]),
                         "inductor": lambda s, c=compiled: c(s["x"], s["residual"])}
                for warps in (4, 8, 16):
                    impls[f"even-w{warps}"] = rms_variant(norm.weight, 1e-5, warps, "")
                impls["even-w8-evict_first"] = rms_variant(norm.weight, 1e-5, 8, "evict_first")
                ref = impls["reference"](make(0))
                for name, fn in impls.items():  # every variant computes the same thing
                    got = fn(make(0))
                    a = ref if isinstance(ref, torch.Tensor) else ref[0]
                    b = got if isinstance(got, torch.Tensor) else got[0]
                    if float((a.float() - b.float()).abs().max()) > 0.07:
                        raise AssertionError(f"rms variant {name} disagrees at T={tokens}")
                nbytes = (2 + 2 * fused) * tokens * hidden * 2 + hidden * 2
                res = timed(impls, make)
                for name, t in res.items():
                    rows.append({"op": "rms_norm", "hidden": hidden, "tokens": tokens, "fused": fused,
                                 "impl": name, "bytes": nbytes, **t})
                print(f"rms h{hidden} T{tokens} fused={fused}: " + ", ".join(
                    f"{n} {t['us']:.2f}" for n, t in res.items()), flush=True)
    return rows


def silu_rows():
    rows = []
    for d in (14336, 18944):
        for tokens in (1, 32, 256, 2048, 8192, 16384):
            if d == 18944 and tokens not in (32, 16384):
                continue
            act = SiluAndMul()

            def make(i, tokens=tokens, d=d):
                return {"x": torch.randn(tokens, 2 * d, generator=gen(i), device=DEV).to(torch.bfloat16)}
            compiled = torch.compile(act.forward_native, dynamic=False)
            impls = {"reference": lambda s: act(s["x"]), "inductor": lambda s, c=compiled: c(s["x"])}
            for xb, w in ((1024, 4), (2048, 8), (4096, 8)):
                impls[f"2d-x{xb}-w{w}"] = silu_2d(xb, w)
            for xb, w in ((1024, 4), (2048, 8)):
                impls[f"flatconst-x{xb}-w{w}"] = silu_flat_const(xb, w)
            ref = impls["reference"](make(0))
            for name, fn in impls.items():
                if float((fn(make(0)).float() - ref.float()).abs().max()) > 0.07:
                    raise AssertionError(f"silu variant {name} disagrees at T={tokens}")
            nbytes = 3 * tokens * d * 2
            res = timed(impls, make)
            for name, t in res.items():
                rows.append({"op": "silu_and_mul", "d": d, "tokens": tokens, "impl": name, "bytes": nbytes, **t})
            print(f"silu d{d} T{tokens}: " + ", ".join(f"{n} {t['us']:.2f}" for n, t in res.items()), flush=True)
    return rows


# ---- 3. the amortised method ----------------------------------------------------------------------
def method_rows():
    rows = []
    for tokens in (1, 32, 256):
        norm = RMSNorm(4096, 1e-5).to(DEV, torch.bfloat16)
        twin = RMSNorm(4096, 1e-5).to(DEV, torch.bfloat16)

        def make(i, tokens=tokens):
            g = gen(i)
            return {"x": torch.randn(tokens, 4096, generator=g, device=DEV).to(torch.bfloat16),
                    "residual": torch.randn(tokens, 4096, generator=g, device=DEV).to(torch.bfloat16)}

        def twice(s):
            norm(s["x"], s["residual"])
            return norm(s["x"], s["residual"])
        res = timed({"reference": lambda s: norm(s["x"], s["residual"]),
                     "identical": lambda s: twin(s["x"], s["residual"]), "twice": twice}, make, budget_s=0.5)
        ref = res["reference"]
        rows.append({"tokens": tokens, "calls": ref["calls"],
                     "identical_ratio": ref["us"] / res["identical"]["us"],
                     "identical_ratio_single": ref["single_us"] / res["identical"]["single_us"],
                     "twice_ratio": ref["us"] / res["twice"]["us"],
                     "twice_ratio_single": ref["single_us"] / res["twice"]["single_us"],
                     "ref_us": ref["us"], "ref_single_us": ref["single_us"]})
        # CUPTI's kernel duration of the same call, for the overhead that remains per call
        from torch.profiler import ProfilerActivity, profile
        s = make(0)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(20):
                FLUSH()
                norm(s["x"], s["residual"])
            torch.cuda.synchronize()
        kernels = [e for e in prof.events() if e.device_type.name == "CUDA" and "rms" in e.name.lower()]
        rows[-1]["cupti_kernel_us"] = statistics.median([e.device_time for e in kernels]) if kernels else None
        print(f"method T{tokens}: {rows[-1]}", flush=True)
    return rows


# ---- 4. paged decode B1 C8192 -------------------------------------------------------------------------
def decode_rows():
    nq, nk, hd, block, ctx = 32, 8, 128, 16, 8192

    def make(i):
        g = gen(i)
        blocks = ctx // block + 2
        perm = torch.randperm(blocks, generator=g, device=DEV)[: ctx // block].to(torch.int32)
        return {"q": torch.randn(1, nq, hd, generator=g, device=DEV).to(torch.bfloat16),
                "k": torch.randn(blocks, block, nk, hd, generator=g, device=DEV).to(torch.bfloat16),
                "v": torch.randn(blocks, block, nk, hd, generator=g, device=DEV).to(torch.bfloat16),
                "bt": perm[None, :].contiguous(), "sl": torch.full((1,), ctx, dtype=torch.int32, device=DEV)}
    base = decode_mod.DECODE_CONFIG
    configs = {"default": base}
    for bpi in (4, 8, 16):
        for per_sm in (1, 2, 4, 8):
            for warps in (4, 8):
                if bpi == 16 and warps == 4:
                    continue
                configs[f"bpi{bpi}-psm{per_sm}-w{warps}"] = dataclasses.replace(
                    base, blocks_per_iter=bpi, small_batch_programs_per_sm=per_sm, num_warps=warps)
    configs["default-fused"] = dataclasses.replace(base, fused_merge=True)
    impls = {name: (lambda s, c=cfg: decode_mod.paged_decode(s["q"], s["k"], s["v"], s["bt"], s["sl"], hd ** -0.5, config=c))
             for name, cfg in configs.items()}
    ref = impls["default"](make(0))
    for name, fn in list(impls.items()):
        try:
            if float((fn(make(0)).float() - ref.float()).abs().max()) > 0.05:
                raise AssertionError("disagrees")
        except Exception as exc:  # noqa: BLE001
            print(f"decode {name} dropped: {exc}", flush=True)
            impls.pop(name)
    nbytes = (ctx * nk * hd * 2 + 2 * nq * hd) * 2
    out = []
    names = list(impls)
    for i in range(0, len(names), 8):  # timed in groups (each group interleaved, default in every group)
        group = {n: impls[n] for n in (["default"] + [n for n in names[i:i + 8] if n != "default"])}
        res = timed(group, make, budget_s=0.3)
        for name, t in res.items():
            out.append({"impl": name, "bytes": nbytes, "group": i // 8, **t,
                        "splits": decode_mod.decode_num_splits(1, nk, ctx // block, decode_mod.sm_count(DEV),
                                                               configs[name])})
    return out


def main():
    RESULT["roofline"] = measure_roofline(DEV)
    copy = RESULT["roofline"]["copy_tbps"]
    print("roofline", RESULT["roofline"], flush=True)
    section("method", method_rows)
    section("inductor", inductor_code)
    section("rms", rms_rows)
    section("silu", silu_rows)
    section("decode", decode_rows)
    print("\n==== summary (per-call us, amortised; frac = bytes / time / copy) ====")
    for r in RESULT.get("method", []) if isinstance(RESULT.get("method"), list) else []:
        print(f"method T{r['tokens']:<5} K={r['calls']:<3} identical {r['identical_ratio']:.3f} "
              f"(single {r['identical_ratio_single']:.3f})  twice {r['twice_ratio']:.3f} "
              f"(single {r['twice_ratio_single']:.3f})  ref {r['ref_us']:.2f} us/call, single {r['ref_single_us']:.2f}, "
              f"cupti {r.get('cupti_kernel_us')}")
    for key in ("rms", "silu"):
        rows = RESULT.get(key)
        if not isinstance(rows, list):
            continue
        groups = {}
        for r in rows:
            groups.setdefault((r.get("hidden", r.get("d")), r["tokens"], r.get("fused")), []).append(r)
        for shape, rs in groups.items():
            best = min(rs, key=lambda r: r["us"])
            ref = next(r for r in rs if r["impl"] == "reference")
            ind = next(r for r in rs if r["impl"] == "inductor")
            print(f"{key} {shape}: ref {ref['us']:.2f} ({ref['bytes'] / ref['us'] / 1e6 / copy:.2f}) "
                  f"inductor {ind['us']:.2f} best {best['impl']} {best['us']:.2f} "
                  f"({best['bytes'] / best['us'] / 1e6 / copy:.2f}) ind/ref {ind['us'] / ref['us']:.3f} "
                  f"ind/best {ind['us'] / best['us']:.3f}")
    rows = RESULT.get("decode")
    if isinstance(rows, list):
        for r in sorted(rows, key=lambda r: r["us"])[:8]:
            print(f"decode B1 C8192 {r['impl']:<22} splits {r['splits']:<3} {r['us']:.2f} us/call "
                  f"(single {r['single_us']:.2f}) frac {r['bytes'] / r['us'] / 1e6 / copy:.2f}")
    save()


if __name__ == "__main__":
    main()
