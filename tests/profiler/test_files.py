"""Profiler files are written atomically, under unpredictable names, and never lost silently."""

from __future__ import annotations

import os
import warnings

import pytest
import torch

from scopebench.harness import ProfiledSolverMixin
from scopebench.profiler import create_profiler
from scopebench.profiler.files import write_csv, write_exported


def _plant(folder, final_name):
    """A symlink where the former code put its temporary file, pointing at a victim."""
    victim = folder / "victim.txt"
    victim.write_text("precious")
    (folder / f".{final_name}.{os.getpid()}.tmp").symlink_to(victim)
    return victim


def test_csv_write_cannot_be_redirected_by_a_planted_symlink(tmp_path):
    victim = _plant(tmp_path, "run_gpu_metrics.csv")
    write_csv(tmp_path / "run_gpu_metrics.csv", [{"iter": 0, "total_time_sec": 1.0}])
    assert victim.read_text() == "precious"
    assert (tmp_path / "run_gpu_metrics.csv").read_text().splitlines() == ["iter,total_time_sec", "0,1.0"]


def test_exported_file_cannot_be_redirected_and_leaves_no_temporaries(tmp_path):
    victim = _plant(tmp_path, "x.pt.trace.json")
    (tmp_path / "victim.txt").chmod(0o644)

    def export(filename):
        with open(filename, "w") as fh:
            fh.write("{}")

    path = write_exported(tmp_path / "x.pt.trace.json", export)
    assert victim.read_text() == "precious" and path.read_text() == "{}"
    assert sorted(p.name for p in tmp_path.iterdir() if not p.is_symlink()) == ["victim.txt", "x.pt.trace.json"]


def test_failed_export_leaves_nothing(tmp_path):
    def export(filename):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        write_exported(tmp_path / "t.json", export)
    assert list(tmp_path.iterdir()) == []


def _iterations(prof, n):
    calls = iter(range(n + 1))
    for _ in prof.iterate(lambda: next(calls) < n):
        with prof.track_step("work"):
            pass


def test_unwritable_csv_at_the_end_warns_and_keeps_the_results(read_only_dir):
    prof = create_profiler("custom", "cpu", "ro", save_file=True, output_dir=read_only_dir)
    _iterations(prof, 2)
    with pytest.warns(RuntimeWarning, match=r"profiler_save_file: could not write '.*read_only/ro_.*_gpu_metrics.csv'"):
        assert prof.finalize() == []
    assert prof.get_current_metrics()["work_time_sec"] >= 0.0


def test_an_output_folder_unwritable_at_the_end_does_not_break_the_solver_loop(tmp_path, read_only_dir):
    from scopebench.harness.run import RankRun

    class Work(RankRun):
        def step(self, profiler):
            with profiler.track_step("work"):
                torch.ones(8) + 1

    class FakeSolver(ProfiledSolverMixin):
        profiler_mode = "torch"
        profiler_save_file = True

    solver = FakeSolver()
    with pytest.raises(ValueError, match="profiler_save_file"):  # checked before any work ...
        Work(profiler=solver.validate_profiler(read_only_dir), output_dir=read_only_dir)
    run = Work(profiler=solver.validate_profiler(tmp_path), output_dir=tmp_path, name="fake")
    calls = iter(range(3))
    solver.start_run(run)
    run.profiler.output_dir = read_only_dir  # ... but a folder can still go read-only during the run
    with pytest.warns(RuntimeWarning, match="profiler_save_file: could not write") as record:
        solver.finish_run(run, lambda: next(calls) < 2)
    assert len(record) == 2  # the metrics CSV and the operator CSV, each named
    assert "work_cpu_sec" in run.metrics()


def test_window_never_reached_is_reported_at_the_end(tmp_path):
    prof = create_profiler("custom", "cpu", "late", warmup=10, active=3, save_file=True, output_dir=tmp_path)
    _iterations(prof, 2)
    message = (
        r"profiler window was never reached: profiler_warmup=10, profiler_active=3, but only 2 "
        r"iteration\(s\) ran, so no profiler metrics were recorded and no file was written"
    )
    with pytest.warns(RuntimeWarning, match=message):
        assert prof.finalize() == []
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("warmup, iterations", [(1, 2), (5, 0)])
def test_no_window_warning_when_recorded_or_nothing_ran(warmup, iterations):
    prof = create_profiler("custom", "cpu", "fine", warmup=warmup)
    _iterations(prof, iterations)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        prof.finalize()


def test_a_failed_run_keeps_its_iterations_in_files_named_partial(tmp_path):
    """A run that ends with an error keeps what it recorded, never under a whole run's name."""
    with pytest.raises(RuntimeError, match="the node went away"):
        with create_profiler("custom", "cpu", "cut", save_file=True, output_dir=tmp_path) as prof:
            _iterations(prof, 3)
            raise RuntimeError("the node went away")
    (path,) = tmp_path.iterdir()
    assert path.name.endswith("_rank0_partial_gpu_metrics.csv") and prof.files == [path]
    assert len(path.read_text().splitlines()) == 1 + 3  # header and the three iterations
    whole = create_profiler("custom", "cpu", "whole", save_file=True, output_dir=tmp_path)
    _iterations(whole, 1)
    assert whole.finalize()[0].name.endswith("_rank0_gpu_metrics.csv")
