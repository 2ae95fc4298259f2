"""The stopping rule of the default GPU timing, on the CPU: the paired bootstrap interval of the
ratio of two medians (fk_pytest.timing.ratio_ci) is narrow for steady rounds, wide for noisy ones,
and sees a shift of both runners in one round as what it is (paired, so it cancels); and a timing
runner's warm-up billed as a phase of its own."""
import dataclasses
import random

from fk_pytest.timing import ratio_ci


def _noisy(n, center, rel, seed):
    rng = random.Random(seed)
    return [center * (1 + rng.gauss(0, rel)) for _ in range(n)]


def test_steady_rounds_give_a_narrow_interval_and_noisy_ones_a_wide_one():
    steady = ratio_ci(_noisy(50, 10.0, 0.005, 1), _noisy(50, 20.0, 0.005, 2))
    noisy = ratio_ci(_noisy(50, 10.0, 0.10, 1), _noisy(50, 20.0, 0.10, 2))
    assert steady < 0.005 < 0.02 < noisy


def test_more_rounds_narrow_the_interval():
    few = ratio_ci(_noisy(20, 10.0, 0.05, 3), _noisy(20, 10.0, 0.05, 4))
    many = ratio_ci(_noisy(500, 10.0, 0.05, 3), _noisy(500, 10.0, 0.05, 4))
    assert many < few / 2


def test_a_drift_both_runners_share_round_by_round_cancels_in_the_paired_interval():
    rng = random.Random(5)
    drift = [1 + 0.2 * rng.random() for _ in range(60)]  # clocks moving both runners of a round
    a = [10.0 * d * (1 + rng.gauss(0, 0.002)) for d in drift]
    b = [12.0 * d * (1 + rng.gauss(0, 0.002)) for d in drift]
    shuffled = b[:]
    random.Random(6).shuffle(shuffled)  # the same values unpaired: the drift no longer cancels
    assert ratio_ci(a, b) < 0.01 < ratio_ci(a, shuffled)


def test_too_few_rounds_have_no_interval():
    assert ratio_ci([1.0, 1.0, 1.0], [1.0, 1.0, 1.0]) == float("inf")


def test_autotune_buckets_keep_a_decode_batch_and_a_prefill_apart():
    """Per-head norms of a 143-token decode batch (4576 rows) and of a 16384-token prefill (524288
    rows) once shared one autotune bucket, so the config tuned on the first ran the second up to 4x
    slower than its own best (H200, docs/perf/h200-suite-cost.md)."""
    from kernels_reference.triton_rows import size_class
    assert size_class(143 * 32) != size_class(16384 * 32) != size_class(8192 * 32)
    assert size_class(1) == 1 and size_class(5) == size_class(16) == 16


def test_a_reference_under_the_roofline_floor_is_flagged_and_its_case_not_scored():
    import torch
    from fk_pytest.results import TaskRecord
    from fk_pytest.speed import _result, under_roofline
    from fk_pytest.timing import Timing
    from tasks.L1.test_silu_and_mul import TASK

    case = next(c for c in TASK.cases("full") if c.dtype == torch.bfloat16)
    floor_us = TASK.io_bytes(case) / 4.0e12 * 1e6  # at 4 TB/s
    roofline = {"copy_tbps": 4.0, "bf16_gemm_tflops": 700.0}

    def timing(us):
        return Timing(us, 0.01, 50, "cuda-graph", [us] * 50)

    honest = _result(TASK, case, timing(2 * floor_us), timing(3 * floor_us), roofline)
    too_fast_ref = _result(TASK, case, timing(2 * floor_us), timing(0.5 * floor_us), roofline)
    assert not honest.ref_suspect and not honest.suspect
    assert too_fast_ref.ref_suspect and not too_fast_ref.suspect
    assert under_roofline(TASK, case, {"reference": timing(0.5 * floor_us)}, roofline)
    assert not under_roofline(TASK, case, {"reference": timing(2 * floor_us)}, roofline)
    assert not under_roofline(TASK, case, {"reference": timing(0.5 * floor_us)}, None)

    record = TaskRecord(TASK.name, TASK.level, TASK.family, TASK.module_path, TASK.class_name)
    record.speed = {"a": honest, "b": dataclasses.replace(too_fast_ref, case_id="b")}
    assert [s.case_id for s in record.timed] == [honest.case_id]


def test_slow_rounds_need_fewer_than_the_minimum_but_never_fewer_than_one_interval_check():
    from fk_pytest.speed import QUICK_MIN_ROUNDS, QUICK_MIN_SECONDS
    from fk_pytest.timing import CI_CHECK_EVERY, SLOW_MIN_ROUNDS, min_rounds_for
    assert min_rounds_for(5e-6, QUICK_MIN_ROUNDS, QUICK_MIN_SECONDS) == QUICK_MIN_ROUNDS  # decode-sized
    assert min_rounds_for(0.01, QUICK_MIN_ROUNDS, QUICK_MIN_SECONDS) == QUICK_MIN_ROUNDS  # 0.5 s in all
    assert min_rounds_for(0.1, QUICK_MIN_ROUNDS, QUICK_MIN_SECONDS) == 20
    assert min_rounds_for(3.2, QUICK_MIN_ROUNDS, QUICK_MIN_SECONDS) == SLOW_MIN_ROUNDS >= CI_CHECK_EVERY


def test_end_to_end_rounds_grow_for_short_scenarios():
    """A scenario of milliseconds is timed for about a second per side; a long one keeps the
    spec's rounds; never more than the cap; always odd (the median is one sample)."""
    from fk_pytest.e2e_run import MAX_TIMED_ROUNDS, MIN_TIMED_S, timed_rounds

    assert timed_rounds(3, 5.0) == 3
    assert timed_rounds(3, MIN_TIMED_S / 10) == 11
    assert timed_rounds(3, 1e-5) == MAX_TIMED_ROUNDS
    assert all(timed_rounds(r, s) % 2 == 1 for r in (2, 3, 4) for s in (1e-4, 0.07, 0.3, 9.0))


def _loop_on_fake_events(monkeypatch, broken_share, single_us=10.0, call_us=2.0, calls=7, rounds=100):
    """``time_pair_cuda`` over one runner on fake CUDA events; in ``broken_share`` of the rounds the
    K-call replay reads shorter than the one-call one, as when the host, not the GPU, set the pace."""
    from fakes.gpu_loop import Runner, fake_events
    from fk_pytest import timing

    rng = random.Random(0)

    def window_us(n):  # 4 one-call estimates, the rounds' one-call windows, then their K-call ones
        if n <= 4 + rounds:
            us = single_us
        elif rng.random() < broken_share:
            us = single_us * 0.5
        else:
            us = single_us + call_us * (calls - 1)
        return us * (1 + rng.gauss(0, 0.01))

    fake_events(monkeypatch, window_us)
    return lambda: timing.time_pair_cuda({"reference": Runner()}, lambda: None, budget_s=0.0, min_rounds=rounds,
                                         max_rounds=rounds, more_sets=lambda n: [{}] * n, calls=calls)


def test_an_amortised_time_from_mostly_clamped_rounds_is_refused_naming_the_runner(monkeypatch):
    import pytest
    from fk_pytest.timing import TimingUnreliable

    run = _loop_on_fake_events(monkeypatch, broken_share=0.5)
    with pytest.raises(TimingUnreliable, match=r"reference: the 7-call replay was no longer"):
        run()


def test_a_few_clamped_rounds_leave_the_median_per_call_time(monkeypatch):
    out = _loop_on_fake_events(monkeypatch, broken_share=0.1)()["reference"]
    assert out.calls == 7 and abs(out.median_us - 2.0) < 0.1


def test_the_roofline_names_an_unknown_estimator_before_touching_a_device():
    import pytest
    from fk_pytest.timing import measure_roofline
    with pytest.raises(ValueError, match="statistic must be 'best' or 'median', got 'mean'"):
        measure_roofline("cpu", statistic="mean")


def test_a_runner_s_warm_up_is_billed_apart_from_the_capture(monkeypatch):
    """The first calls of a timing runner (on a bare GPU machine mostly compilation) bill the
    phase "warm_up", not "capture" around it: a cost table then says which of the two it was."""
    import time

    import torch

    from fk_pytest import phases
    from fk_pytest.timing import _GpuRunner

    monkeypatch.setattr(_GpuRunner, "_warm", lambda self, sets: time.sleep(0.05))
    phases.take()
    with phases.phase("capture"):
        _GpuRunner(torch.nn.Identity(), [{}], use_graphs=False)
    billed = phases.take()
    assert billed.get("warm_up", 0) >= 0.05 and billed["capture"] < 0.05, billed
