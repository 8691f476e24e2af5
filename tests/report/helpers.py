"""Crafted benchopt result sets: the columns benchopt writes and the ones our solvers report."""

from __future__ import annotations

import numpy as np
import pandas as pd


def config_rows(
    solver: str,
    regions: dict[str, float],
    *,
    n: int = 20,
    warmup: int = 1,
    callback: float = 0.002,
    params: dict | None = None,
    extra: dict | None = None,
    objective: str = "pi05 policy[eval_batch_size=4]",
    dataset: str = "synthetic_robot[seed=0]",
    noise: float = 0.02,
    seed: int = 0,
    suffix: str = "_time_sec",
) -> list[dict]:
    """Rows of one configuration: ``n + 1`` evaluations, iterations after ``warmup`` recorded.

    ``regions`` maps region name -> typical seconds; each recorded iteration draws every
    region with a small multiplicative noise; ``total = sum(regions) + untracked + callback``.
    ``extra`` adds constant ``objective_<key>`` values (or callables of the iteration) to recorded rows.
    """
    rng = np.random.default_rng(seed)
    params = {"profiler_warmup": warmup, **(params or {})}
    name = solver + ("[" + ",".join(f"{k}={v}" for k, v in sorted(params.items())) + "]" if params else "")
    rows, clock = [], 0.0
    for k in range(n + 1):
        row = {
            "objective_name": objective,
            "dataset_name": dataset,
            "solver_name": name,
            "idx_rep": 0,
            "stop_val": k,
            "objective_value": 1.0 / (k + 1),
            **{f"p_solver_{p}": v for p, v in params.items()},
        }
        iteration = k - 1
        if k > 0:
            drawn = {r: t * float(rng.lognormal(0.0, noise)) for r, t in regions.items()}
            step = sum(drawn.values()) + 1e-4
            clock += step
            if iteration >= warmup:
                row.update({f"objective_{r}{suffix}": v for r, v in drawn.items()})
                row["objective_untracked_time_sec"] = 1e-4
                row["objective_callback_time_sec"] = callback
                row["objective_total_time_sec"] = step + callback
                for key, value in (extra or {}).items():
                    row[f"objective_{key}"] = value(iteration) if callable(value) else value
        row["time"] = clock
        rows.append(row)
    return rows


def write(path, *groups: list[dict]) -> str:
    pd.DataFrame([row for group in groups for row in group]).to_parquet(path)
    return str(path)
