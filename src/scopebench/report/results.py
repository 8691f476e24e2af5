"""Benchopt result files in, solver configurations out.

A *configuration* is one (benchmark, dataset, solver with its parameters) found in one or
more parquet files; its rows are benchopt's evaluations, one per ``stop_val``. The row
logged at ``stop_val = k`` carries the metrics of iteration ``k - 1``, so a row's
iteration is ``stop_val - 1``. Rows outside the profiler window carry no
``objective_total_time_sec``; only *recorded* rows enter statistics.

Regions are discovered from the columns, never listed here: ``objective_<region>_time_sec``
(custom backend wall time) or, when a region has none, ``objective_<region>_cpu_sec``
(torch backend). The names in :data:`NOT_REGIONS` are whole-iteration or set-up figures and
:data:`COMPOSITE_PHASES` are sums of regions (shown in tables, never stacked).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "COMPOSITE_PHASES",
    "Configuration",
    "LAYOUT_PARAMS",
    "NON_FINITE_COLUMN",
    "NOT_REGIONS",
    "REQUIRED_COLUMNS",
    "configurations",
    "find_result_files",
    "is_on",
    "load_results",
    "read_results",
    "short_labels",
    "step_times",
]

#: Columns every benchopt result file has; a parquet without them is someone else's.
REQUIRED_COLUMNS = ("objective_name", "dataset_name", "solver_name", "stop_val")
#: ``objective_<name>_time_sec`` (or ``_cpu_sec``) columns that are not regions of the step
#: (``profiler_sampler_cpu_sec``: the host sampler thread's CPU, :mod:`scopebench.report.cost`).
NOT_REGIONS = frozenset(
    {"total", "step", "callback", "untracked", "compile", "setup", "first_call", "profiler_sampler"}
)
#: Phases that are sums of other regions (``backward_step`` = bwd + unscale_clip + optim_step + zero_grad_sched).
COMPOSITE_PHASES = frozenset({"backward_step"})
_REGION_SUFFIXES = ("_time_sec", "_cpu_sec")
#: Parameters that say how a run is laid out on processes, not what it computes.
LAYOUT_PARAMS = frozenset({"nproc_per_node", "slurm_nodes", "slurm_ntasks_per_node", "slurm_gres"})
#: Column :func:`read_results` adds when it left values out: on each row, the time columns
#: (``total_time_sec``, without ``objective_``) whose value was non-finite, comma-separated.
NON_FINITE_COLUMN = "scopebench_non_finite"


def read_results(path: str | Path):
    """One benchopt parquet as a DataFrame; ``ValueError`` naming the file when it is not one.

    Refused: a missing file, a file pyarrow cannot read (truncated, not parquet, no
    permission), a parquet with no rows, and a parquet without benchopt's columns
    (:data:`REQUIRED_COLUMNS`).
    """
    import pandas as pd

    path = Path(path)
    if not path.is_file():
        raise ValueError(f"results file {str(path)!r} does not exist")
    try:
        df = pd.read_parquet(path)
    except Exception as err:  # pyarrow raises several unrelated types for a bad file
        raise ValueError(f"results file {str(path)!r} is not a readable parquet file: {err}") from None
    missing = [c for c in REQUIRED_COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(f"results file {str(path)!r} is not a benchopt result (missing columns {', '.join(missing)})")
    if df.empty:
        raise ValueError(f"results file {str(path)!r} holds no rows (did every solver fail or get skipped?)")
    return _drop_non_finite(df, path)


def _drop_non_finite(df, path: Path):
    """``df`` with the infinite values of its ``objective_*_time_sec`` / ``_cpu_sec`` columns
    made missing, so that statistics leave them out (an inf mean, a NaN share otherwise).

    One warning line on stderr per column names it and counts what was left out: the
    infinite values, and the NaN of a recorded row (``objective_total_time_sec`` present) in
    a column its configuration fills on other recorded rows. Other NaN are not values: rows
    outside the profiler window, regions another configuration or backend has. Each row
    names the columns it lost in :data:`NON_FINITE_COLUMN` (:meth:`Configuration.non_finite`),
    so that a comparison knows which of its figures lack values.
    """
    import sys

    import numpy as np
    import pandas as pd

    columns = [
        c
        for c in df.columns
        if c.startswith("objective_") and c.endswith(_REGION_SUFFIXES) and pd.api.types.is_numeric_dtype(df[c])
    ]
    if not columns:
        return df
    total = "objective_total_time_sec"
    recorded = df[total].notna() if total in df.columns else pd.Series(False, index=df.index)
    config = [df[c].astype(str) for c in REQUIRED_COLUMNS[:3]]  # objective, dataset, solver
    df = df.copy()
    lost_in = pd.Series("", index=df.index)
    for column in columns:
        infinite = np.isinf(df[column].to_numpy(dtype=float))
        present = df[column].notna() & ~infinite & recorded
        filled = present.groupby(config).transform("any")
        lost = infinite | (df[column].isna() & recorded & filled)
        dropped = int(lost.sum())
        if dropped:
            lost_in[lost] += column.removeprefix("objective_") + ","
            df.loc[infinite, column] = np.nan
            print(
                f"warning: results file {str(path)!r}: {dropped} non-finite value(s) (NaN or inf) in {column} "
                "left out of the statistics",
                file=sys.stderr,
            )
    if (lost_in != "").any():
        df[NON_FINITE_COLUMN] = lost_in.str.rstrip(",")
    return df


def find_result_files(paths: Iterable[str | Path]) -> list[Path]:
    """The parquet files named by ``paths``: files as given, folders by their ``*.parquet``.

    Raises:
        ValueError: a path that does not exist, or a folder without any ``.parquet`` file.
    """
    files: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found = sorted(path.glob("*.parquet"))
            if not found:
                raise ValueError(f"folder {str(path)!r} holds no .parquet results file")
            files.extend(found)
        elif path.exists():
            files.append(path)
        else:
            raise ValueError(f"results file {str(path)!r} does not exist")
    if not files:
        raise ValueError("no results file given")
    return files


def load_results(paths: Iterable[str | Path]):
    """All rows of the files named by ``paths`` (see :func:`find_result_files`), one DataFrame.

    A column ``result_file`` names each row's file. The frame is built at once: the files'
    frames concatenated, then consolidated (``copy``), since a concatenation of files with
    different columns holds a block per column (hundreds: pandas then warns, "highly
    fragmented", at the next column a reader adds).
    """
    import pandas as pd

    frames = [read_results(path).assign(result_file=str(path)) for path in find_result_files(paths)]
    return frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True, sort=False).copy()


def short_labels(names: list[str]) -> dict[str, str]:
    """``Name[k=v,...]`` labels reduced to the parameters that differ between names of the same base.

    :Examples:
        >>> short_labels(["PnP[a=1,mode=custom]", "PnP[a=1,mode=torch]", "Denoiser[a=1]"])
        {'PnP[a=1,mode=custom]': 'PnP[mode=custom]', 'PnP[a=1,mode=torch]': 'PnP[mode=torch]', 'Denoiser[a=1]': 'Denoiser'}
    """
    parsed = {name: _parse_name(name) for name in names}
    labels = {}
    for name, (base, params) in parsed.items():
        siblings = [p for b, p in parsed.values() if b == base]
        keep = [k for k, v in params.items() if any(other.get(k) != v for other in siblings)]
        labels[name] = f"{base}[{','.join(f'{k}={params[k]}' for k in keep)}]" if keep else base
    return labels


def _parse_name(name: str) -> tuple[str, dict[str, str]]:
    base, _, rest = name.partition("[")
    pairs = [p.split("=", 1) for p in rest.rstrip("]").split(",") if "=" in p]
    return base, dict(pairs)


@dataclass
class Configuration:
    """One solver configuration on one dataset of one benchmark."""

    benchmark: str
    """Objective name without parameters (``Imaging inference``, ``pi05 policy``...)."""
    dataset: str
    solver: str
    """benchopt's full ``solver_name`` (``PnP[denoiser=tv,...]``)."""
    label: str
    """Short name: the solver's base name and the parameters that differ from its siblings."""
    rows: Any
    """All its rows (DataFrame), ordered by repetition and ``stop_val``."""
    recorded: Any
    """The rows inside the profiler window (``objective_total_time_sec`` present)."""
    regions: tuple[str, ...] = ()
    """Regions of the step, in the order the solver reported them."""
    composites: tuple[str, ...] = ()
    region_columns: dict[str, str] = field(default_factory=dict)
    """Region (or composite) -> its time column."""
    cache: dict[Any, Any] = field(default_factory=dict, repr=False, compare=False)
    """Derived values, computed once (tables, figures and rules read the same series many times)."""

    @property
    def solver_base(self) -> str:
        return self.solver.partition("[")[0]

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.benchmark, self.dataset, self.solver)

    def has(self, metric: str) -> bool:
        """Whether ``objective_<metric>`` has a value in a recorded row."""
        column = f"objective_{metric}"
        return column in self.recorded.columns and bool(self.recorded[column].notna().any())

    def values(self, metric: str) -> list[float]:
        """Values of ``objective_<metric>`` in the recorded rows."""
        key = ("values", metric)
        if key not in self.cache:
            self.cache[key] = _column_values(self.recorded, f"objective_{metric}")
        return self.cache[key]

    def facts(self, metric: str) -> list[float]:
        """Values of ``objective_<metric>`` in every row (set-up facts such as ``world_size``)."""
        return _column_values(self.rows, f"objective_{metric}")

    def non_finite(self) -> dict[str, int]:
        """Time column (``total_time_sec``) -> how many of its values :func:`read_results` left
        out of this configuration's rows as non-finite (none: ``{}``)."""
        counts: dict[str, int] = {}
        if NON_FINITE_COLUMN in self.rows.columns:
            for names in self.rows[NON_FINITE_COLUMN].dropna().tolist():
                for name in filter(None, str(names).split(",")):
                    counts[name] = counts.get(name, 0) + 1
        return counts

    def region_values(self, region: str) -> list[float]:
        return self.values(self.region_columns[region])

    def step_values(self) -> list[float]:
        """Seconds per recorded iteration without the scoring callback (:func:`step_times`)."""
        if "step" in self.cache:
            return self.cache["step"]
        self.cache["step"] = [float(v) for v in step_times(self.recorded).tolist()]
        return self.cache["step"]

    def iterations(self) -> list[int]:
        """Iteration index (``stop_val - 1``) of each recorded row."""
        return [int(v) - 1 for v in self.recorded["stop_val"].tolist()]

    def param(self, name: str) -> Any:
        """Solver parameter ``name`` (``p_solver_<name>``), else dataset parameter, else ``None``."""
        for prefix in ("p_solver_", "p_dataset_", "p_obj_"):
            column = prefix + name
            if column in self.rows.columns:
                present = self.rows[column].dropna()
                if not present.empty:
                    return present.iloc[0]
        return None

    def params(self) -> dict[str, Any]:
        """Every solver and dataset parameter (``dataset.<name>`` for the dataset's)."""
        out: dict[str, Any] = {}
        first = self.rows.iloc[0]
        for column in self.rows.columns:
            value = first[column]
            if column.startswith("p_solver_"):
                out[column.removeprefix("p_solver_")] = value
            elif column.startswith("p_dataset_"):
                out["dataset." + column.removeprefix("p_dataset_")] = value
        return {k: v for k, v in out.items() if not _missing(v)}

    def ranks(self) -> int:
        """Processes of the run: ``objective_world_size``, else ``nproc_per_node``, else 1."""
        world = self.facts("world_size")
        if world:
            return int(max(world))
        try:
            return int(self.param("nproc_per_node") or 1)
        except (TypeError, ValueError):
            return 1


def _column_values(frame, column: str) -> list[float]:
    if column not in frame.columns:
        return []
    try:
        return [float(v) for v in frame[column].dropna().tolist()]
    except (TypeError, ValueError):  # a text column (device name, versions)
        return []


#: A parameter's values that mean off (a flag benchopt stored as text, a compile mode).
_OFF = {"", "none", "false", "off", "eager", "0", "no", "null"}


def is_on(value: Any) -> bool:
    """Whether a parameter's value turns its feature on (``True``, ``"true"``, a compile mode),
    not off (``None``, NaN, ``False``, ``"eager"``...).

    :Examples:

    >>> is_on(True), is_on("True"), is_on("max-autotune"), is_on(False), is_on("eager"), is_on(None)
    (True, True, True, False, False, False)
    """
    return value is not None and value == value and str(value).strip().lower() not in _OFF


def _missing(value: Any) -> bool:
    try:
        return value is None or value != value  # NaN
    except (TypeError, ValueError):
        return False


def step_times(rows):
    """Step time of each row (a Series): ``objective_step_time_sec``, the profiler's
    ``total_time_sec - callback_time_sec``.

    Files written before the profiler reported ``step_time_sec`` lack the column (or, mixed
    with newer files, leave it empty on their rows): those rows fall back to
    ``objective_total_time_sec - objective_callback_time_sec`` (no callback column: the total).

    :Examples:
        >>> import pandas as pd
        >>> rows = pd.DataFrame({"objective_total_time_sec": [0.5, 0.5], "objective_callback_time_sec": [0.1, 0.2],
        ...                      "objective_step_time_sec": [0.4, None]})
        >>> step_times(rows).round(3).tolist()
        [0.4, 0.3]
    """
    step = rows["objective_total_time_sec"]
    if "objective_callback_time_sec" in rows.columns:
        step = step - rows["objective_callback_time_sec"].fillna(0.0)
    if "objective_step_time_sec" in rows.columns:
        step = rows["objective_step_time_sec"].fillna(step)
    return step


def _benchmark_name(objective_name: str) -> str:
    return str(objective_name).partition("[")[0]


def _regions(recorded) -> tuple[tuple[str, ...], tuple[str, ...], dict[str, str]]:
    present = [c for c in recorded.columns if c.startswith("objective_") and recorded[c].notna().any()]
    columns: dict[str, str] = {}
    for suffix in _REGION_SUFFIXES:  # wall time first: a region measured both ways keeps `_time_sec`
        for column in present:
            if not column.endswith(suffix):
                continue
            name = column.removeprefix("objective_").removesuffix(suffix)
            if name and name not in NOT_REGIONS and name not in columns:
                columns[name] = column.removeprefix("objective_")
    order = {c.removeprefix("objective_"): i for i, c in enumerate(present)}
    names = sorted(columns, key=lambda n: order[columns[n]])
    regions = tuple(n for n in names if n not in COMPOSITE_PHASES)
    composites = tuple(n for n in names if n in COMPOSITE_PHASES)
    return regions, composites, {n: columns[n] for n in names}


def configurations(df) -> list[Configuration]:
    """The configurations in a results DataFrame, in order of first appearance.

    Labels are shortened per benchmark (:func:`short_labels`); when a benchmark has
    several datasets the dataset's short name is appended (``label @ dataset``).
    """
    out: list[Configuration] = []
    benchmarks = df["objective_name"].map(_benchmark_name)  # a key, not a column: no insertion
    sort_keys = [c for c in ("idx_rep", "stop_val") if c in df.columns]
    has_total = "objective_total_time_sec" in df.columns
    for benchmark, bench_rows in df.groupby(benchmarks, sort=False):
        solvers = short_labels([str(s) for s in bench_rows["solver_name"].unique()])
        datasets = short_labels([str(s) for s in bench_rows["dataset_name"].unique()])
        several = len(datasets) > 1
        for (dataset, solver), rows in bench_rows.groupby(["dataset_name", "solver_name"], sort=False):
            rows = rows.sort_values(sort_keys, kind="stable")
            recorded = rows[rows["objective_total_time_sec"].notna()] if has_total else rows.iloc[0:0]
            regions, composites, columns = _regions(recorded)
            label = solvers[str(solver)] + (f" @ {datasets[str(dataset)]}" if several else "")
            out.append(
                Configuration(
                    benchmark=str(benchmark),
                    dataset=str(dataset),
                    solver=str(solver),
                    label=label,
                    rows=rows,
                    recorded=recorded,
                    regions=regions,
                    composites=composites,
                    region_columns=columns,
                )
            )
    return out
