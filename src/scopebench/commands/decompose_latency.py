"""Where a ``sample_actions`` call spends its time: ``L(N) = F + N * s``.

What it measures: one call at batch 1 (the ``Pi05Inference`` run object) for each
``num_steps`` N of ``--num-steps`` (default 1,2,5,10), ``--repeats`` times each in
interleaved rounds (one call per N per round, so background load hits every N alike),
after ``n_warmup`` calls per N (compilation happens per N). Fits ``L(N) = F + N * s`` by
least squares to the median latency of each N: ``F`` is the fixed cost (host
preprocessing, vision tower and prefix prefill, postprocessing), ``s`` one action-expert
step over the cached prefix. Prints F, s, R² (of the fit to the medians; the R² over
every call is given too) and the share of the call spent in the expert loop at the
largest N (``N s / L(N)``, next to the measured ``denoise`` region's share). Why: it says
whether compilation or a smaller expert would pay (the expert loop) or the prefill does.

The fit applies only when the latency grows with N
(:func:`scopebench.policy.run.inference.fit_verdict`): the fitted ``s`` is above 0 and the
calls grow with N within the interleaved rounds by Page's trend test (each round's calls
ranked; ``z >= 3.719``, one-sided p < 1e-4). Ranks within rounds make the rule hold for any
noise: latencies that do not grow pass it less than once in 10^4 runs, however skewed or
bursty the timings (a test on the medians' spread is fooled by skewed ones). A slope that is
negative or within the noise prints ``the fit does not apply: <why>`` instead of a share (a
policy whose call ignores N gave ``s = -0.064 ms/step``, ``R^2 = 1.0000`` and an expert loop
of -632 % of the call). Two values of N need 14 rounds or more (``--repeats``), four need 5.

How to run::

    scopebench decompose-latency --config configs/policy/small.yml --num-steps 1,2,5,10
    scopebench decompose-latency --config configs/policy/tiny.yml --policy.compile_mode=default
    scopebench decompose-latency --config configs/policy/tiny.yml --control-hz 30 --n-action-steps 4

With ``--control-hz`` / ``--n-action-steps`` (as ``bench-inference``'s), one control-rate
verdict per N (:mod:`scopebench.policy.control.figures`).

Output: a table (N, median and p95 ms, fitted ms) and the fit. JSON (``--json``), keys:
``tool`` ("decompose-latency"), ``config``, ``settings``, ``num_steps`` (list),
``repeats``, ``latency_sec`` (N -> every call), ``median_sec`` (N -> median),
``denoise_sec`` (N -> median denoise region), ``fixed_sec``, ``per_step_sec``, ``r2``,
``r2_all_calls`` (the least-squares fit, whether it applies or not), ``fit_applies``,
``fit_reason`` (why not; null when it applies), ``trend_z`` and ``trend_p`` (Page's test),
``expert_share`` (at the largest N; null when the fit does not apply), ``denoise_share``
(measured), ``host_other_cpu_pct``, ``host_steal_pct`` and ``contention`` (per timed call in
the order run, as ``profile-step``'s), ``profiler_cost`` (as ``profile-step``'s, over the
timed calls), ``control`` (null without a control rate; else N -> the
control object of ``bench-inference`` over that N's calls), ``environment``. After the fit, the
``host load:`` line, or ``CONTENDED: ...: the fit's points were measured on a busy machine``,
then the ``profiler cost:`` line.

Each call's output is checked off its clock as ``bench-inference``'s (a chunk of another
shape than the first call's at that N is refused; NaN or inf actions fail the run naming the
call and its N). Exit status: 0; 2 with one line for a refused input or an error of the
policy's code; 1 for non-finite actions.
"""

from __future__ import annotations

import argparse

from scopebench.commands._common import finish, refuses

HELP = "fit sample_actions latency as F + N*s over num_steps (fixed cost vs per expert step)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from scopebench.commands._policy_options import add_config_arguments, add_control_arguments, positive_ints

    add_config_arguments(parser)
    add_control_arguments(parser)
    parser.add_argument(
        "--num-steps", type=positive_ints(2, "1,2,5,10"), default=[1, 2, 5, 10], help="comma-separated N (1,2,5,10)"
    )
    parser.add_argument("--repeats", type=int, default=20, help="timed calls per N (20)")


@refuses("decompose-latency")
def run(args: argparse.Namespace) -> int:
    from scopebench.commands.bench_inference import failed
    from scopebench.policy.control.figures import FLAGS, check_config_control, check_control
    from scopebench.policy.run.chunks import NonFiniteActionsError
    from scopebench.policy.tools import check_json_path, load_config

    if args.repeats < 1:
        raise ValueError(f"--repeats must be >= 1, got {args.repeats}")
    check_control(args.control_hz, args.n_action_steps, keys=FLAGS)  # as typed, before the config
    flags = {"policy.control_hz": args.control_hz, "policy.n_action_steps": args.n_action_steps}
    config = load_config(args, flags=flags)
    keys = check_config_control(config, args.control_hz, args.n_action_steps)
    check_json_path("--json", args.json)
    try:
        return _decompose(config, args.num_steps, args.repeats, args.json, keys)
    except NonFiniteActionsError as err:
        return failed("decompose-latency", err)


def _decompose(config, steps: list[int], repeats: int, json_path: str | None, keys: dict | None = None) -> int:
    from scopebench.policy.run.inference import InferenceRun, fit_latency, fit_verdict
    from scopebench.policy.tools import (
        StepCounter,
        data_root,
        environment_info,
        progress_bar,
        settings_dict,
    )
    from scopebench.profiler import ProfilerConfig
    from scopebench.report.contention import measured_steps
    from scopebench.report.cost import measured_cost
    from scopebench.stats import median, percentile

    total = repeats * len(steps)
    run = InferenceRun(
        config.inference,
        dataset_root=data_root(config),
        chunk_size=config.dataset.chunk_size,
        schedule=steps,  # every N is warmed up before the first timed call (compilation happens per N)
        profiler=ProfilerConfig(mode="custom", active=total),
        keep_rows=True,
        tool="decompose-latency",
        keys=keys,
    )
    with run:
        with progress_bar(total, "decompose-latency") as bar:
            run.loop(StepCounter(total, bar=bar))
        rows = list(run.profiler.rows)
        device = run.device
        control = {
            n: run.control([row["step_time_sec"] for row in rows[i :: len(steps)]], n) for i, n in enumerate(steps)
        }
    latency = {n: [] for n in steps}
    denoise = {n: [] for n in steps}
    for i, row in enumerate(rows):
        n = steps[i % len(steps)]
        latency[n].append(row["step_time_sec"])
        denoise[n].append(row["denoise_time_sec"])
    med = {n: median(v) for n, v in latency.items()}
    fit = fit_latency(steps, [med[n] for n in steps])
    every = fit_latency([n for n in steps for _ in latency[n]], [t for n in steps for t in latency[n]])
    verdict = fit_verdict(latency, fit["per_step_sec"])
    top = steps[-1]
    expert = top * fit["per_step_sec"]
    report = {
        "tool": "decompose-latency",
        "config": config.source,
        "settings": settings_dict(config.inference),
        "num_steps": steps,
        "repeats": repeats,
        "latency_sec": {str(n): v for n, v in latency.items()},
        "median_sec": {str(n): v for n, v in med.items()},
        "p95_sec": {str(n): percentile(v, 95) for n, v in latency.items()},
        "denoise_sec": {str(n): median(v) for n, v in denoise.items()},
        "fixed_sec": fit["fixed_sec"],
        "per_step_sec": fit["per_step_sec"],
        "r2": fit["r2"],
        "r2_all_calls": every["r2"],
        **verdict,
        "expert_share": expert / (fit["fixed_sec"] + expert) if verdict["fit_applies"] else None,
        "denoise_share": median(denoise[top]) / med[top],
        **measured_steps(rows),
        **measured_cost(rows),
        "control": None if control[steps[-1]] is None else {str(n): c.as_dict() for n, c in control.items()},
        "environment": environment_info(device),
    }
    return finish(format_report(report), report, json_path)


def format_report(report: dict) -> str:
    from scopebench.policy.tools import policy_label

    s = report["settings"]
    f, k = report["fixed_sec"], report["per_step_sec"]
    lines = [
        f"decompose-latency: {policy_label(s)} compile_mode={s['compile_mode']} batch=1 "
        f"{report['repeats']} calls per num_steps, interleaved",
        f"{'num_steps':>9}  {'median_ms':>9}  {'p95_ms':>8}  {'fit_ms':>8}",
    ]
    for n in report["num_steps"]:
        lines.append(
            f"{n:>9}  {report['median_sec'][str(n)] * 1e3:9.2f}  {report['p95_sec'][str(n)] * 1e3:8.2f}  "
            f"{(f + n * k) * 1e3:8.2f}"
        )
    top = report["num_steps"][-1]
    lines.append(
        f"fit: L(N) = F + N*s   F = {f * 1e3:.2f} ms   s = {k * 1e3:.3f} ms/step   "
        f"R^2 = {report['r2']:.4f} (medians), {report['r2_all_calls']:.4f} (every call)"
    )
    denoise = f"denoise region measured: {report['denoise_share'] * 100:.1f}%"
    if report["fit_applies"]:
        lines.append(
            f"at N={top}: expert loop {report['expert_share'] * 100:.1f}% of the call ({denoise}; "
            f"Page's trend z = {report['trend_z']:.1f})"
        )
    else:
        lines += [f"the fit does not apply: {report['fit_reason']}", f"at N={top}: {denoise} of the call"]
    host = report["contention"]
    if host is not None:  # said after the fit: its points are what the machine's load disturbed
        busy = ": the fit's points were measured on a busy machine" if host["contended"] else ""
        lines.append(host["line"] + busy)
    if report["profiler_cost"] is not None:
        lines.append(report["profiler_cost"]["line"])
    for n, control in (report.get("control") or {}).items():
        lines.append(f"control at N={n}: {control['verdict']}")
    return "\n".join(lines)
