"""Latency of one ``sample_actions`` call at batch 1 (upstream ``benchmark_inference``).

What it measures: the full call of ``Pi05Inference`` (the same
:class:`scopebench.policy.run.inference.InferenceRun`): host preprocessing (tokenize,
resize, normalize), prefill, ``num_steps`` denoising steps, postprocessing, on an
observation of ``num_cameras`` images, a ``prompt_words``-word prompt and a state, with
random weights (latency depends on shapes, dtype and compilation, not on weight values).
``BENCH_N_WARMUP`` calls first (the first pays for ``torch.compile``; with compilation the
first-call / steady-call ratio is checked, >= 5x or a warning, and the graphs compiled are
counted: none is a compile that fell back to eager; the cold start, from the process's start
to the first action, is printed with it), then ``BENCH_N_TIMED``
timed calls: mean / std / p50 / p95 / p99 / min / max, per-phase medians, peak memory.

How to run (a single process)::

    scopebench bench-inference --config configs/policy/tiny.yml
    BENCH_NO_COMPILE=1 scopebench bench-inference --config configs/policy/small.yml
    BENCH_COMPILE_MODE=default scopebench bench-inference --config configs/policy/small.yml
    scopebench bench-inference --config configs/policy/tiny.yml --control-hz 30 --n-action-steps 4
    scopebench bench-inference --config configs/policy/tiny.yml --control-hz 30 --n-action-steps 4 \\
        --closed-loop sync --closed-loop-ticks 300
    scopebench bench-inference --config configs/policy/tiny.yml \\
        --policy examples/stateful_policy.py:make_policy --episode-length 20

``--chunks-per-call 1,2,4,8`` then times calls that sample B chunks each (B copies of the
observation in one call: best-of-N), ``--n-timed`` interleaved rounds of one call per B, and
says up to which B sampling more is free (median within 20 % of the smallest B's). A B whose
inputs alone (B times the bytes of one observation) exceed the memory available is refused
before any call, naming the most that fit.

A stateful policy (``UserPolicy.reset``) runs episodes of ``--episode-length`` calls, reset
between them (the reset is timed apart, not in the calls), and its latency is reported by
place in the episode, so a state that grows shows up; it is not compiled (refused in one
line: its state changing from call to call would make ``torch.compile`` recompile mid-episode).

Control-rate figures (:mod:`scopebench.policy.control.figures`), with ``--control-hz`` (default the
config's ``policy.control_hz``; none: no figures) and ``--n-action-steps`` (actions executed
per chunk, default ``policy.n_action_steps``, else the whole chunk): the deadline
``n_action_steps / control_hz``, the share of calls over it, p99.9 (from 1000 calls), the
jitter and the real-time-chunking delay ``d = ceil(latency * control_hz)``, with a verdict line.

Closed-loop replay (:mod:`scopebench.policy.control.replay`), with ``--closed-loop sync|async``
(needs a control rate) and ``--closed-loop-ticks`` (300): after the timed calls, an executor
ticks at the control rate on absolute deadlines ``t0 + k / control_hz`` for that many ticks
while another thread makes the next call; ``sync`` hands the next chunk over when the
current one runs out, ``async`` replaces the rest of the current one when it arrives (real-
time chunking: its first ``d`` actions are for elapsed ticks). It **measures** the ticks
without an action (stalls), the stall time, the actions discarded, and the clock's lateness
and drift, and prints beside them the **estimate** from the timed calls' latencies (the same
hand-over rules, no clock; for ``sync`` the count ``sum max(0, d - n_action_steps)``) and the
same estimate from the replay's own calls (which separates what the clock and the threads
add from a latency distribution that moved since the timed calls). The replay lasts
``ticks / control_hz`` on the real clock: said before any work, and refused over
``--closed-loop-max-sec`` (3600 s).

Each call's output is checked off its clock (:mod:`scopebench.policy.run.chunks`): a chunk of
another shape than the first call's, or ``--n-action-steps`` above the actions the policy's
chunk holds, is refused; NaN or inf actions fail the run naming the call (exit status 1). An
error of the policy's code is one line naming the policy and the call (``policy ...: sample
raised ...``). A failure after the timed calls (chunks per call, the closed loop) is reported
after them: the text and the JSON (``failure``) first, then the line on stderr.

Environment (flags win): ``BENCH_NO_COMPILE`` (0), ``BENCH_COMPILE_MODE`` (unset: the
config's ``policy.compile_mode``; upstream defaults to ``max-autotune``, which takes many
minutes to tune on a CPU, so here the config decides), ``BENCH_N_WARMUP`` (the config's,
5), ``BENCH_N_TIMED`` (50), ``BENCH_OUTPUT_DIR`` (``benchmark_results``).

Output: a summary on stdout, and ``<BENCH_OUTPUT_DIR>/<host>_<preset>_<timestamp>.json``
(and ``--json``), keys: ``tool`` ("bench-inference"), ``config``, ``settings``,
``policy`` (the preset), ``compile_mode``, ``num_params``, ``n_warmup``, ``n_timed``,
``warmup_sec`` (list), ``samples_sec`` (every timed call), ``summary`` (``mean, std, p50,
p95, p99, min, max`` in seconds), ``phases`` (phase -> ``mean_sec, median_sec,
p95_sec``), ``compile_time_sec`` and ``first_call_ratio`` (null without compilation), ``cold_start``
(``process_to_build_sec`` (process start to the build's start: imports, configuration,
data; null without ``/proc``), ``build_sec`` (policy made, moved, compile wrappers),
``first_action_sec`` (the first call, compilation included), ``process_to_first_action_sec``
(their sum), ``compile_time_sec`` (within the first action), ``warmup_sec``,
``compile_note`` (why compilation may not have happened, else null) and, with a
``compile_mode``, ``compiled_graphs`` and ``graph_breaks`` during the warm-up),
``chunks_per_call`` (null without ``--chunks-per-call``; else ``sizes``, ``rounds``,
``by_size`` (``size``, ``median_sec``, ``p95_sec``, ``chunks_per_sec``, ``over_smallest``),
``free_up_to``, ``knee`` (the first size more than 20 % slower than the smallest, null when
none is) and ``latency_sec`` (size -> every call)),
``episodes`` (null for a stateless policy; for one with ``UserPolicy.reset``:
``episode_length`` (``--episode-length``, null: one episode), ``episodes`` (begun in the
timed calls), ``reset_sec`` (each reset, untimed in the calls), ``by_position`` (from 1:
``position``, ``calls``, ``median_sec``, ``mean_sec``) and ``last_over_first``),
``peak_memory`` (``max_rss_mb``, ``max_gpu_mb``), ``host_other_cpu_pct``,
``host_steal_pct`` and ``contention`` (per timed call, as ``profile-step``'s; the summary
ends with its ``CONTENDED:`` / ``host load:`` line), ``profiler_cost`` (as ``profile-step``'s,
over the timed calls; its ``profiler cost:`` line follows), ``environment`` (host, device, CUDA
driver and runtime, cuDNN, Python, torch, accelerate, scopebench, threads, load),
``control`` (null without a control rate; else ``control_hz, n_action_steps, calls,
deadline_sec, missed, missed_share, p999_sec`` (null under 1000 calls, ``p999_note`` says
why), ``std_sec, p99_minus_p50_sec, delay_steps`` (d -> calls), ``worst_delay_steps,
keeps_up, verdict``), ``control_figure`` (the PNG of the latencies' histogram and CDF with
the deadline, ``<host>_<preset>_<timestamp>_control.png`` beside the JSON; null without a
control rate), ``closed_loop`` (null without ``--closed-loop``; else ``mode``, ``ticks``,
``expected_sec`` (``ticks / control_hz``), ``measured``, ``estimate`` (from the timed calls'
latencies) and ``estimate_replay_calls`` (from the replay's own calls, in order) (each ``mode, control_hz, n_action_steps, ticks, chunks,
stalls, stall_share, stall_sec, discarded, skipped, stale, calls, max_lateness_sec,
mean_lateness_sec, drift_sec``; the three clock figures null in the estimates),
``latencies_sec`` (the replay's calls) and ``lines`` (the three text lines)), ``failure``
(null; else the line of what failed after the timed calls).

Exit status: 0; 2 with one line for a refused input or an error of the policy's code; 1 for
non-finite actions.
"""

from __future__ import annotations

import argparse

from scopebench.commands._common import finish, refuses

HELP = "latency of one sample_actions call at batch 1 (mean / p50 / p95 / p99, compile)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from scopebench.commands._policy_options import add_config_arguments, add_control_arguments, positive_ints

    add_config_arguments(parser)
    add_control_arguments(parser)
    parser.add_argument("--no-compile", action="store_true", default=None, help="BENCH_NO_COMPILE")
    parser.add_argument("--compile-mode", default=None, help="BENCH_COMPILE_MODE")
    parser.add_argument("--n-warmup", type=int, default=None, help="BENCH_N_WARMUP")
    parser.add_argument("--n-timed", type=int, default=None, help="BENCH_N_TIMED (50)")
    parser.add_argument("--output-dir", default=None, help="BENCH_OUTPUT_DIR (benchmark_results)")
    parser.add_argument(
        "--chunks-per-call",
        type=positive_ints(1, "1,2,4,8"),
        default=None,
        metavar="B,...",
        help="also time calls sampling B chunks each (best-of-N), --n-timed interleaved rounds: latency, "
        "throughput and where it stops being free",
    )
    parser.add_argument(
        "--episode-length",
        type=int,
        default=None,
        help="a stateful policy's calls per episode, reset between them (default: one episode)",
    )
    parser.add_argument(
        "--closed-loop", choices=("sync", "async"), default=None,
        help="after the timed calls, replay the control loop with this hand-over (needs a control rate)",
    )  # fmt: skip
    parser.add_argument(
        "--closed-loop-ticks", type=int, default=300, metavar="N", help="control ticks of the replay (300)"
    )
    parser.add_argument(
        "--closed-loop-max-sec", type=float, default=None, metavar="S",
        help="refuse a replay longer than this, ticks / control rate (3600: an hour)",
    )  # fmt: skip


@refuses("bench-inference")
def run(args: argparse.Namespace) -> int:
    import os

    from scopebench.policy.control.figures import FLAGS, check_config_control, check_control
    from scopebench.policy.control.replay import MAX_REPLAY_SEC, check_duration, duration_text
    from scopebench.policy.run.chunks import NonFiniteActionsError
    from scopebench.policy.tools import check_json_path, env_bool, env_int, load_config
    from scopebench.profiler.config import check_writable_dir
    from scopebench.validate import integer, number, optional

    check_control(args.control_hz, args.n_action_steps, keys=FLAGS)  # as typed, before the config
    ticks = integer("--closed-loop-ticks", args.closed_loop_ticks, low=1)
    max_sec = MAX_REPLAY_SEC if args.closed_loop_max_sec is None else args.closed_loop_max_sec
    max_sec = number("--closed-loop-max-sec", max_sec, low=0, low_open=True)
    env_warmup = env_int("BENCH_N_WARMUP", -1, low=0)
    env = {
        "policy.compile_mode": (
            "none" if env_bool("BENCH_NO_COMPILE", False) else os.environ.get("BENCH_COMPILE_MODE") or None
        ),
        "policy.n_warmup": None if env_warmup < 0 else env_warmup,
    }
    flags = {
        "policy.compile_mode": "none" if args.no_compile else args.compile_mode or None,
        "policy.n_warmup": args.n_warmup,
        "policy.control_hz": args.control_hz,
        "policy.n_action_steps": args.n_action_steps,
    }
    timed = integer("--n-timed", args.n_timed, low=1) if args.n_timed is not None else env_int("BENCH_N_TIMED", 50)
    episode_length = optional(integer, "--episode-length", args.episode_length, low=1)
    config = load_config(args, env=env, flags=flags)
    keys = check_config_control(config, args.control_hz, args.n_action_steps)
    loop = None
    if args.closed_loop is not None:
        hz = config.inference.control_hz  # validated: the flag's or the config's
        if hz is None:
            raise ValueError("--closed-loop needs a control rate: --control-hz or policy.control_hz, got none")
        bounds = ("--closed-loop-ticks", keys["control_hz"], "--closed-loop-max-sec")
        loop = (args.closed_loop, ticks, check_duration(ticks, hz, max_sec, keys=bounds))
    out_dir = args.output_dir or os.environ.get("BENCH_OUTPUT_DIR") or "benchmark_results"
    check_writable_dir("--output-dir" if args.output_dir else "BENCH_OUTPUT_DIR", out_dir)
    check_json_path("--json", args.json)
    if loop is not None:  # said before any work: a replay waits on the real clock, whatever the machine
        print(
            f"closed loop: {loop[0]}, {ticks} ticks at {hz:g} Hz: about {duration_text(loop[2])} after the "
            f"{timed} timed calls (at most {duration_text(max_sec)}: --closed-loop-max-sec)",
            flush=True,
        )
    keys["chunks_per_call"] = "--chunks-per-call"
    try:
        return _bench(config, timed, out_dir, args.json, episode_length, args.chunks_per_call, loop, keys)
    except NonFiniteActionsError as err:
        return failed("bench-inference", err)


def failed(command: str, err: BaseException) -> int:
    """A run that failed, in one line on stderr (``scopebench <command>: <why>``): its exit
    status, 1 (a refused input, a ``ValueError``: 2, as :func:`~scopebench.commands._common.refuses`)."""
    import sys

    from scopebench.commands._common import REFUSED

    print(f"scopebench {command}: {err}", file=sys.stderr, flush=True)
    return REFUSED if isinstance(err, ValueError) else 1


def _closed_loop(run, calls: list[float], mode: str, ticks: int, expected_sec: float) -> dict:
    """The replay of ``run``'s calls at the control rate, measured and as estimated from the
    timed calls' latencies (:mod:`scopebench.policy.control.replay`); each call's output checked off
    its clock (:attr:`~scopebench.policy.run.inference.InferenceRun.check`)."""
    import itertools

    from scopebench.policy.control.replay import predict, replay

    s = run.settings
    rate = run.control_rate()  # validated once, for the replay and both estimates
    count = itertools.count(1)

    def infer():  # one call; the replay takes its latency, then checks its chunk
        run.timed_call(call=None)
        return run.actions

    def check(chunk) -> None:
        run.check(chunk, call=f"closed-loop call {next(count)}", num_steps=s.num_steps)

    measured = replay(infer, mode, rate, ticks, check=check)
    estimate = predict(calls, mode, rate, ticks)
    # the same rules over the replay's own calls: what the clock and the threads add, apart
    # from a latency distribution that moved since the timed calls (warm-up, load)
    own = predict(measured.latencies_sec, mode, rate, ticks)
    return {
        "mode": mode,
        "ticks": ticks,
        "expected_sec": expected_sec,
        "measured": measured.as_dict(),
        "estimate": estimate.as_dict(),
        "estimate_replay_calls": own.as_dict(),
        "latencies_sec": list(measured.latencies_sec),
        "lines": [
            f"closed loop (measured): {measured.line()}",
            f"closed loop (from the timed calls' latencies): {estimate.line()}",
            f"closed loop (from the replay's own latencies): {own.line()}",
        ],
    }


def _bench(
    config,
    n_timed: int,
    out_dir: str,
    json_path: str | None,
    episode_length: int | None = None,
    chunks_per_call: list[int] | None = None,
    loop: tuple[str, int, float] | None = None,
    keys: dict[str, str] | None = None,
) -> int:
    import socket
    import time
    from pathlib import Path

    from scopebench.policy.phases import INFERENCE_PHASES
    from scopebench.policy.run.chunks import NonFiniteActionsError
    from scopebench.policy.run.inference import InferenceRun
    from scopebench.policy.tools import (
        StepCounter,
        data_root,
        environment_info,
        progress_bar,
        settings_dict,
        summary_sec,
        write_json,
    )
    from scopebench.profiler import ProfilerConfig
    from scopebench.report.contention import measured_steps
    from scopebench.report.cost import measured_cost
    from scopebench.stats import summarize

    s = config.inference
    root = data_root(config)
    per_call: list[dict] = []
    with InferenceRun(
        s,
        dataset_root=root,
        chunk_size=config.dataset.chunk_size,
        profiler=ProfilerConfig(mode="custom", active=n_timed),
        keep_rows=True,
        tool="bench-inference",
        episode_length=episode_length,
        chunks_per_call=chunks_per_call,
        keys=keys,
    ) as run:
        with progress_bar(n_timed, "bench-inference") as bar:
            run.loop(StepCounter(n_timed, lambda: per_call.append(run.metrics()), bar))
        rows = list(run.profiler.rows)
        num_params = sum(p.numel() for p in run.model.parameters())
        warm = next(iter(run.warmup_sec.values()), [])
        compile_info = run.compile_metrics()
        cold_start = run.cold_start_report()
        calls = [row["step_time_sec"] for row in rows]
        control = run.control(calls)
        episodes = run.episode_report(calls)
        chunks = closed_loop = failure = None
        try:
            chunks = None if chunks_per_call is None else run.chunks_per_call(chunks_per_call, n_timed)
            closed_loop = _closed_loop(run, calls, *loop) if loop is not None else None
        except (ValueError, NonFiniteActionsError) as err:  # the timed calls are reported first, then this
            failure = err
    stats = summarize(calls)
    report = {
        "tool": "bench-inference",
        "config": config.source,
        "settings": settings_dict(s),
        "policy": s.preset if s.policy == "pi05" else s.policy,
        "compile_mode": s.compile_mode,
        "num_params": num_params,
        "n_warmup": s.n_warmup,
        "n_timed": len(calls),
        "warmup_sec": warm,
        "samples_sec": calls,
        "summary": {
            "mean": stats.mean,
            "std": stats.std,
            "p50": stats.median,
            "p95": stats.p95,
            "p99": stats.p99,
            "min": stats.min,
            "max": stats.max,
        },
        "phases": {  # a policy without prefill has no prefill phase
            p: summary_sec([row[f"{p}_time_sec"] for row in rows])
            for p in INFERENCE_PHASES
            if f"{p}_time_sec" in rows[0]
        },
        "compile_time_sec": compile_info.get("compile_time_sec"),
        "first_call_ratio": compile_info.get("first_call_ratio"),
        "cold_start": cold_start,
        "episodes": episodes,
        "chunks_per_call": chunks,
        "peak_memory": {
            "max_rss_mb": max(row.get("max_rss_mb", 0.0) for row in rows),
            "max_gpu_mb": max(row.get("max_gpu_mb", 0.0) for row in rows),
        },
        **measured_steps(rows),
        **measured_cost(rows),
        "control": None if control is None else control.as_dict(),
        "closed_loop": closed_loop,
        "failure": None if failure is None else str(failure),
        "environment": environment_info(run.device),
    }
    stamp = time.strftime("%Y%m%d-%H%M%S") + f"-{time.time_ns() % 1_000_000_000:09d}"
    label = s.preset if s.policy == "pi05" else s.policy.rpartition(":")[2]
    path = Path(out_dir) / f"{socket.gethostname()}_{label}_{stamp}.json"
    report["control_figure"] = None
    if control is not None:  # latency histogram and CDF against the deadline, next to the JSON
        from scopebench.report.control_figure import draw_control_figure

        figure = path.with_name(f"{path.stem}_control.png")
        report["control_figure"] = str(draw_control_figure(calls, report["control"], figure))
    if json_path:
        write_json(json_path, report)
    # the timestamped file in the output folder is the one named (--json is a copy of it)
    status = finish(format_report(report), report, str(path))
    return status if failure is None else failed("bench-inference", failure)


def format_report(report: dict) -> str:
    from scopebench.policy.control.figures import control_lines
    from scopebench.policy.tools import policy_label

    s, m = report["settings"], report["summary"]
    lines = [
        f"bench-inference: {policy_label(s)} compile_mode={report['compile_mode']} batch=1 "
        f"num_steps={s['num_steps']} prompt_words={s['prompt_words']} precision={s['precision']} "
        f"params={report['num_params'] / 1e6:.2f}M",
        "warm-up calls (ms): " + " ".join(f"{t * 1e3:.1f}" for t in report["warmup_sec"]),
        f"{report['n_timed']} timed calls (ms): mean={m['mean'] * 1e3:.2f} std={m['std'] * 1e3:.2f} "
        f"p50={m['p50'] * 1e3:.2f} p95={m['p95'] * 1e3:.2f} p99={m['p99'] * 1e3:.2f} "
        f"min={m['min'] * 1e3:.2f} max={m['max'] * 1e3:.2f}",
        "phases (median ms): " + ", ".join(f"{p} {v['median_sec'] * 1e3:.2f}" for p, v in report["phases"].items()),
    ]
    if report["compile_time_sec"] is not None:
        lines.append(
            f"compile: {report['compile_time_sec']:.2f} s in the first call "
            f"(first / steady call = {report['first_call_ratio']:.1f}x)"
        )
    lines += cold_start_lines(report["cold_start"])
    lines += episode_lines(report.get("episodes"))
    lines += chunks_lines(report.get("chunks_per_call"))
    mem = report["peak_memory"]
    lines.append(f"peak memory: rss {mem['max_rss_mb']:.0f} MB, gpu {mem['max_gpu_mb']:.0f} MB")
    if report["contention"] is not None:
        lines.append(report["contention"]["line"])
    if report["profiler_cost"] is not None:
        lines.append(report["profiler_cost"]["line"])
    lines += control_lines(report.get("control"))
    if report.get("control_figure"):
        lines.append(f"control figure: {report['control_figure']}")
    if report.get("closed_loop"):
        lines += report["closed_loop"]["lines"]
    return "\n".join(lines)


def cold_start_lines(cold: dict) -> list[str]:
    """``cold start: ...`` (process start -> build -> first action), and the compile note when
    compilation may not have happened."""

    def sec(value: float | None) -> str:
        return "?" if value is None else f"{value:.2f} s"

    compiled = ""
    if "compiled_graphs" in cold:
        compiled = (
            f" (compile {sec(cold['compile_time_sec'])} of it, {cold['compiled_graphs']} graph(s), "
            f"{cold['graph_breaks']} graph break(s))"
        )
    lines = [
        f"cold start: process start -> build {sec(cold['process_to_build_sec'])}, build {sec(cold['build_sec'])}, "
        f"first action {sec(cold['first_action_sec'])}{compiled}: "
        f"{sec(cold['process_to_first_action_sec'])} from process start to the first action"
    ]
    if cold.get("compile_note"):
        lines.append(f"WARNING: {cold['compile_note']}")
    return lines


#: Places in the episode the text shows at most (evenly spread, the first and the last included).
SHOWN_POSITIONS = 10


def episode_lines(episodes: dict | None) -> list[str]:
    """A stateful policy's median latency by place in the episode (nothing for a stateless one)."""
    if episodes is None:
        return []
    from scopebench.stats import median

    rows = episodes["by_position"]
    if len(rows) > SHOWN_POSITIONS:
        step = (len(rows) - 1) / (SHOWN_POSITIONS - 1)
        rows = [rows[round(i * step)] for i in range(SHOWN_POSITIONS)]
    length = episodes["episode_length"]
    head = (
        f"stateful policy: {'one episode' if length is None else f'episodes of {length} calls'} "
        f"({episodes['episodes']} begun in the timed calls, reset median {median(episodes['reset_sec']) * 1e3:.2f} ms)"
    )
    ratio = episodes["last_over_first"]
    by = ", ".join(f"{r['position']}: {r['median_sec'] * 1e3:.2f}" for r in rows)
    growth = "" if ratio is None else f" (last / first = {ratio:.2f}x)"
    return [head, f"median latency by place in the episode (ms): {by}{growth}"]


def chunks_lines(chunks: dict | None) -> list[str]:
    """Latency and throughput by chunks per call, and where sampling more stops being free."""
    if chunks is None:
        return []
    from scopebench.policy.run.inference import FREE_PCT

    rows = ", ".join(
        f"{r['size']}: {r['median_sec'] * 1e3:.2f} ms ({r['chunks_per_sec']:.1f} chunks/s, {r['over_smallest']:.2f}x)"
        for r in chunks["by_size"]
    )
    knee = chunks["knee"]
    end = (
        f"every size within {FREE_PCT:g}% of {chunks['sizes'][0]}"
        if knee is None
        else f"free up to {chunks['free_up_to']}, not at {knee} (over {FREE_PCT:g}% slower than {chunks['sizes'][0]})"
    )
    return [f"chunks per call (median of {chunks['rounds']} interleaved rounds): {rows}; {end}"]
