"""Validation runs under a launcher's ranks (torchrun), written as the benchmark's rows.

A local spawn is capped at the machine's cores, and benchopt's own process is rank 0 of a spawn:
HSDP's 4 ranks on a 2-core machine come from torchrun instead, which starts every rank of
``benchmark_validation/torchrun_detect.py``. Each cell runs the same
:class:`~scopebench.validation.run.DetectRun` as the solver ``Detect``, rank 0 scores every
iteration as the objective does (:func:`~scopebench.validation.score.score`), and the rows take
benchopt's layout (``objective_name``, ``dataset_name``, ``solver_name``, ``stop_val``,
``p_dataset_*``, ``p_solver_*``, ``objective_*``), so ``make_page.py`` and ``scopebench report``
read them beside a ``benchopt run``'s.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from scopebench.validation.faults import FaultSpec
from scopebench.validation.score import score

__all__ = ["DEFAULT_CELLS", "detect_rows", "mesh_file"]

#: The cells ``torchrun_detect.py`` runs by default: 5 runs without a fault, a late rank in each
#: phase, slow input, a NaN loss.
DEFAULT_CELLS = (
    *(FaultSpec(fault="none", work_ms=40.0) for _ in range(5)),
    *(FaultSpec(fault="late_rank", rank=1, phase=p, delay_ms=100.0) for p in ("forward", "bwd", "optim_step")),
    FaultSpec(fault="late_rank", rank=1, phase="dataload_wait", delay_ms=100.0),
    FaultSpec(fault="slow_input", delay_ms=30.0),
    FaultSpec(fault="nonfinite", rank=1, step=4),
)


def mesh_file(folder: str | Path, replicate: int, shard: int) -> Path:
    """The shipped ``hsdp.yaml`` with a ``replicate`` x ``shard`` mesh, written in ``folder``."""
    import yaml

    from scopebench.train import shipped_accelerate_file
    from scopebench.train.backends.hsdp import REPLICATE, SHARD

    raw = yaml.safe_load(shipped_accelerate_file("hsdp").read_text())
    raw["parallelism_config"] = {REPLICATE: replicate, SHARD: shard}
    path = Path(folder) / f"hsdp_{replicate}x{shard}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _label(name: str, params: dict[str, Any]) -> str:
    return f"{name}[" + ",".join(f"{k}={v}" for k, v in sorted(params.items())) + "]"


def detect_rows(
    spec: FaultSpec,
    *,
    profiler: Any,
    iterations: int,
    seed: int = 0,
    output_dir: str | Path = "outputs",
    **solver: Any,
) -> list[dict[str, Any]]:
    """One validation run of ``spec`` on the launcher's ranks; rank 0 returns its rows (one per
    evaluation, ``stop_val`` 0 to ``iterations``), the other ranks ``[]``.

    Args:
        spec: The fault.
        profiler: The validated :class:`~scopebench.profiler.ProfilerConfig`.
        iterations: Profiled iterations (benchopt's ``max-runs``).
        seed: The dataset's seed.
        output_dir: The profiler's per-rank files.
        **solver: ``Detect``'s run parameters (``backend``, ``nproc_per_node``, ``batch_size``,
            ``accelerate_config``, ``interleave``...), as in a config's grid.
    """
    from scopebench.policy.settings import TrainSettings, settings_from
    from scopebench.validation.run import FAULT_POLICY, DetectRun

    interleave = bool(solver.pop("interleave", True))
    settings = settings_from(
        TrainSettings,
        solver,
        policy=FAULT_POLICY,
        policy_args=spec.policy_args(steps_per_iteration=2 if interleave else 1),
        find_unused_params=False,
        seed=seed,
    )
    run = DetectRun(
        settings,
        interleave=interleave,
        hogs=int(spec.size) if spec.fault == "contention" else 0,
        profiler=profiler,
        output_dir=output_dir,
    )
    params = {**solver, "interleave": interleave, **profiler.to_params()}
    run.record.params = params
    dataset = {**dataclasses.asdict(spec), "seed": seed}
    head = {
        "objective_name": "validation",
        "dataset_name": _label("injected", dataset),
        "solver_name": _label("Detect", params),
        "idx_rep": 0,
        **{f"p_dataset_{k}": v for k, v in dataset.items()},
        **{f"p_solver_{k}": v for k, v in params.items()},
    }
    rows: list[dict[str, Any]] = []

    def callback() -> bool:
        stopped = run.stopped_at
        if stopped is not None:
            run.record.stopped_at, run.record.stopped_rank = stopped
        scores = score(spec, run.record)
        metrics = {k: v for k, v in run.metrics().items() if isinstance(v, (int, float, str)) or v is None}
        rows.append({**head, "stop_val": len(rows), **{f"objective_{k}": v for k, v in {**scores, **metrics}.items()}})
        return len(rows) <= iterations and stopped is None

    with run:
        run.loop(callback)
    return rows if run.rank == 0 else []
