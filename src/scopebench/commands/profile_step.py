"""Per-step wall-clock of the policy's training step, split into phases (upstream ``profile_step``).

What it measures: ``--warmup`` steps (20) then ``--steps`` measured steps (200) of the
training step of ``Pi05Train`` (the same :class:`scopebench.policy.run.train.PolicyTrainRun`,
on accelerate), each split into ``dataload_wait``, ``forward``, ``bwd``, ``unscale_clip``,
``optim_step``, ``zero_grad_sched``, ``sync_gather`` and the derived ``backward_step``;
per phase mean / median / p95 over the measured steps and its share of the mean step;
steps/s and global samples/s; peak memory per rank; achieved FLOP/s and MFU. Each step's
phase times are the ranks' mean (every rank counts the steps: no barrier between them, so a slow
rank's cost is in the others' waits inside the step; :func:`scopebench.profiler.reduce_across_ranks`);
the JSON keeps every rank's raw samples. Why: "why is my policy's training slow?" — read the shares (docs/tools.md, "The policy tools").

How to run::

    scopebench profile-step --config configs/policy/tiny.yml [--batch_size 12] [--steps 50]
    scopebench profile-step --config configs/policy/tiny.yml --nproc-per-node 2      # local gloo ranks
    torchrun --nproc-per-node 2 -m scopebench.cli profile-step --config configs/policy/tiny.yml
    accelerate launch --multi_gpu --num_processes 2 -m scopebench.cli profile-step --config ...   # CPU too
    scopebench profile-step --config configs/policy/tiny.yml --nproc-per-node 2 \
        --accelerate-config configs/accelerate/deepspeed_zero2.yaml                 # or --backend zero3

Environment variables of the upstream script work too (flags win): ``PROFILE_STEPS``
(200), ``PROFILE_NO_OPTIM`` (0), ``FIND_UNUSED_PARAMS`` (the config's, true by default),
``FUSED_ADAMW`` (unset: torch's default), ``PROFILE_STEP_JSON`` (path of the JSON).
Any config setting is overridable: ``--learning_rate=3e-4``, ``--policy.num_steps=5``.

Output: the upstream text layout on rank 0 (header, one line per phase, ``backward_step``,
``sync_gather``, ``total``, throughput, memory, MFU). JSON (``--json`` or
``PROFILE_STEP_JSON``), keys: ``tool`` ("profile-step"), ``config``, ``settings``,
``warmup``, ``measured``, ``world_size``, ``backend``, ``phase_contents`` (what each
phase holds under that backend), ``batch_size``, ``gradient_accumulation_steps``, ``num_workers``,
``prefetch_factor``, ``wall_clock_sec`` (the loop's iterations, warm-up included, up to the end
of the last: not the profiler's exchange after it), ``setup_time_sec``, ``phases`` (phase ->
``mean_sec, median_sec, p95_sec, share``; also ``backward_step`` and ``total``),
``throughput`` (``steps_per_sec``, ``global_samples_per_sec``), ``memory``
(``max_rss_mb``, ``max_gpu_mb``, ``per_rank``: list of ``rank, max_rss_mb, max_gpu_mb``),
``mfu`` (``mfu``, ``achieved_flops_per_sec``, ``peak_flops_per_sec``, ``peak_flops_source``),
``per_rank`` (list of ``rank``, ``step_time_sec`` stats and ``samples``: every raw
``<phase>_time_sec`` and ``step_time_sec`` of that rank), ``samples`` (phase -> the
per-step values of the table), ``host_other_cpu_pct`` and ``host_steal_pct`` (the host
sampler's other-process share and steal per measured step, null where it gave none),
``contention`` (``other_pct``, ``other_max_pct``, ``steal_pct``, ``steal_max_pct``,
``affected`` (measured steps, from 0), ``sampled``, ``contended``, ``line``; null with the
sampler off), ``profiler_cost`` (``per_step_sec``, ``share_pct``, ``inside_sec``,
``outside_sec``, ``startup_sec``, ``sampler_cpu_sec``, ``steps``, ``after_window_sec`` (the
exchange of every rank's records and metrics after the loop, once), ``line``: what the profiler
cost the measured steps, :func:`scopebench.report.cost.measured_cost`; null without
``profiler_overhead_sec``), ``environment``; the ledger (docs/profiler.md, "Why a distributed
step is slow"):
``late_rank`` (``rank``, ``delay_sec``, ``region``, ``wait_region``, ``work_excess_sec``,
``start_lag_sec``, ``cause``, ``share_pct``, ``iterations``, ``counted``, ``step_sec``,
``delay_pct``, ``line``; null when no rank is consistently late,
:func:`scopebench.report.ledger.late_rank_summary`), ``ledger`` (``per_rank``: ``rank`` and
``phases``, per phase ``time_sec``, ``work_sec``, ``wait_peer_sec``, ``transfer_sec``,
``hidden_sec``, ``pct``), ``collectives`` (``per_op``, ``per_phase``) and
``clock_align_error_sec`` (``late_rank`` null on one rank; all null with
``SCOPEBENCH_LEDGER=0``), and each rank's ``samples`` carry
``<phase>_work_sec``, ``_comm_wait_peer_sec``, ``_comm_transfer_sec``, ``_comm_hidden_sec``
(and with ``--profiler-mode torch`` ``_compute_sec`` and ``_host_overhead_sec``); ``profiler_mode``
says which backend timed the steps (``custom``, or ``torch``: phases are its regions' CPU ranges).
The text prints the ledger per rank, the collectives and ``late rank: ...`` after the phase
table. The text ends with ``line``: ``CONTENDED: ...`` when other
processes or steal took more than ``scopebench summary`` allows, else ``host load: ...``
(:func:`scopebench.report.contention.measured_steps`), then ``profiler_cost``'s ``line``:
``profiler cost: x µs / step (y% of the step): ...`` (docs/tools.md, "Profiler cost").

The losses are gathered every :data:`GATHER_EVERY` (64) steps, or every ``gather_every`` steps when
that is more, and after the last step: ``profile-step`` reads them only at the end, and a gather
every step would be a cost of the suite's inside each measured step (docs/performance.md, "What
watching costs"). The loop itself needs nothing from the other ranks between the steps (every
rank counts the steps: no stop broadcast).

A loss or loss term that is NaN or infinite (checked when the losses are gathered) does not
stop the measurement: the steps
still run and are timed, the report is printed and written, and then one line on stderr
names the first such step (counted from the first warm-up step, and its place among the
measured steps), the term and the rank; the JSON's ``nonfinite_loss`` holds it (null when
every loss was finite: ``step``, ``measured_step``, ``term``, ``value``, ``train_loss``,
``rank``, ``world_size``, ``checked_at``, ``gather_every``, ``message``), and the exit status
is 1. Why not stop: a step runs the same operations whatever values they compute with, so
its times still say where the step's time goes, and a stopped run would leave no report.

Exit status: 2 with one line for a refused input (checked before any work, the ``--json``
path included), 1 with ``the run failed:`` and the rank that died, stopped or hung, or with
the line that names a non-finite loss.
"""

from __future__ import annotations

import argparse
import sys

from scopebench.commands._common import add_nproc_per_node, finish, refuses

HELP = "per-phase time of the policy's training step (mean / median / p95, MFU)"
BAR = "=" * 53


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from scopebench.commands._policy_options import add_backend_arguments, add_config_arguments

    add_config_arguments(parser)
    parser.add_argument("--batch_size", "--batch-size", type=int, default=None, help="samples per step and rank")
    parser.add_argument("--steps", type=int, default=None, help="measured steps (PROFILE_STEPS, 200)")
    parser.add_argument("--warmup", type=int, default=20, help="unmeasured steps first (20)")
    add_nproc_per_node(parser, "ranks on this machine, spawned as local processes (default: the config's)")
    parser.add_argument("--no-optim", action="store_true", default=None, help="no optimizer (PROFILE_NO_OPTIM)")
    parser.add_argument("--find-unused-params", choices=["true", "false"], default=None, help="FIND_UNUSED_PARAMS")
    parser.add_argument("--fused-adamw", choices=["true", "false"], default=None, help="FUSED_ADAMW")
    add_backend_arguments(parser)
    parser.add_argument(
        "--profiler-mode", "--profiler_mode", dest="profiler_mode", choices=["custom", "torch"], default="custom",
        help="custom (wall clock, the default) or torch (torch.profiler per step: the ledger also splits each "
        "phase's work into compute and host overhead; tens of ms per step, outside the step's clock)",
    )  # fmt: skip


def _flag(text: str | None) -> bool | None:
    return None if text is None else text == "true"


@refuses("profile-step")
def run(args: argparse.Namespace) -> int:
    import os

    from scopebench.commands._policy_options import backend_flags
    from scopebench.distributed import RankFailure
    from scopebench.policy.tools import check_json_path, env_bool, env_int, load_config

    steps = args.steps if args.steps is not None else env_int("PROFILE_STEPS", 200)
    if steps < 1 or args.warmup < 0:
        raise ValueError(f"--steps must be >= 1 and --warmup >= 0, got {steps} and {args.warmup}")
    env = {
        "no_optim": env_bool("PROFILE_NO_OPTIM"),
        "find_unused_params": env_bool("FIND_UNUSED_PARAMS"),
        "fused_adamw": env_bool("FUSED_ADAMW"),
    }
    flags = {
        "no_optim": True if args.no_optim else None,
        "find_unused_params": _flag(args.find_unused_params),
        "fused_adamw": _flag(args.fused_adamw),
        "batch_size": args.batch_size,
        "nproc_per_node": args.nproc_per_node,
    }
    backend, file = backend_flags(args)  # the file read once, handed to the run
    config = load_config(args, env=env, flags={**flags, **backend})
    json_path = args.json or os.environ.get("PROFILE_STEP_JSON") or None
    check_json_path("--json" if args.json else "PROFILE_STEP_JSON", json_path)
    try:
        return _profile(
            config, warmup=args.warmup, steps=steps, json_path=json_path, mode=args.profiler_mode, file=file
        )
    except RankFailure as err:  # rank 0 names the rank that died, stopped or hung (as scopebench train)
        print(f"scopebench profile-step: the run failed:\n{err}", file=sys.stderr, flush=True)
        return 1


#: Steps between the loss gathers of ``profile-step`` at least (the losses are read at the end).
GATHER_EVERY = 64


def _profile(config, *, warmup: int, steps: int, json_path: str | None, mode: str = "custom", file=None) -> int:
    import dataclasses
    import time

    from scopebench.distributed import writes_reports
    from scopebench.policy.run.train import PolicyTrainRun
    from scopebench.policy.tools import StepCounter, data_root, progress_bar
    from scopebench.profiler import ProfilerConfig

    root = data_root(config)
    settings = config.train
    if settings.gather_every < GATHER_EVERY:
        settings = dataclasses.replace(settings, gather_every=GATHER_EVERY)
    run = PolicyTrainRun(
        settings,
        dataset_root=root,
        chunk_size=config.dataset.chunk_size,
        profiler=ProfilerConfig(mode=mode, warmup=warmup, active=steps),
        name="profile_step",
        keep_rows=True,
        defer_exchange=True,  # the rows are read after the loop: the profiler's exchange waits for its end
        loop_steps=warmup + steps,  # every rank counts them: no stop broadcast between the steps
        accelerate_file=file,
    )
    with run:
        main = run.rank == 0
        with progress_bar(warmup + steps, "profile-step", enabled=main) as bar:
            counter = StepCounter(warmup + steps, None, bar)
            start = time.perf_counter()
            run.loop(counter)
            # the loop's iterations, not the exchange and row gathers after its last one
            wall = (run.profiler.loop_ended_at or time.perf_counter()) - start
        if not writes_reports():
            return 0
        recorded = [_wall_times(run.metrics(row)) for row in run.profiler.reduced_rows]
        run.rank_rows = [[_wall_times(row) for row in rows] for rows in run.rank_rows]
        report = build_report(run, recorded, warmup, steps, wall)
    report["nonfinite_loss"] = _nonfinite(run.work.nonfinite, warmup)
    finish(format_report(report), {**report, "config": config.source}, json_path)
    if report["nonfinite_loss"] is None:
        return 0
    print(f"scopebench profile-step: {report['nonfinite_loss']['message']}", file=sys.stderr, flush=True)
    return 1


def _wall_times(row: dict) -> dict:
    """``row`` with each phase's wall time as ``<phase>_time_sec``: the torch backend names it
    ``<phase>_cpu_sec`` (its region's CPU range), the custom one ``<phase>_time_sec``."""
    extra = {
        k[: -len("_cpu_sec")] + "_time_sec": v
        for k, v in row.items()
        if k.endswith("_cpu_sec") and k[: -len("_cpu_sec")] + "_time_sec" not in row
    }
    return {**row, **extra} if extra else row


def _nonfinite(found, warmup: int) -> dict | None:
    """The JSON's ``nonfinite_loss``: the record of the first non-finite loss (None when every
    loss was finite), with ``measured_step`` (its place among the measured steps, None in the
    warm-up) and the ``message`` printed on stderr."""
    if found is None:
        return None
    record = found.record(found_at=False)  # nothing stops on it: when it was checked says nothing
    measured = found.step - warmup if found.step > warmup else None
    where = ""
    if warmup:
        what = f"measured step {measured}" if measured is not None else "a warm-up step"
        where = f"; {what} (steps count from the first of the {warmup} warm-up steps)"
    message = f"{record['message']}{where}: the times from that step on are of training on non-finite values"
    return {**record, "measured_step": measured, "message": message}


def build_report(run, per_step: list[dict], warmup: int, steps: int, wall: float) -> dict:
    """The JSON summary (see the module docstring) from rank 0's per-step metrics."""
    from scopebench.policy.phases import TRAIN_PHASES
    from scopebench.policy.tools import environment_info, settings_dict, summary_sec
    from scopebench.report.contention import measured_steps
    from scopebench.report.cost import measured_cost

    step_times = [m["step_time_sec"] for m in per_step]
    total = summary_sec(step_times)
    samples = {p: [m[f"{p}_time_sec"] for m in per_step] for p in TRAIN_PHASES}
    samples["backward_step"] = [m["backward_step_time_sec"] for m in per_step]
    phases = {name: {**summary_sec(v), "share": sum(v) / sum(step_times)} for name, v in samples.items()}
    phases["total"] = {**total, "share": 1.0}
    s = run.settings
    steps_per_sec = 1.0 / total["mean_sec"]
    last = per_step[-1]
    per_rank = []
    for r, rows in enumerate(run.rank_rows):
        own = [row["step_time_sec"] for row in rows]
        keys = [f"{p}_time_sec" for p in TRAIN_PHASES]
        keys += [f"{p}_{part}_sec" for p in TRAIN_PHASES for part in LEDGER_PARTS if f"{p}_{part}_sec" in rows[0]]
        raw = {key: [row.get(key) for row in rows] for key in keys}
        per_rank.append({"rank": r, "step_time_sec": summary_sec(own), "samples": {**raw, "step_time_sec": own}})
    achieved = [m["achieved_flops_per_sec"] for m in per_step]
    mean_achieved = sum(achieved) / len(achieved)
    peak = last.get("peak_flops_per_sec")
    return {
        "tool": "profile-step",
        "profiler_mode": run.profiler_config.mode,
        "settings": settings_dict(s),
        "warmup": warmup,
        "measured": len(per_step),
        "world_size": run.world_size,
        "backend": s.backend,
        "phase_contents": run.backend.describe_phases(),
        "batch_size": s.batch_size,
        "gradient_accumulation_steps": s.gradient_accumulation_steps,
        "num_workers": s.num_workers,
        "prefetch_factor": s.prefetch_factor,
        "wall_clock_sec": wall,
        "setup_time_sec": run.setup_time_sec,
        "phases": phases,
        "throughput": {
            "steps_per_sec": steps_per_sec,
            "global_samples_per_sec": steps_per_sec * run.global_batch_size,
        },
        "memory": {
            "max_rss_mb": last.get("max_rss_mb"),
            "max_gpu_mb": last.get("max_gpu_mb"),
            "per_rank": [
                {
                    "rank": r,
                    "max_rss_mb": last.get(f"max_rss_mb_rank{r}"),
                    "max_gpu_mb": last.get(f"max_gpu_mb_rank{r}"),
                }
                for r in range(run.world_size)
            ],
        },
        "mfu": {
            "mfu": None if not peak else mean_achieved / peak,
            "achieved_flops_per_sec": mean_achieved,
            "peak_flops_per_sec": peak,
            "peak_flops_source": last.get("peak_flops_source"),
        },
        "per_rank": per_rank,
        **ledger_report(run.rank_rows, per_step),
        "samples": {**samples, "total": step_times},
        **measured_steps(per_step),
        **measured_cost(per_step, after_window_sec=run.profiler.after_window_sec),
        "environment": environment_info(run.device),
    }


#: The ledger's columns per phase that the JSON's per-rank samples carry (``<phase>_<part>_sec``).
LEDGER_PARTS = (
    "work",
    "comm_wait_peer",
    "comm_transfer",
    "comm_hidden",
    "compute",
    "hooks_compute",
    "host_overhead",
    "host_hooks",
)


def ledger_report(rank_rows: list[list[dict]], per_step: list[dict]) -> dict:
    """The JSON's ``late_rank``, ``ledger``, ``collectives`` and ``clock_align_error_sec``
    (:mod:`scopebench.report.ledger`; null without the ledger: turned off, or on CUDA)."""
    from scopebench.policy.phases import TRAIN_PHASES
    from scopebench.report.ledger import collective_table, late_rank_summary, ledger_table, phase_collectives

    if not rank_rows or not any("late_rank_delay_sec" in row or "bwd_work_sec" in row for row in rank_rows[0]):
        return {"late_rank": None, "ledger": None, "collectives": None, "clock_align_error_sec": None}
    late = late_rank_summary(per_step)
    own = rank_rows[0]  # rank 0's own rows: the bytes every rank moves
    per_phase = phase_collectives(own, TRAIN_PHASES)
    return {
        "late_rank": None if late is None else late.as_dict(),
        "ledger": {
            "per_rank": [
                {"rank": r, "phases": ledger_table(rows, TRAIN_PHASES).as_dict()} for r, rows in enumerate(rank_rows)
            ]
        },
        "collectives": {"per_op": collective_table(own).as_dict(), "per_phase": per_phase},
        "clock_align_error_sec": max(row.get("clock_align_error_sec", 0.0) for row in own),
    }


def format_ledger(report: dict) -> list[str]:
    """The text's ledger: per rank the phases that communicate, the collectives, the late rank."""
    from scopebench.report.ledger import LATE_RANK_CONSISTENT_PCT, LATE_RANK_MIN_PCT

    if report["ledger"] is None:
        return []
    lines = []
    for rank in report["ledger"]["per_rank"]:
        for phase, row in rank["phases"].items():
            if row["wait_peer_sec"] or row["transfer_sec"] or row["hidden_sec"]:
                cells = [f"{name} {v * 1e3:.1f} ms ({row['pct'][name]:.0f}%)" for name, v in _parts(row)]
                lines.append(f"  rank {rank['rank']} {phase:<15} {row['time_sec'] * 1e3:8.1f} ms: " + ", ".join(cells))
    if lines:
        lines[:0] = [
            "",
            "where each rank's phase time went (mean per step; hidden: communication overlapped with work):",
        ]
    per_op = report["collectives"]["per_op"]
    if per_op:
        lines.append("collectives (rank 0, per step, medians):")
        for op, row in per_op.items():
            cells = [f"{row['bytes'] / 1e3:.1f} kB in {row['calls']:g} calls" if row["bytes"] is not None else ""]
            if row["exposed_pct"] is not None:
                cells.append(f"{row['exposed_pct']:.0f}% of {row['sec'] * 1e3:.1f} ms in flight exposed")
            if row["busbw_gb_per_sec"] is not None:
                cells.append(f"busbw {row['busbw_gb_per_sec']:.2f} GB/s")
            lines.append(f"  {op:<15} " + ", ".join(c for c in cells if c))
    late = report["late_rank"]
    if late is not None:
        lines.append(late["line"])
    elif len(report["ledger"]["per_rank"]) > 1:  # one rank waits for no one
        lines.append(
            f"late rank: none (no rank kept the others waiting in {LATE_RANK_CONSISTENT_PCT:g}% of the steps "
            f"for {LATE_RANK_MIN_PCT:g}% of the step or more)"
        )
    return lines


def _parts(row: dict) -> list[tuple[str, float]]:
    names = {
        "work_sec": "work",
        "compute_sec": "compute",
        "hooks_compute_sec": "of it in framework hooks",
        "host_overhead_sec": "host overhead",
        "host_hooks_sec": "of it framework hooks",
        "wait_peer_sec": "waiting for peers",
        "transfer_sec": "transfer",
        "hidden_sec": "hidden",
    }
    return [(name, row[key]) for key, name in names.items() if row.get(key) is not None]


def format_report(report: dict) -> str:
    """The upstream ``profile_step`` text layout."""
    from scopebench.policy.phases import TRAIN_PHASES
    from scopebench.policy.tools import format_ms_stats

    lines = [
        f"{'=' * 11} profile_step results (rank 0; each step: slowest rank) {'=' * 11}",
        f"warmup={report['warmup']} measured={report['measured']} ranks={report['world_size']}",
        f"batch_size={report['batch_size']} num_workers={report['num_workers']} "
        f"prefetch_factor={report['prefetch_factor']} gradient_accumulation_steps={report['gradient_accumulation_steps']}",
        f"wall-clock over full loop: {report['wall_clock_sec']:.2f}s (set-up before it: {report['setup_time_sec']:.2f}s)",
        # in place of the upstream blank line: what the phases below hold under this backend
        f"backend={report['backend']}: {report['phase_contents']}",
        f"{'phase':<17}{'stats':<64}share",
        "-" * 90,
    ]
    order = [p for p in TRAIN_PHASES if p != "sync_gather"] + ["backward_step", "sync_gather"]
    for name in order:
        stats = report["phases"][name]
        lines.append(f"{name:<17}{format_ms_stats(stats):<64}{stats['share'] * 100:5.1f}%")
    lines.append(f"{'total':<17}{format_ms_stats(report['phases']['total']):<64}<-- total")
    lines += format_ledger(report)
    t = report["throughput"]
    lines += ["", f"throughput: {t['steps_per_sec']:.2f} steps/s, {t['global_samples_per_sec']:.1f} global samples/s"]
    mem = report["memory"]
    ranks = ", ".join(f"rank{r['rank']}={r['max_rss_mb']:.0f}" for r in mem["per_rank"] if r["max_rss_mb"] is not None)
    lines.append(f"peak memory: max_rss_mb={mem['max_rss_mb']:.0f} ({ranks}) max_gpu_mb={mem['max_gpu_mb']:.0f}")
    m = report["mfu"]
    if m["mfu"] is None:
        lines.append(
            f"mfu: unknown (no peak FLOP/s for this device; set --peak_tflops=...), "
            f"achieved {m['achieved_flops_per_sec'] / 1e9:.2f} GFLOP/s"
        )
    else:
        lines.append(
            f"mfu: {m['mfu']:.3f} (achieved {m['achieved_flops_per_sec'] / 1e9:.2f} GFLOP/s of "
            f"{m['peak_flops_per_sec'] / 1e9:.2f} GFLOP/s peak, {m['peak_flops_source']})"
        )
    if report["contention"] is not None:
        lines.append(report["contention"]["line"])
    if report["profiler_cost"] is not None:
        lines.append(report["profiler_cost"]["line"])
    lines.append(BAR)
    return "\n".join(lines)
