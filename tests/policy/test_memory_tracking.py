"""``profiler_memory``: memory by category per region, checked against the CPU allocator's own
count, the analytic sizes of each backend's sharding and the estimate before launch.

One 2-rank launch of :mod:`memory_driver` (tiny, every backend; DDP at four batch sizes) serves
the multi-rank assertions; one-process runs go through the same ``measure`` in this process.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from scopebench.profiler import ProfilerConfig
from scopebench.profiler.device import MB
from scopebench.profiler.memory import CATEGORIES, MemoryTracking
from scopebench.stats import r_squared
from scopebench.train.backends import model_state_bytes

from .memory_driver import measure

DRIVER = Path(__file__).with_name("memory_driver.py")
BACKENDS = ("ddp", "zero1", "zero2", "zero3", "fsdp2")
BATCHES = (2, 4, 6, 8)


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory, robot_data):
    """Per rank: ``{"<backend>/<batch>": facts}`` of the driver on two gloo ranks."""
    out = tmp_path_factory.mktemp("memory")
    runs = ",".join(BACKENDS)
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(DRIVER)]
        + [str(out), robot_data[0].cache_dir, "tiny", runs, "4", "3", "ddp:2,6,8"],
        capture_output=True,
        text=True,
        timeout=900,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    return [json.loads((out / f"memory_rank{r}.json").read_text()) for r in (0, 1)]


@pytest.fixture(scope="module")
def one_process(robot_data):
    """``{"<preset>/<batch>": facts}`` of DDP in this process (no wrapper with one rank)."""
    torch.set_num_threads(1)
    seen = {f"tiny/{b}": measure("tiny", "ddp", b, robot_data[0].cache_dir, 3) for b in BATCHES}
    return seen


def _peak_error(facts: dict) -> float:
    """Categories at the step's peak against the allocator: bytes held at the start plus the
    peak of the bytes the CPU allocator handed out during the iteration."""
    tracked = facts["local"]["mem_peak_mb"] * MB
    measured = facts["start_bytes"] + facts["allocated_peak_bytes"]
    return abs(tracked / measured - 1)


def _analytic(facts: dict, backend: str) -> dict[str, float]:
    return model_state_bytes(facts["num_params"], backend=backend, world_size=facts["world_size"])


def _check_states(facts: dict, backend: str, keys=None) -> None:
    keys = keys or ("parameters", "optimizer_state", "gradients")
    local, want = facts["local"], _analytic(facts, backend)
    # Parameters and optimizer state live the whole step; every gradient exists once the backward
    # ended (``unscale_clip``; ZeRO-3's step adds a flat fp32 copy), except under ZeRO-2, which
    # still holds pieces of its bucket then and steps on its flat partition (``optim_step``).
    region = "optim_step" if backend == "zero2" else "unscale_clip"
    got = {
        "parameters": local["mem_parameters_mb"] * MB,
        "optimizer_state": local["mem_optimizer_state_mb"] * MB,
        "gradients": local[f"{region}_mem_gradients_mb"] * MB,
    }
    for key in keys:
        value = got[key]
        assert value == pytest.approx(want[key], rel=0.02), (backend, key, value, want[key])


def _check_categories(facts: dict) -> None:
    local = facts["local"]
    parts = sum(local[f"mem_{c}_mb"] for c in CATEGORIES)
    assert parts == pytest.approx(local["mem_peak_mb"], rel=1e-9)
    assert _peak_error(facts) <= 0.05, (local, facts["start_bytes"], facts["allocated_peak_bytes"])


def test_one_process_categories_add_up_and_match_the_analytic_sizes(one_process):
    for facts in one_process.values():
        _check_categories(facts)
        _check_states(facts, "ddp")
        assert facts["local"]["mem_gather_buffers_mb"] == 0.0  # one rank: no DDP wrapper, no bucket
        assert facts["local"]["profiler_memory_overhead_sec"] > 0


def test_one_process_activations_grow_linearly_with_the_batch(one_process):
    values = [one_process[f"tiny/{b}"]["local"]["mem_activations_mb"] for b in BATCHES]
    assert values == sorted(values) and r_squared(BATCHES, values) >= 0.98, values


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_two_ranks_categories_add_up_and_match_the_analytic_sizes(two_ranks, backend):
    for rank_facts in two_ranks:
        facts = rank_facts[f"{backend}/4"]
        assert facts["world_size"] == 2
        _check_categories(facts)
        # ZeRO-1 holds every gradient only at the backward's end, before it reduces them to their
        # owner (no region's peak samples that moment); afterwards it keeps its partition alone.
        _check_states(facts, backend, ("parameters", "optimizer_state") if backend == "zero1" else None)


@pytest.mark.slow
def test_two_ranks_attribute_each_backends_communication_buffers(two_ranks):
    facts = {b: two_ranks[0][f"{b}/4"]["local"] for b in BACKENDS}
    params_mb = two_ranks[0]["ddp/4"]["num_params"] * 4 / MB
    assert facts["ddp"]["mem_gather_buffers_mb"] == pytest.approx(params_mb, rel=0.02)  # DDP's bucket
    assert facts["zero2"]["mem_gather_buffers_mb"] == pytest.approx(5e8 * 4 / MB, rel=0.01)  # reduce bucket
    assert facts["zero3"]["mem_gather_buffers_mb"] > facts["zero2"]["mem_gather_buffers_mb"]  # + gathered params
    assert 0 < facts["fsdp2"]["mem_gather_buffers_mb"] < params_mb


@pytest.mark.slow
def test_two_ranks_activations_grow_linearly_with_the_batch(two_ranks):
    for rank_facts in two_ranks:
        values = [rank_facts[f"ddp/{b}"]["local"]["mem_activations_mb"] for b in BATCHES]
        assert r_squared(BATCHES, values) >= 0.98, values


@pytest.mark.slow
@pytest.mark.parametrize(
    ("backend", "tolerance"), [("ddp", 0.10), ("fsdp2", 0.15), ("zero1", 0.15), ("zero2", 0.15), ("zero3", 0.15)]
)
def test_the_estimate_is_within_its_tolerance_of_the_measured_peak(two_ranks, backend, tolerance):
    """The whole peak, within what the estimate leaves out: one operation's temporaries, which
    on ``tiny`` under FSDP2 are 9 % of the peak (0.56 of 6.0 MiB; a CI run measured 70 KiB more
    at the peak than runs here, 10.04 % over the estimate). Under DDP and FSDP2, whose tracker
    files no bucket as a temporary, the rest of the peak is the estimate's to 3 %."""
    for rank_facts in two_ranks:
        facts = rank_facts[f"{backend}/4"]
        local, estimate = facts["local"], facts["estimate"]["peak"]
        measured = local["mem_peak_mb"] * MB
        assert abs(estimate / measured - 1) <= tolerance, (facts["estimate"], local)
        if backend in ("ddp", "fsdp2"):
            modelled = measured - local["mem_temporaries_mb"] * MB
            assert abs(estimate / modelled - 1) <= 0.03, (facts["estimate"], local)


@pytest.mark.slow
def test_rank_zero_reports_the_worst_rank(two_ranks):
    reduced = two_ranks[0]["fsdp2/4"]["reduced"]
    peaks = [rank_facts["fsdp2/4"]["local"]["mem_peak_mb"] for rank_facts in two_ranks]
    assert reduced["mem_peak_mb"] == max(peaks) and reduced["mem_worst_rank"] == peaks.index(max(peaks))
    assert [reduced["mem_peak_mb_rank0"], reduced["mem_peak_mb_rank1"]] == peaks
    for rank, rank_facts in enumerate(two_ranks):  # each rank's breakdown, for the report's bars per rank
        local = rank_facts["fsdp2/4"]["local"]
        assert [reduced[f"mem_{c}_mb_rank{rank}"] for c in CATEGORIES] == [local[f"mem_{c}_mb"] for c in CATEGORIES]
    assert reduced["mem_rank_imbalance_pct"] == pytest.approx((max(peaks) - min(peaks)) / max(peaks) * 100)


@pytest.fixture(scope="module")
def small(robot_data):
    return measure("small", "ddp", 2, robot_data[0].cache_dir, 3)


@pytest.mark.slow
def test_small_in_one_process_adds_up_matches_and_is_estimated_within_ten_percent(small):
    # At batch 2 the step's peak is in the optimizer step: AdamW's intermediates are temporaries.
    _check_categories(small)
    _check_states(small, "ddp")
    measured = small["local"]["mem_peak_mb"] * MB
    assert abs(small["estimate"]["peak"] / measured - 1) <= 0.10, (small["estimate"], small["local"])


def test_memory_off_adds_no_column_and_no_tracker(robot_data):
    from scopebench.policy.run.train import PolicyTrainRun
    from scopebench.policy.settings import load_run_config
    from scopebench.policy.tools import StepCounter

    from .conftest import TINY

    config = load_run_config(TINY, [("find_unused_params", False), ("dataset.cache_dir", robot_data[0].cache_dir)])
    run = PolicyTrainRun(config.train, dataset_root=robot_data[1], chunk_size=config.dataset.chunk_size)
    with run:
        run.loop(StepCounter(2))
        assert run.profiler._memory is None
        assert not [k for k in run.metrics() if "mem_" in k and "max_gpu" not in k]


def test_profiler_memory_is_validated():
    assert ProfilerConfig.from_params(profiler_memory=True).memory is True
    with pytest.raises(ValueError, match="profiler_memory must be"):
        ProfilerConfig(memory="yes")
    with pytest.raises(ValueError, match="profiler_memory=true needs a recording profiler_mode"):
        ProfilerConfig(mode=None, memory=True)


def test_the_zero_defaults_are_deepspeeds():
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    from scopebench.train.backends import ZERO_DEFAULTS

    config = DeepSpeedZeroConfig()
    assert ZERO_DEFAULTS == {
        "reduce_bucket_size": config.reduce_bucket_size,
        "allgather_bucket_size": config.allgather_bucket_size,
        "stage3_prefetch_bucket_size": config.prefetch_bucket_size,
        "stage3_param_persistence_threshold": config.param_persistence_threshold,
        "stage3_max_live_parameters": config.max_live_parameters,
        "stage3_max_reuse_distance": config.max_reuse_distance,
    }


class CudaRecorder:
    """``torch.cuda`` as the tracking reads it: peaks set by the test, every call recorded."""

    def __init__(self, allocated: float, reserved: float) -> None:
        self.allocated, self.reserved = allocated, reserved
        self.calls: list[str] = []
        self.memory = self

    def synchronize(self, device) -> None:
        self.calls.append("synchronize")

    def reset_peak_memory_stats(self, device) -> None:
        self.calls.append("reset_peak_memory_stats")

    def max_memory_allocated(self, device) -> float:
        return self.allocated

    def max_memory_reserved(self, device) -> float:
        return self.reserved

    def memory_stats(self, device) -> dict:
        return {"num_alloc_retries": 3, "num_ooms": 1}

    def _record_memory_history(self, enabled="all", max_entries=0) -> None:
        self.calls.append(f"record:{enabled}")

    def _dump_snapshot(self, path) -> None:
        self.calls.append(f"dump:{Path(path).name}")
        Path(path).write_bytes(b"snapshot")


def _cuda_tracking(tmp_path, allocated: float, reserved: float):
    model = torch.nn.Linear(256, 256)
    optimizer = torch.optim.AdamW(model.parameters())
    cuda = CudaRecorder(allocated, reserved)
    tracking = MemoryTracking("cpu", model, optimizer, cuda=cuda, run_name=lambda: (tmp_path, "run_rank0"))
    return model, optimizer, cuda, tracking


def test_on_cuda_the_allocator_peaks_fill_other_and_fragmentation(tmp_path):
    model, optimizer, cuda, tracking = _cuda_tracking(tmp_path, allocated=10 * MB, reserved=15 * MB)
    tracking.start_iteration()
    tracking.enter_region("forward")
    model(torch.ones(8, 256)).sum().backward()
    tracking.exit_region("forward")
    metrics = tracking.iteration_metrics()
    tracked = sum(metrics[f"forward_mem_{c}_mb"] for c in CATEGORIES if c != "other")
    assert metrics["forward_mem_other_mb"] == pytest.approx(10 - tracked)  # what no tracker attributes
    assert metrics["forward_mem_peak_mb"] == pytest.approx(10.0) == metrics["mem_allocated_peak_mb"]
    assert metrics["forward_mem_reserved_peak_mb"] == 15.0
    assert metrics["mem_fragmentation_pct"] == pytest.approx(50.0)
    assert (metrics["num_alloc_retries"], metrics["num_ooms"]) == (3, 1)
    assert cuda.calls[:3] == ["record:all", "synchronize", "reset_peak_memory_stats"]
    assert [p.name for p in tracking.close()] == ["run_rank0_memory_snapshot.pickle"]
    assert cuda.calls[-2:] == ["dump:run_rank0_memory_snapshot.pickle", "record:None"]


def test_an_oom_writes_the_snapshot_and_names_it_with_the_last_good_step(tmp_path):
    from scopebench.profiler import create_profiler

    model, optimizer, cuda, _ = _cuda_tracking(tmp_path, allocated=1 * MB, reserved=1 * MB)
    prof = create_profiler("custom", memory=True, output_dir=tmp_path, name="oom")
    prof.ops.cuda_module = lambda: cuda  # the device is a CPU: the recorder stands in for torch.cuda
    prof.track_memory(model, optimizer)
    steps = iter([True, True, False])
    with pytest.raises(torch.OutOfMemoryError) as caught:
        for i in prof.iterate(lambda: next(steps)):
            with prof.track_step("forward"):
                model(torch.ones(4, 256)).sum().backward()
                if i == 1:
                    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    message = str(caught.value)
    snapshot = next(tmp_path.glob("oom_*_memory_snapshot.pickle"))
    assert f"memory snapshot: {snapshot}" in message and "out of memory in region 'forward'" in message
    assert "last good step's peak by category: parameters 0.3 MB" in message and "torch said: CUDA out" in message
    assert isinstance(caught.value.__cause__, torch.OutOfMemoryError)
    assert "record:None" in cuda.calls  # history stopped after the dump
