"""The largest per-rank batch that runs a full training step (forward, backward, optimizer).

What it does: real trials of the config's training step (:mod:`scopebench.policy.max_batch`)
at batches 1, 2, 4... then bisecting, each trial two steps with ``profiler_memory`` and
everything freed after it. On CUDA a batch fits unless it raises ``torch.OutOfMemoryError``
(with ``--memory-gb``, also when its peak exceeds that); on a CPU, which swaps instead of
raising, ``--memory-gb`` is required and a batch fits when its measured step peak (worst rank)
is within it. The dataset caps the batch (every rank needs a full batch).

How to run::

    scopebench find-max-batch --config configs/policy/small.yml --backend fsdp2 --nproc-per-node 2
    scopebench find-max-batch --config configs/policy/tiny.yml --memory-gb 0.006 --json outputs/max_batch.json \
        --png outputs/max_batch.png

Output: one line per trial (batch, peak by category in MiB, fits or not), then the largest
batch and its margin. JSON (``--json``): ``tool`` ("find-max-batch"), ``config``, ``preset``,
``backend``, ``world_size``, ``device``, ``memory_gb``, ``limit``, ``limit_mb`` (the budget,
else the CUDA device's memory, MiB), ``largest_batch``, ``margin_mb``, ``trials`` (``batch``,
``fits``, ``peak_mb``, ``categories_mb``, ``reserved_mb``, ``note``), ``host_other_cpu_pct``,
``host_steal_pct`` and ``contention`` (per trial's measured step, as ``profile-step``'s; the
``CONTENDED:`` / ``host load:`` line is printed after the largest batch), ``profiler_cost`` (as
``profile-step``'s over the trials' measured steps, each with its own profiler's start-up;
its ``profiler cost:`` line follows). PNG (``--png``): the
trials' peaks against the batch, their least-squares line, the limit and the largest batch
read off the line beside the one the trials found (the report's memory-against-batch
picture, :func:`scopebench.report.memory_figures.batch_figure`).

``--nproc``, the old spelling of ``--nproc-per-node``, still works and prints one
deprecation line on stderr.

Exit status: 2 with one line for a refused input, else 0.
"""

from __future__ import annotations

import argparse

from scopebench.commands._common import add_memory_gb, add_nproc_per_node, finish, memory_gb, refuses

HELP = "largest per-rank batch whose training step fits (real trials: doubling, then bisecting)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from scopebench.commands._policy_options import add_backend_arguments, add_config_arguments

    add_config_arguments(parser)
    add_backend_arguments(parser)
    add_nproc_per_node(parser, "ranks (default: the config's nproc_per_node)", deprecated=("--nproc",))
    add_memory_gb(parser, "memory of one rank (GB, 1e9 bytes)")
    parser.add_argument("--max-batch", type=int, default=None, help="largest batch to try (default: the dataset's)")
    parser.add_argument("--png", default=None, help="also draw the trials, their line and the limit into this PNG")


@refuses("find-max-batch")
def run(args: argparse.Namespace) -> int:
    from scopebench.commands._policy_options import backend_flags
    from scopebench.policy.tools import check_json_path, load_config
    from scopebench.train.accelerate_file import resolve_accelerate_file
    from scopebench.validate import integer, optional

    backend, file = backend_flags(args)
    config = load_config(args, flags={**backend, "nproc_per_node": args.nproc_per_node})
    # the backend and its file, resolved once: the states check and every trial's run are handed them
    file = file or resolve_accelerate_file(config.train.backend, config.train.accelerate_config)
    budget_gb = memory_gb(args)
    max_batch = optional(integer, "--max-batch", args.max_batch, low=1)
    check_json_path("--json", args.json)
    check_json_path("--png", args.png)
    from scopebench.distributed.device import resolve_device

    device = resolve_device(config.train.device)
    if device.type != "cuda" and budget_gb is None:
        raise ValueError(
            f"--memory-gb is required on {device.type}: a CPU swaps instead of raising an out-of-memory error, "
            "so a batch fits when its measured peak is within --memory-gb"
        )
    if config.train.policy == "pi05" and config.train.check_memory:  # before a model is built: seconds, not minutes
        from scopebench.policy.run.checks import check_preset_states

        world = config.train.nproc_per_node
        local = world if device.type == "cpu" else 1
        check = dict(world_size=world, device=device, processes=local, budget_gb=budget_gb)
        check_preset_states(config.train, backend=file.backend, **check)
    return _search(config, device, budget_gb, max_batch, args.json, args.png, file)


def _search(config, device, memory_gb, max_batch, json_path, png_path, file) -> int:
    import tempfile

    import torch

    from scopebench.policy.data.dataset import RobotDataset
    from scopebench.policy.max_batch import StepTrial, run_steps, search
    from scopebench.report.contention import measured_steps
    from scopebench.report.cost import measured_cost
    from scopebench.validate import batch_limit

    s, d = config.train, config.dataset
    root = d.materialize()
    world = s.nproc_per_node
    # the batch-against-dataset rule's bound (scopebench.validate.check_batch_fits)
    limit = batch_limit(len(RobotDataset(root, chunk_size=d.chunk_size)), world)
    limit = min(limit, max_batch) if max_batch else limit
    budget = None if memory_gb is None else memory_gb * 1e9 / 2**20
    print(
        f"scopebench find-max-batch: preset={s.preset} backend={s.backend} ranks={world} device={device.type} "
        + (f"budget {memory_gb:g} GB per rank" if memory_gb else "until torch.OutOfMemoryError")
        + f"; batches up to {limit}"
    )
    with tempfile.TemporaryDirectory(prefix="scopebench_max_batch_") as tmp:
        steps = run_steps(s, dataset_root=str(root), chunk_size=d.chunk_size, output_dir=tmp, accelerate_file=file)
        measured: list[dict] = []  # each trial's measured step (empty when it raised), for the host load

        def timed(batch: int) -> dict:
            metrics: dict = {}
            try:
                metrics = steps(batch)
                return metrics
            finally:
                measured.append(metrics)

        trial = StepTrial(timed, budget, torch.cuda if device.type == "cuda" else None)
        best, trials = search(trial, limit=limit, report=lambda t: print("  " + t.line(), flush=True))
    last = next((t for t in reversed(trials) if t.batch == best and t.fits), None)
    margin = trial.margin_mb(last) if last else None
    margin_text = "" if margin is None else f" (margin {margin:.1f} MiB)"
    print(f"largest per-rank batch: {best}{margin_text}" + (" (the dataset's limit)" if best == limit else ""))
    host = measured_steps(measured)  # step i: trial i's measured step
    if host["contention"] is not None:
        print(host["contention"]["line"])
    cost = measured_cost(measured)  # each trial's one measured step carries its profiler's start-up
    if cost["profiler_cost"] is not None:
        print(cost["profiler_cost"]["line"])
    payload = {
        "tool": "find-max-batch",
        "config": config.source,
        "preset": s.preset,
        "backend": s.backend,
        "world_size": world,
        "device": device.type,
        "memory_gb": memory_gb,
        "limit": limit,
        "limit_mb": trial.limit_mb(),
        "largest_batch": best,
        "margin_mb": margin,
        "trials": [t.__dict__ for t in trials],
        **host,
        **cost,
    }
    finish(None, payload, json_path)
    if png_path:
        print(f"wrote {write_png(payload, png_path)}")
    return 0


def write_png(payload: dict, path: str):
    """Draw a find-max-batch result (its JSON ``payload``) into the PNG ``path``; returns it."""
    from scopebench.report.memory_figures import batch_figure, trials_fit
    from scopebench.report.plots import save_png

    fit = trials_fit(payload)
    if fit["largest_batch"] is not None:
        print(f"the line through the trials (R² {fit['r2']:.3f}) keeps batch {fit['largest_batch']} within the limit")
    title = f"find-max-batch {payload['preset']} {payload['backend']} x{payload['world_size']} ({payload['device']})"
    return save_png(batch_figure([fit], title), path)
