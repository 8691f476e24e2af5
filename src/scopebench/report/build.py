"""``scopebench summary`` and ``scopebench report``: the same reading, tables and warnings.

:func:`summarize_results` returns the text both commands print (phase tables per
configuration, backend comparisons, truncated-run warnings, diagnosis lines);
:func:`build_report` adds the PNGs, the self-contained HTML and a JSON file of the same
numbers into an output folder.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from scopebench.atomic import atomic_write
from scopebench.report.backend_comparison import backend_comparisons
from scopebench.report.diagnosis import Finding, diagnose_all
from scopebench.report.results import Configuration, configurations, find_result_files, load_results
from scopebench.report.tables import format_tables, phase_rows

__all__ = ["Report", "Results", "build_report", "diagnose_groups", "read", "summarize_results"]

MANIFEST = "report.json"


@dataclass
class Results:
    """What both commands read: the files, their configurations grouped by benchmark, warnings."""

    files: list[Path]
    groups: dict[str, list[Configuration]]
    """Benchmark name -> its configurations."""
    timeouts: list[tuple[str | None, str]]
    """(benchmark or ``None`` when unmatched, warning line) per solver stopped on benchopt's timeout."""

    @property
    def warnings(self) -> list[str]:
        return [text for _, text in self.timeouts]

    @property
    def configs(self) -> list[Configuration]:
        return [c for configs in self.groups.values() for c in configs]


@dataclass
class Report:
    """What ``scopebench report`` wrote."""

    html: Path
    pngs: list[Path]
    text: str
    findings: list[Finding] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def _timeout_warnings(files: list[Path], configs: list[Configuration]) -> list[tuple[str | None, str]]:
    from scopebench.runs import read_run_metadata

    labels = {(c.dataset, c.solver): c for c in configs}
    out = []
    for path in files:
        for entry in read_run_metadata(path).get("stopped_on_timeout", []):
            config = labels.get((entry["dataset"], entry["solver"]))
            name = f"{config.label} ({config.benchmark})" if config else entry["solver"]
            limit = entry.get("max_runs")
            text = (
                f"warning: {name} stopped on benchopt's timeout after {entry['rows']} rows"
                + (f", before max-runs {limit} ({limit + 1} rows when complete)" if limit is not None else "")
                + f" in {path}; raise `timeout` in the run config or pass --timeout"
            )
            out.append((config.benchmark if config else None, text))
    return out


def read(paths: list[str | Path]) -> Results:
    """Read result files or folders (``ValueError`` naming a bad file or an empty folder)."""
    files = find_result_files(paths)
    configs = configurations(load_results(files))
    groups: dict[str, list[Configuration]] = {}
    for c in configs:
        groups.setdefault(c.benchmark, []).append(c)
    return Results(files=files, groups=groups, timeouts=_timeout_warnings(files, configs))


def diagnose_groups(results: Results) -> dict[str, list[Finding]]:
    """Diagnosis per benchmark (rules compare configurations of the same benchmark only)."""
    return {title: diagnose_all(configs) for title, configs in results.groups.items()}


def summarize_results(results: Results, findings: list[Finding] | None = None) -> str:
    """Phase tables and backend comparisons, warnings, diagnosis lines: the text of ``summary`` and ``report``."""
    parts = []
    for title, configs in results.groups.items():
        blocks = [format_tables(configs)] + [c.text() for c in backend_comparisons(configs)]
        parts.append(f"##### {title} #####\n\n" + "\n\n".join(blocks))
    if results.warnings:
        parts.append("\n".join(results.warnings))
    if findings:
        parts.append("diagnosis (rules in docs/diagnosis.md):\n" + "\n".join(f.text() for f in findings))
    return "\n\n".join(parts)


def _remove_previous(out_dir: Path) -> None:
    """Delete the PNGs an earlier report listed in its manifest, so none is left stale."""
    manifest = out_dir / MANIFEST
    if not manifest.is_file():
        return
    try:
        previous = json.loads(manifest.read_text()).get("pngs", [])
    except ValueError:
        return
    for name in previous:
        path = out_dir / Path(name).name
        if path.suffix == ".png":
            path.unlink(missing_ok=True)


def build_report(paths: list[str | Path], out_dir: str | Path | None = None, memory_gb: float | None = None) -> Report:
    """Write the PNGs, ``report.html``, ``report.txt`` and ``report.json`` of some results.

    Args:
        paths: Parquet files or folders of them.
        out_dir: Output folder; default ``report/`` beside the first results file.
        memory_gb: One rank's device memory (GB, 1e9 bytes): the limit drawn on memory against
            batch size, and the largest batch its line keeps within it.
    """
    from scopebench.report.html import render_html
    from scopebench.report.memory_figures import batch_fits
    from scopebench.report.plots import write_pngs

    limit_mb = None if memory_gb is None else memory_gb * 1e9 / 2**20

    results = read(paths)
    out = Path(out_dir) if out_dir is not None else results.files[0].parent / "report"
    out.mkdir(parents=True, exist_ok=True)
    _remove_previous(out)
    by_group = diagnose_groups(results)
    findings = [f for group in by_group.values() for f in group]
    text = summarize_results(results, findings)
    pngs = []
    for title, configs in results.groups.items():
        pngs += write_pngs(configs, title, out, limit_mb)
    comparisons = {title: backend_comparisons(configs) for title, configs in results.groups.items()}
    sections = [
        {
            "title": title,
            "configs": configs,
            "findings": by_group[title],
            "comparisons": comparisons[title],
            "warnings": [text for group, text in results.timeouts if group == title],
        }
        for title, configs in results.groups.items()
    ]
    unmatched = [text for group, text in results.timeouts if group is None]
    page = render_html(sections, [str(f) for f in results.files], unmatched, limit_mb)
    html_path = out / "report.html"
    with atomic_write(html_path, "w", encoding="utf-8") as fh:
        fh.write(page)
    with atomic_write(out / "report.txt", "w", encoding="utf-8") as fh:
        fh.write(text + "\n")
    manifest: dict[str, Any] = {
        "sources": [str(f) for f in results.files],
        "html": html_path.name,
        "pngs": [p.name for p in pngs],
        "warnings": results.warnings,
        "findings": [asdict(f) for f in findings],
        "backend_comparisons": [c.as_dict() for group in comparisons.values() for c in group],
        "phase_rows": [row for c in results.configs for row in phase_rows(c)],
        "memory_batch_fits": [
            {"benchmark": title, **fit}
            for title, configs in results.groups.items()
            for fit in batch_fits(configs, limit_mb)
        ],
    }
    with atomic_write(out / MANIFEST, "w", encoding="utf-8") as fh:
        json.dump(manifest, fh, indent=1)
    return Report(html=html_path, pngs=pngs, text=text, findings=findings, warnings=results.warnings)
