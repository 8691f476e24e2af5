"""The dataloader's throughput ceiling: batches with no model and no collective (upstream ``profile_dataloader``).

What it measures: ``--warmup`` batches (20), then ``--batches`` measured batches (300) of
exactly the dataloader of ``Pi05Train`` (the same sampler, workers, prefetch, and the
host preprocessing and copy to the device of its ``dataload_wait`` phase), through the
run object of ``Pi05Dataloader``: per rank, ``fetch`` (waiting for the next batch),
``decode`` (with ``num_workers=0``: the camera frames' decoding, MP4 or PNG, taken out of
``fetch``) and ``h2d`` (preprocessing + copy) mean / median / p95; the decoding time per
camera frame (rank 0, wherever it ran: in the workers too); per-rank batches/s (min / mean / max
over ranks) and the cluster's samples/s. Why: if the cluster's samples/s here is not well
above ``profile-step``'s, the input pipeline is the bottleneck. A bimodal fetch (median
near 0, p95 large) means the prefetch buffer is alternately full and empty.

How to run (under the launcher training uses, so the host sees the same pressure)::

    scopebench profile-dataloader --config configs/policy/tiny.yml [--batches 300]
    scopebench profile-dataloader --config configs/policy/small.yml --nproc-per-node 2 --num_workers=2
    torchrun --nproc-per-node 2 -m scopebench.cli profile-dataloader --config configs/policy/tiny.yml

Environment: ``PROFILE_BATCHES`` (300; ``--batches`` wins).

Output: one line per rank, then the summary block. JSON (``--json``), keys: ``tool``
("profile-dataloader"), ``config``, ``settings``, ``warmup``, ``measured``,
``world_size``, ``batch_size``, ``num_workers``, ``prefetch_factor``, ``wall_clock_sec``,
``per_rank`` (list of ``rank``, ``fetch``, ``decode`` (0 workers only) and ``h2d``
(``mean_sec, median_sec, p95_sec``), ``batches_per_sec``, ``samples``: raw
``fetch_time_sec`` / ``decode_time_sec`` / ``h2d_time_sec``), ``batches_per_sec``
(``min, mean, max`` over ranks), ``cluster_samples_per_sec``, ``decoder`` (``pyav`` for MP4,
``pil`` for PNG), ``decode_per_frame_sec`` (rank 0's mean, all batches),
``host_other_cpu_pct``, ``host_steal_pct`` and ``contention`` (per measured batch, the busiest
rank's, as ``profile-step``'s; the summary block ends with its ``CONTENDED:`` / ``host load:``
line), ``profiler_cost`` (as ``profile-step``'s, over the measured batches; its ``profiler
cost:`` line follows), ``environment``.
"""

from __future__ import annotations

import argparse

from scopebench.commands._common import add_nproc_per_node, finish, refuses

HELP = "dataloader throughput ceiling per rank (no model, no collective)"
#: The phases a rank's line shows, in order (``decode`` only when it ran in the loading process).
PHASES = ("fetch", "decode", "h2d")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from scopebench.commands._policy_options import add_config_arguments

    add_config_arguments(parser)
    parser.add_argument("--batches", type=int, default=None, help="measured batches (PROFILE_BATCHES, 300)")
    parser.add_argument("--warmup", type=int, default=20, help="unmeasured batches first (20)")
    add_nproc_per_node(parser, "ranks on this machine, spawned as local processes (default: the config's)")


@refuses("profile-dataloader")
def run(args: argparse.Namespace) -> int:
    from scopebench.policy.tools import check_json_path, env_int, load_config

    batches = args.batches if args.batches is not None else env_int("PROFILE_BATCHES", 300)
    if batches < 1 or args.warmup < 0:
        raise ValueError(f"--batches must be >= 1 and --warmup >= 0, got {batches} and {args.warmup}")
    config = load_config(args, flags={"nproc_per_node": args.nproc_per_node})
    check_json_path("--json", args.json)
    return _profile(config, args.warmup, batches, args.json)


def _profile(config, warmup: int, batches: int, json_path: str | None) -> int:
    import time

    from scopebench.distributed import writes_reports
    from scopebench.policy.run.train import PolicyTrainRun
    from scopebench.policy.tools import (
        StepCounter,
        data_root,
        environment_info,
        progress_bar,
        settings_dict,
        summary_sec,
    )
    from scopebench.profiler import ProfilerConfig
    from scopebench.report.contention import measured_steps
    from scopebench.report.cost import measured_cost

    root = data_root(config)
    run = PolicyTrainRun(
        config.train,
        dataset_root=root,
        chunk_size=config.dataset.chunk_size,
        task="dataloader",
        profiler=ProfilerConfig(mode="custom", warmup=warmup, active=batches),
        name="profile_dataloader",
        keep_rows=True,
    )
    per_step: list[dict] = []  # each batch's metrics, the slowest rank's (the host sampler's included)
    with run:
        with progress_bar(warmup + batches, "profile-dataloader", enabled=run.rank == 0) as bar:
            start = time.perf_counter()
            run.loop(StepCounter(warmup + batches, lambda: per_step.append(run.metrics()), bar))
            wall = time.perf_counter() - start
        if not writes_reports():
            return 0
    s = config.train
    per_rank = []
    for r, rows in enumerate(run.rank_rows):
        own = [row["step_time_sec"] for row in rows]
        phases = {p: [row[f"{p}_time_sec"] for row in rows if f"{p}_time_sec" in row] for p in PHASES}
        phases = {p: values for p, values in phases.items() if values}  # decode: with 0 workers only
        per_rank.append(
            {
                "rank": r,
                **{p: summary_sec(values) for p, values in phases.items()},
                "batches_per_sec": len(own) / sum(own),
                "samples": {f"{p}_time_sec": values for p, values in phases.items()},
            }
        )
    rates = [p["batches_per_sec"] for p in per_rank]
    report = {
        "tool": "profile-dataloader",
        "config": config.source,
        "settings": settings_dict(s),
        "warmup": warmup,
        "measured": len(run.rank_rows[0]),
        "world_size": run.world_size,
        "batch_size": s.batch_size,
        "num_workers": s.num_workers,
        "prefetch_factor": s.prefetch_factor,
        "wall_clock_sec": wall,
        "per_rank": per_rank,
        "batches_per_sec": {"min": min(rates), "mean": sum(rates) / len(rates), "max": max(rates)},
        "cluster_samples_per_sec": sum(rates) * s.batch_size,
        "decoder": run.work.decoder,
        "decode_per_frame_sec": run.work.decode_sec / run.work.decoded_frames if run.work.decoded_frames else None,
        **measured_steps([m for m in per_step if "total_time_sec" in m]),
        **measured_cost([m for m in per_step if "total_time_sec" in m]),
        "environment": environment_info(run.device),
    }
    return finish(format_report(report), report, json_path)


def format_report(report: dict) -> str:
    """The upstream ``profile_dataloader`` text layout."""
    from scopebench.policy.tools import format_ms_stats

    w = report["world_size"]
    lines = [
        f"[rank {p['rank']}/{w}] " + " | ".join(f"{name}={format_ms_stats(p[name])}" for name in PHASES if name in p)
        for p in report["per_rank"]
    ]
    b = report["batches_per_sec"]
    title = f"{'=' * 11} profile_dataloader summary (rank 0) {'=' * 11}"
    lines += [
        "",
        title,
        f"world_size={w} batch_size={report['batch_size']} num_workers={report['num_workers']} "
        f"prefetch_factor={report['prefetch_factor']}",
        f"wall-clock over full loop: {report['wall_clock_sec']:.2f}s",
        f"per-rank batches/s (min / mean / max): {b['min']:.2f} / {b['mean']:.2f} / {b['max']:.2f}",
        f"cluster-wide samples/s (ceiling, no model): {report['cluster_samples_per_sec']:.1f}",
    ]
    if report.get("decode_per_frame_sec") is not None:
        where = "in the loading process" if report["num_workers"] == 0 else f"in {report['num_workers']} worker(s)"
        lines.append(
            f"decode per camera frame ({report['decoder']}, {where}): {report['decode_per_frame_sec'] * 1e3:.3f} ms"
        )
    if report["contention"] is not None:
        lines.append(report["contention"]["line"])
    if report["profiler_cost"] is not None:
        lines.append(report["profiler_cost"]["line"])
    lines += [
        "=" * len(title),
    ]
    return "\n".join(lines)
