"""``find-max-batch``: real trials on the CPU against a budget; the CUDA path with injected OOMs."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from scopebench.cli import main
from scopebench.policy.max_batch import StepTrial, run_steps, search
from scopebench.profiler.device import MB

from .conftest import TINY

BUDGET_GB = 0.006  # tiny, one process: batch 3 peaks at about 5.7 MiB, batch 4 at 6.7 MiB


def test_on_cpu_the_batch_found_fits_and_its_double_does_not(tmp_path, robot_data, capsys):
    out, png = tmp_path / "max_batch.json", tmp_path / "max_batch.png"
    args = ["find-max-batch", "--config", TINY, "--memory-gb", str(BUDGET_GB), "--json", str(out), "--png", str(png)]
    assert main([*args, f"--dataset.cache_dir={robot_data[0].cache_dir}", "--find_unused_params=false"]) == 0
    text = capsys.readouterr().out
    report = json.loads(out.read_text())
    best, budget_mb = report["largest_batch"], BUDGET_GB * 1e9 / MB
    assert best >= 1 and f"largest per-rank batch: {best}" in text
    assert report["limit_mb"] == pytest.approx(budget_mb)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f"wrote {png}" in text
    trials = {t["batch"]: t for t in report["trials"]}
    assert trials[best]["fits"] and trials[best]["peak_mb"] <= budget_mb
    assert all(f"batch {b}: peak" in text for b in trials)  # every trial printed
    double = trials.get(2 * best)
    if double is None:  # the search stopped below it: measure it the same way
        from scopebench.policy.settings import load_run_config

        config = load_run_config(TINY, [("find_unused_params", False), ("dataset.cache_dir", robot_data[0].cache_dir)])
        steps = run_steps(config.train, dataset_root=str(robot_data[1]), chunk_size=8, output_dir=str(tmp_path))
        double = StepTrial(steps, budget_mb)(2 * best).__dict__
    assert not double["fits"] and double["peak_mb"] > budget_mb


def test_on_cpu_a_budget_is_required(capsys):
    assert main(["find-max-batch", "--config", TINY]) == 2
    assert "--memory-gb is required on cpu" in capsys.readouterr().err


def test_a_preset_whose_states_exceed_the_budget_is_refused_before_it_is_built(capsys, robot_data, monkeypatch):
    """The model-state check ``train`` and ``profile-step`` make (issue 37: pi05 was built, 7.7 GB
    resident after a minute, for a 0.5 GB budget)."""
    import scopebench.policy.max_batch as max_batch

    monkeypatch.setattr(max_batch, "run_steps", lambda *a, **k: pytest.fail("a trial was built"))
    args = ["find-max-batch", "--config", TINY, "--preset=small", "--memory-gb", "0.5"]
    assert main([*args, f"--dataset.cache_dir={robot_data[0].cache_dir}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("scopebench find-max-batch: preset='small' needs "), err
    assert "more than --memory-gb 0.5: no batch fits" in err[0]


def test_find_max_batch_checks_the_states_as_zero1_holds_them(capsys, robot_data, monkeypatch):
    """ZeRO-1, a backend added as one module, is in ``find-max-batch``: the states check before any
    trial counts its optimizer state over the ranks."""
    import scopebench.policy.max_batch as max_batch

    monkeypatch.setattr(max_batch, "run_steps", lambda *a, **k: pytest.fail("a trial was built"))
    args = ["find-max-batch", "--config", TINY, "--preset=small", "--backend", "zero1", "--nproc-per-node", "2"]
    assert main([*args, "--memory-gb", "0.5", f"--dataset.cache_dir={robot_data[0].cache_dir}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("scopebench find-max-batch: preset='small' needs "), err
    assert "bytes: fp32 weights, gradients and AdamW state (zero1 over 2 rank(s))" in err[0]


class Cuda:
    """``torch.cuda`` as a trial uses it: the cache emptied after each trial, the device's memory."""

    def __init__(self) -> None:
        self.emptied = 0

    def empty_cache(self) -> None:
        self.emptied += 1

    def current_device(self) -> int:
        return 0

    def get_device_properties(self, index: int):
        return SimpleNamespace(total_memory=200 * 2**20)


def test_on_cuda_trials_double_then_bisect_until_out_of_memory():
    """A step that allocates 10 MiB per sample on a 200 MiB device raises above batch 13."""
    seen = []

    def steps(batch: int) -> dict:
        seen.append(batch)
        if batch > 13:
            raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate {batch * 10} MiB")
        return {
            "mem_peak_mb": 10.0 * batch,
            "mem_reserved_peak_mb": 10.0 * batch + 5,
            "mem_activations_mb": 8.0 * batch,
        }

    cuda = Cuda()
    trial = StepTrial(steps, cuda=cuda)
    lines = []
    best, trials = search(trial, limit=1000, report=lambda t: lines.append(t.line()))
    assert best == 13 and seen == [1, 2, 4, 8, 16, 12, 14, 13]
    assert cuda.emptied == len(seen)  # everything freed between trials, after an OOM too
    assert [t.fits for t in trials] == [True, True, True, True, False, True, False, True]
    assert "batch 16: no peak does NOT fit (out of memory: CUDA out of memory" in lines[4]
    assert trial.margin_mb(trials[-1]) == pytest.approx(200 - 135)  # the device less the reserved peak


def test_the_trials_picture_reads_the_largest_batch_off_their_line(tmp_path, capsys):
    """The trials of the search above as find-max-batch's JSON: line, limit, OOM trials, found batch."""
    from scopebench.commands.find_max_batch import write_png
    from scopebench.report.memory_figures import trials_fit

    def steps(batch: int) -> dict:
        if batch > 13:  # the real device runs out of memory before the line reaches the limit
            raise torch.OutOfMemoryError("CUDA out of memory")
        return {"mem_peak_mb": 20.0 + 10.0 * batch, "mem_reserved_peak_mb": 25.0 + 10.0 * batch}

    trial = StepTrial(steps, cuda=Cuda())
    best, trials = search(trial, limit=1000, report=lambda t: None)
    payload = {"preset": "tiny", "backend": "ddp", "world_size": 1, "device": "cuda", "largest_batch": best,
               "limit_mb": trial.limit_mb(), "trials": [t.__dict__ for t in trials]}  # fmt: skip
    fit = trials_fit(payload)
    assert fit["limit_mb"] == 200.0 and fit["batch"] == [1, 2, 4, 8, 12, 13] and fit["oom_batches"] == [16, 14]
    assert fit["fixed_mb"] == pytest.approx(20.0) and fit["per_sample_mb"] == pytest.approx(10.0)
    assert fit["largest_batch"] == 18 and fit["found_batch"] == 13  # 20 + 10 x 18 = 200
    png = write_png(payload, tmp_path / "trials.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    assert "keeps batch 18 within the limit" in capsys.readouterr().out


def test_an_error_other_than_out_of_memory_propagates():
    def steps(batch: int) -> dict:
        raise RuntimeError("NCCL error: unhandled system error")

    with pytest.raises(RuntimeError, match="NCCL error"):
        StepTrial(steps, cuda=Cuda())(4)
