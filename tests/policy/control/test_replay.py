"""Closed-loop replay: exact counts on a simulated clock, one generous run on the real clock,
and ``bench-inference --closed-loop`` end to end.

The test policy's call takes 20 ms, and 60 ms on every tenth call (``test_control``'s
pattern, without jitter on the simulated clock), at 30 Hz (dt = 33.3 ms): d = 1, and d = 2
on every tenth call. Its latency is slept on the replay's own clock, so on the
:class:`VirtualClock` every count is exact whatever the machine's load.
"""

from __future__ import annotations

import json
import math
import threading

import pytest

from scopebench.cli import main
from scopebench.policy.control.figures import ControlRate, control_figures
from scopebench.policy.control.replay import RealClock, VirtualClock, predict, replay

from ..conftest import TINY
from .test_control import control_policies  # noqa: F401 - the fixture, reused

HZ, TICKS = 30.0, 330


def _latency(i: int) -> float:
    """Call ``i`` (0: the first chunk, before t0): 60 ms on every tenth call, else 20 ms."""
    return 0.06 if i % 10 == 9 else 0.02


def _policy(clock):
    calls = []

    def infer():
        calls.append(clock.now())
        clock.sleep_until(clock.now() + _latency(len(calls) - 1))
        return len(calls) - 1

    return infer


def _run(mode: str, n: int, ticks: int = TICKS):
    clock = VirtualClock()
    return replay(_policy(clock), mode, ControlRate(HZ, n), ticks, clock=clock)


def test_sync_one_action_a_chunk_stalls_once_a_slow_call():
    f = _run("sync", 1)
    # a chunk of d = 1 lasts 1 tick, one of d = 2 lasts 2 ticks with 1 stall: 11 ticks per 10 calls
    assert f.stalls == TICKS // 11 == 30
    assert f.chunks == TICKS - f.stalls
    assert f.stall_sec == pytest.approx(f.stalls * (0.06 - 1 / HZ))  # each slow call's overrun
    assert (f.discarded, f.skipped, f.stale) == (0, 0, 0)
    assert (f.max_lateness_sec, f.drift_sec) == (0.0, 0.0)


def test_sync_stalls_agree_with_the_distribution_estimate():
    measured = _run("sync", 1)
    figures = control_figures(measured.latencies_sec, ControlRate(HZ, 1))  # ControlFigures' d of the same calls
    per_chunk = sum(max(0, d - 1) * c for d, c in figures.delay_steps.items()) / figures.calls
    ticks_per_chunk = sum(max(1, d) * c for d, c in figures.delay_steps.items()) / figures.calls
    assert abs(measured.stalls - TICKS * per_chunk / ticks_per_chunk) <= TICKS / 100
    estimate = predict([_latency(i) for i in range(10)], "sync", ControlRate(HZ, 1), TICKS)
    assert estimate.stalls == measured.stalls and estimate.chunks == measured.chunks
    assert estimate.stall_sec == pytest.approx(measured.stall_sec)


def test_four_actions_a_chunk_never_stall():
    for mode in ("sync", "async"):
        f = _run(mode, 4)
        assert f.stalls == 0 and f.stall_sec == 0.0, mode


def _async_discarded(n: int, ticks: int) -> tuple[int, int]:
    """Analytic async counts: chunk i (call i, d_i = ceil(latency * hz), d_0 = 0) is adopted at
    T_i = T_{i-1} + d_i at index d_i and supersedes n - d_{i-1} - d_i actions of chunk i - 1."""
    d = lambda i: 0 if i == 0 else math.ceil(_latency(i) * HZ)  # noqa: E731
    discarded, adopted, t, i = 0, 0, 0, 1
    while t + d(i) < ticks:
        t += d(i)
        discarded += n - d(i - 1) - d(i)
        adopted, i = adopted + 1, i + 1
    return discarded, adopted


def test_async_discards_what_each_new_chunk_supersedes():
    f = _run("async", 4)
    discarded, adopted = _async_discarded(4, TICKS)
    assert f.discarded == discarded and f.chunks == adopted + 1
    assert f.skipped == sum(math.ceil(_latency(i) * HZ) for i in range(1, adopted + 1))
    assert predict([_latency(i) for i in range(10)], "async", ControlRate(HZ, 4), TICKS).discarded == discarded


def test_async_with_one_action_a_chunk_has_only_stale_chunks():
    f = _run("async", 1)  # d >= 1 = n: every arrived chunk's only action is for an elapsed tick
    assert f.stale == f.chunks - 1 and f.stalls == TICKS - 1


def test_the_actions_executed_are_the_due_ones():
    clock, done = VirtualClock(), []
    replay(
        _policy(clock), "async", ControlRate(HZ, 4), 40, clock=clock, execute=lambda chunk, j: done.append((chunk, j))
    )
    assert len(done) == 40 and done[0] == (0, 0) and done[1] == (1, 1)  # chunk 1 arrives at tick 1, d = 1


def test_bad_arguments_are_refused_naming_them():
    with pytest.raises(ValueError, match=r"^mode must be one of sync, async, got 'x'$"):
        predict([0.02], "x", ControlRate(HZ, 1), 10)
    with pytest.raises(ValueError, match=r"^ticks must be an integer >= 1, got 0$"):
        replay(lambda: None, "sync", ControlRate(HZ, 1), 0)


def test_an_inference_error_ends_the_replay_as_it_was_raised():
    """The worker's exception itself reaches the caller (a policy's one-line error stays one
    line; it was wrapped in a ``RuntimeError``, two tracebacks)."""
    clock, calls = VirtualClock(), []

    def infer():
        calls.append(1)
        if len(calls) > 2:
            raise OSError("camera unplugged")
        clock.sleep_until(clock.now() + 0.01)

    with pytest.raises(OSError, match="^camera unplugged$") as info:
        replay(infer, "sync", ControlRate(HZ, 1), 50, clock=clock)
    assert info.value.__cause__ is None and len(calls) == 3
    assert threading.active_count() == 1 or all(t.name != "scopebench-replay-infer" for t in threading.enumerate())


def test_a_first_call_that_raises_ends_the_replay_before_t0():
    def infer():
        raise OSError("no weights")

    with pytest.raises(OSError, match="^no weights$"):
        replay(infer, "async", ControlRate(HZ, 4), 10, clock=VirtualClock())


def test_an_error_of_the_call_in_flight_at_the_last_tick_is_not_lost():
    clock, calls = VirtualClock(), []

    def infer():  # the replay's second call starts at t0 and lasts 9 ticks, past the last one
        calls.append(1)
        clock.sleep_until(clock.now() + (0.01 if len(calls) == 1 else 0.3))
        if len(calls) == 2:
            raise OSError("camera unplugged")

    with pytest.raises(OSError, match="^camera unplugged$"):
        replay(infer, "sync", ControlRate(HZ, 4), 3, clock=clock)
    assert len(calls) == 2


def test_each_chunk_is_checked_after_its_latency_is_taken():
    clock, checked = VirtualClock(), []

    def check(chunk):
        checked.append(chunk)
        clock.sleep_until(clock.now() + 1.0)  # a check as slow as 30 ticks: not in the call's latency

    figures = replay(_policy(clock), "sync", ControlRate(HZ, 4), 100, clock=clock, check=check)
    assert checked == list(range(len(figures.latencies_sec)))
    assert figures.latencies_sec == pytest.approx([_latency(i) for i in range(len(checked))])

    def refuse(chunk):
        if chunk == 3:
            raise ValueError("chunk 3 is garbage")

    with pytest.raises(ValueError, match="^chunk 3 is garbage$"):
        replay(_policy(clock), "sync", ControlRate(HZ, 4), 100, clock=clock, check=refuse)


def test_the_duration_of_a_replay_is_bounded_naming_the_keys():
    from scopebench.policy.control.replay import MAX_REPLAY_SEC, check_duration

    assert check_duration(300, 30.0) == 10.0 and MAX_REPLAY_SEC == 3600
    assert check_duration(7200, 1.0, 7200) == 7200.0  # the bound raised
    keys = ("--closed-loop-ticks", "--control-hz", "--closed-loop-max-sec")
    line = (
        r"^--closed-loop-ticks=1000000000 at --control-hz=30 would run the closed loop for 1\.1 years \(33333333 s\), "
        r"over --closed-loop-max-sec=3600 \(1 h\): fewer ticks, a higher --control-hz, or a larger --closed-loop-max-sec$"
    )
    with pytest.raises(ValueError, match=line):
        check_duration(10**9, 30.0, keys=keys)
    with pytest.raises(ValueError, match=r"^ticks=300 at control_hz=0\.001 would run the closed loop for 3\.5 days"):
        check_duration(300, 0.001)


def test_every_call_runs_in_the_worker_thread():
    clock, threads = VirtualClock(), set()

    def infer():
        threads.add(threading.current_thread().name)
        clock.sleep_until(clock.now() + 0.02)

    replay(infer, "sync", ControlRate(HZ, 1), 20, clock=clock)
    assert threads == {"scopebench-replay-infer"}


def test_real_clock_has_no_drift_and_about_the_expected_stalls():
    """The one wall-clock test, with no bound a busy machine can break: each tick is scheduled
    at t0 + k * dt, so lateness is measured, never negative, and does not accumulate (the
    exact zero drift is the simulated clock's test above); stalls need the slow calls to
    overrun (60 ms vs 33 ms) and are compared with the estimate only when the clock kept time."""
    clock = RealClock()
    f = replay(_policy(clock), "sync", ControlRate(HZ, 1), 60, clock=clock)
    assert f.max_lateness_sec >= 0.0 and math.isfinite(f.drift_sec)
    assert f.mean_lateness_sec >= 0.0 and 0 <= f.stalls <= 60
    assert min(f.latencies_sec) >= 0.02  # a call lasts at least its sleep
    # the estimate over the loop's own calls misses only what the executor's lateness and the
    # worker's wake-up move across a tick: compared, within a tenth of the ticks, when the
    # clock kept time
    own = predict(f.latencies_sec, "sync", ControlRate(HZ, 1), 60)
    if f.max_lateness_sec < 0.005:
        assert abs(f.stalls - own.stalls) <= 6


def test_bench_inference_closed_loop(control_policies, tmp_path, capsys):  # noqa: F811
    out = tmp_path / "r.json"
    args = ["bench-inference", "--config", TINY, "--policy", f"{control_policies}:quick", "--policy.n_warmup=0"]
    args += ["--n-timed", "5", "--output-dir", str(tmp_path), "--json", str(out), "--control-hz", "30"]
    args += ["--n-action-steps", "4", "--closed-loop", "sync", "--closed-loop-ticks", "12"]
    assert main(args) == 0
    text = capsys.readouterr().out
    assert text.startswith("closed loop: sync, 12 ticks at 30 Hz: about 0.4 s after the 5 timed calls")
    assert "closed loop (measured): sync at 30 Hz, 4 actions a chunk" in text
    assert "closed loop (from the timed calls' latencies):" in text
    assert "closed loop (from the replay's own latencies):" in text
    loop = json.loads(out.read_text())["closed_loop"]
    assert loop["measured"]["ticks"] == 12 and loop["measured"]["mode"] == "sync" and loop["expected_sec"] == 0.4
    assert loop["estimate"]["ticks"] == 12 and loop["estimate"]["max_lateness_sec"] is None
    assert len(loop["latencies_sec"]) == loop["measured"]["calls"] and loop["estimate_replay_calls"]["ticks"] == 12


def test_the_replay_takes_a_validated_control_rate():
    with pytest.raises(TypeError, match=r"^rate must be a ControlRate, got int$"):
        predict([0.02], "sync", 30, 10)


def test_closed_loop_needs_a_control_rate(control_policies, tmp_path, capsys):  # noqa: F811
    args = ["bench-inference", "--config", TINY, "--policy", f"{control_policies}:quick"]
    args += ["--output-dir", str(tmp_path), "--closed-loop", "sync"]
    assert main(args) != 0
    assert "--closed-loop needs a control rate" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flags", "line"),
    [
        # refused without --closed-loop too: a bad value is a bad value
        (["--closed-loop-ticks", "-3"], "--closed-loop-ticks must be an integer >= 1, got -3"),
        (["--closed-loop-max-sec", "0"], "--closed-loop-max-sec must be a finite number > 0, got 0"),
        (["--n-timed", "0"], "--n-timed must be an integer >= 1, got 0"),  # the validators' words, as every flag's
        (
            ["--control-hz", "0.001", "--closed-loop", "sync"],
            "--closed-loop-ticks=300 at --control-hz=0.001 would run the closed loop for 3.5 days (300000 s), over "
            "--closed-loop-max-sec=3600 (1 h): fewer ticks, a higher --control-hz, or a larger --closed-loop-max-sec",
        ),
        (
            ["--policy.control_hz=30", "--closed-loop", "async", "--closed-loop-ticks", "1000000000"],
            "--closed-loop-ticks=1000000000 at policy.control_hz=30 would run the closed loop for 1.1 years",
        ),
    ],
)
def test_a_closed_loop_too_long_or_bad_ticks_are_refused_before_any_work(flags, line, tmp_path, capsys, monkeypatch):
    import scopebench.policy.run.inference as inference

    def no_run(*args, **kwargs):
        raise AssertionError("the run started")

    monkeypatch.setattr(inference.InferenceRun, "__init__", no_run)
    code = main(["bench-inference", "--config", TINY, *flags, "--output-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and line in err, err


def test_the_closed_loop_says_how_long_it_will_take_before_the_run_starts(tmp_path, capsys, monkeypatch):
    import scopebench.policy.run.inference as inference

    def no_run(*args, **kwargs):
        raise AssertionError("the run started")

    monkeypatch.setattr(inference.InferenceRun, "__init__", no_run)
    args = ["bench-inference", "--config", TINY, "--control-hz", "1", "--closed-loop", "sync", "--n-timed", "7"]
    args += ["--closed-loop-ticks", "7200", "--closed-loop-max-sec", "7200", "--output-dir", str(tmp_path)]
    with pytest.raises(AssertionError, match="the run started"):  # the bound raised: accepted
        main(args)
    assert capsys.readouterr().out == (
        "closed loop: sync, 7200 ticks at 1 Hz: about 2 h after the 7 timed calls (at most 2 h: --closed-loop-max-sec)\n"
    )
