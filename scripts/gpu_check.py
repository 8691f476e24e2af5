"""GPU checks of the code paths a CPU machine cannot exercise (run by scripts/gpu_check.sh).

What: on a CUDA machine, (1) the custom profiler synchronises and reports a non-zero
peak of allocated memory per region, and a larger region gets a larger peak; (2) the
torch profiler reports CUDA time inside a region; (3) the nvidia backend emits NVTX
ranges through torch and calls cudaProfilerStart/Stop without error; (4) the tiny pi05
policy trains one step and samples actions on the GPU; (5) a deepinv PnP step runs on
the GPU; (6) the policy's training run object (accelerate, fused AdamW, bf16 autocast)
steps on the GPU and reports per-region GPU memory, a table peak and MFU; (7) the policy's
inference run object compiles prefill and denoise with ``reduce-overhead`` (CUDA graphs)
and the first call is at least 5x a steady one; (8) with two GPUs, ``scopebench train``
on two ranks under DeepSpeed ZeRO-2 in bf16, and ``convert-checkpoint``; (9) one FSDP2 step
in bf16 on one GPU (fp32 ``DTensor`` shards, bf16 compute); (10) with two GPUs, ``scopebench
train`` under FSDP2 in bf16 on NCCL and ``convert-checkpoint`` of its DCP shards; (11) the host
sampler reads the GPU through NVML (``nvidia-ml-py``) during a window of matmuls:
utilisation, SM clock and its max, power, temperature, memory used, throttle reasons,
energy per step and other processes, each present or absent with NVML's reason, and the
GPU rules of the diagnosis read them; (12)
``profiler_memory``: categories against the allocator's peak, a memory snapshot, and an OOM
that writes its snapshot and names it; (13) ``find-max-batch`` on the GPU; (14) the ledger on
GPUs: the torch backend's per-region ledger columns from its own kernels, and ``scopebench
trace-ledger`` on a scheduled run's cycle folder (its figures add up and match HTA's). Each check prints one JSON line ``{"check": str, "ok": bool, ...}``; the exit
status is 1 if any check failed, 77 if CUDA is absent.

Run: ``bash scripts/gpu_check.sh`` (under five minutes on one GPU).
"""

from __future__ import annotations

import json
import sys
import traceback

import torch


def _report(name, fn):
    try:
        info = fn() or {}
        ok = bool(info.pop("ok", True))
    except Exception as err:  # one failing check must not hide the others
        info, ok = {"error": f"{type(err).__name__}: {err}", "trace": traceback.format_exc()[-1500:]}, False
    print(json.dumps({"check": name, "ok": ok, **info}), flush=True)
    return ok


def custom_memory():
    from scopebench.profiler import create_profiler

    prof = create_profiler("custom", "cuda", "gpu_check")
    with prof.track_step("small"):
        a = torch.randn(256, 256, device="cuda")
        _ = a @ a
    with prof.track_step("large"):
        b = torch.randn(4096, 4096, device="cuda")
        _ = b @ b
    prof.end_iteration()
    m = prof.get_current_metrics()
    ok = m["large_max_gpu_mb"] > m["small_max_gpu_mb"] > 0 and m["max_gpu_mb"] >= m["large_max_gpu_mb"]
    return {"ok": ok, "metrics": m}


def torch_cuda_time():
    from scopebench.profiler import create_profiler

    prof = create_profiler("torch", "cuda", "gpu_check")
    with prof.track_step("mm"):
        b = torch.randn(2048, 2048, device="cuda")
        for _ in range(10):
            b = torch.tanh(b @ b)
    prof.end_iteration()
    prof.finalize()
    m = prof.get_current_metrics()
    return {"ok": m["mm_cuda_sec"] > 0, "mm_cuda_sec": m["mm_cuda_sec"], "mm_cpu_sec": m["mm_cpu_sec"]}


def nvidia_markers():
    from scopebench.profiler import create_profiler

    prof = create_profiler("nvidia", "cuda", "gpu_check", warmup=1, active=2)
    calls = iter([True, True, True, True, False])
    for _ in prof.iterate(lambda: next(calls)):
        with prof.track_step("work"):
            torch.randn(512, 512, device="cuda").sum().item()
    prof.finalize()
    return {"ok": prof.markers.capture_active, "total_time_sec": prof.get_current_metrics().get("total_time_sec")}


def policy_step():
    from scopebench.policy import make_policy

    model = make_policy("tiny").cuda()
    cfg = model.config
    B = 2
    obs = {
        "images": torch.rand(B, cfg.num_cameras, 3, cfg.vision.image_size, cfg.vision.image_size, device="cuda"),
        "prompt_ids": torch.randint(0, cfg.vocab_size, (B, cfg.prompt_max_length), device="cuda"),
        "prompt_mask": torch.ones(B, cfg.prompt_max_length, dtype=torch.bool, device="cuda"),
        "state": torch.rand(B, cfg.state_dim, device="cuda") * 2 - 1,
        "actions": torch.rand(B, cfg.chunk_size, cfg.action_dim, device="cuda") * 2 - 1,
        "action_is_pad": torch.zeros(B, cfg.chunk_size, dtype=torch.bool, device="cuda"),
    }
    loss, _ = model(obs)
    loss.backward()
    with torch.no_grad():
        actions = model.sample_actions(obs, num_steps=4)
    return {
        "ok": bool(torch.isfinite(loss)) and tuple(actions.shape) == (B, cfg.chunk_size, cfg.action_dim),
        "loss": float(loss.detach()),
    }


def pnp_step():
    import deepinv as dinv

    x = torch.rand(1, 3, 64, 64, device="cuda")
    physics = dinv.physics.BlurFFT(img_size=(3, 64, 64), filter=dinv.physics.blur.gaussian_blur(1.0), device="cuda")
    y = physics(x)
    z = y - 0.5 * physics.A_adjoint(physics.A(y) - y)
    out = dinv.optim.prior.TVPrior().prox(z, gamma=0.05)
    return {"ok": bool(torch.isfinite(out).all()), "device": str(out.device)}


def _policy_data():
    import tempfile

    from scopebench.policy.settings import DatasetSettings

    settings = DatasetSettings(cache_dir=tempfile.mkdtemp(prefix="gpu_check_"))
    return settings, settings.materialize()


def policy_train_run():
    from scopebench.policy.run.train import PolicyTrainRun
    from scopebench.policy.settings import TrainSettings
    from scopebench.profiler import ProfilerConfig

    data, root = _policy_data()
    settings = TrainSettings(device="cuda", precision="bf16", fused_adamw=True)
    calls, metrics = [0], []

    def callback():
        if calls[0]:
            metrics.append(run.metrics())
        calls[0] += 1
        return calls[0] <= 4

    run = PolicyTrainRun(settings, dataset_root=root, chunk_size=data.chunk_size, profiler=ProfilerConfig(warmup=1))
    with run:
        run.loop(callback)
    m = metrics[-1]
    ok = (
        m["forward_max_gpu_mb"] > 0
        and m["max_gpu_mb_rank0"] > 0
        and str(m["peak_flops_source"]).startswith("table:")
        and 0 < (m["mfu"] or 0) < 1
        and run.work.optimizer.defaults["fused"] is True
    )
    keys = ("forward_time_sec", "bwd_time_sec", "max_gpu_mb", "mfu", "peak_flops_source", "samples_per_sec")
    return {"ok": ok, **{k: m.get(k) for k in keys}}


def policy_inference_compile():
    from scopebench.policy.run.inference import InferenceRun
    from scopebench.policy.settings import InferenceSettings

    data, root = _policy_data()
    settings = InferenceSettings(device="cuda", compile_mode="reduce-overhead", n_warmup=5, precision="bf16")
    with InferenceRun(settings, dataset_root=root, chunk_size=data.chunk_size) as run:
        steady = [run.timed_call() for _ in range(5)]
        info = run.compile_metrics()
    ok = info["first_call_ratio"] >= 5 and tuple(run.actions.shape)[0] == 1
    return {"ok": ok, **info, "steady_ms": sorted(steady)[2] * 1e3}


def policy_zero2_train():
    """Two ranks of ``scopebench train`` under DeepSpeed ZeRO-2 with bf16 on NCCL, then the
    shards consolidated: needs two GPUs (one rank per GPU)."""
    import subprocess
    import tempfile
    from pathlib import Path

    if torch.cuda.device_count() < 2:
        return {"ok": True, "skipped": f"needs 2 GPUs, {torch.cuda.device_count()} visible"}
    repo = Path(__file__).resolve().parents[1]
    out = Path(tempfile.mkdtemp(prefix="gpu_check_train_"))
    command = [sys.executable, "-m", "scopebench.cli", "train", "--config", str(repo / "configs/policy/tiny.yml")]
    command += ["--accelerate-config", str(repo / "configs/accelerate/deepspeed_zero2.yaml"), "--precision=bf16"]
    command += ["--output_dir", str(out), "--steps", "3", f"--dataset.cache_dir={out / 'data'}"]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=240)
    convert = subprocess.run(
        [sys.executable, "-m", "scopebench.cli", "convert-checkpoint", str(out)], capture_output=True, text=True
    )
    ok = proc.returncode == 0 and "backend=zero2" in proc.stdout and convert.returncode == 0
    return {"ok": ok, "log_tail": (proc.stdout + proc.stderr)[-800:], "convert": convert.stdout.strip()[-200:]}


def _fully_sharded_one_gpu(backend: str) -> dict:
    """One rank of ``Pi05Train``'s run under ``backend`` (fsdp2, hsdp) with bf16 on CUDA: the
    parameters are fp32 ``DTensor`` shards on the backend's mesh, the forward runs in bf16
    (MixedPrecisionPolicy), two steps train."""
    from torch.distributed.tensor import DTensor

    from scopebench.policy.run.train import PolicyTrainRun
    from scopebench.policy.settings import TrainSettings

    data, root = _policy_data()
    settings = TrainSettings(device="cuda", precision="bf16", backend=backend, find_unused_params=False)
    calls = [0]

    def callback():
        calls[0] += 1
        return calls[0] <= 2

    run = PolicyTrainRun(settings, dataset_root=root, chunk_size=data.chunk_size)
    with run:
        run.loop(callback)
        params = list(run.work.model.parameters())
        m = run.metrics()
        sharded = all(isinstance(p, DTensor) and p.dtype == torch.float32 for p in params)
        mesh = list(params[0].device_mesh.shape)
    ok = sharded and m["train_loss"] == m["train_loss"] and m["max_gpu_mb"] > 0
    return {"ok": ok, "train_loss": m["train_loss"], "max_gpu_mb": m["max_gpu_mb"], "units": len(run.fsdp_units),
            "mesh": mesh}  # fmt: skip


def policy_fsdp2_one_gpu():
    """FSDP2 on one GPU (:func:`_fully_sharded_one_gpu`)."""
    return _fully_sharded_one_gpu("fsdp2")


def policy_hsdp_one_gpu():
    """HSDP on one GPU: its 2-D mesh built on CUDA (``(1, 1)`` from the layout)."""
    result = _fully_sharded_one_gpu("hsdp")
    result["ok"] = result["ok"] and result["mesh"] == [1, 1]
    return result


def policy_fsdp2_train():
    """Two ranks of ``scopebench train`` under FSDP2 with bf16 on NCCL, then the DCP shards
    consolidated: needs two GPUs (reported as skipped with fewer)."""
    import subprocess
    import tempfile
    from pathlib import Path

    if torch.cuda.device_count() < 2:
        return {"ok": True, "skipped": f"needs 2 GPUs, {torch.cuda.device_count()} visible"}
    repo = Path(__file__).resolve().parents[1]
    out = Path(tempfile.mkdtemp(prefix="gpu_check_fsdp2_"))
    command = [sys.executable, "-m", "scopebench.cli", "train", "--config", str(repo / "configs/policy/tiny.yml")]
    command += ["--accelerate-config", str(repo / "configs/accelerate/fsdp2.yaml"), "--precision=bf16"]
    command += ["--output_dir", str(out), "--steps", "3", f"--dataset.cache_dir={out / 'data'}"]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=240)
    convert = subprocess.run(
        [sys.executable, "-m", "scopebench.cli", "convert-checkpoint", str(out)], capture_output=True, text=True
    )
    ok = proc.returncode == 0 and "backend=fsdp2" in proc.stdout and convert.returncode == 0
    return {"ok": ok, "log_tail": (proc.stdout + proc.stderr)[-800:], "convert": convert.stdout.strip()[-200:]}


def host_sampler_nvml():
    """The sampler's NVML paths for real: the GPU columns of a busy window (pynvml required)."""
    import pynvml  # noqa: F401  (nvidia-ml-py: the check fails, not skips, without it)

    from scopebench.profiler import create_profiler
    from scopebench.profiler.sampler import GPU_COLUMNS

    prof = create_profiler("custom", "cuda", "gpu_check")
    prof.keep_rows = True
    a = torch.randn(8192, 8192, device="cuda")
    calls = iter(range(7))
    for _ in prof.iterate(lambda: next(calls) < 6):
        with prof.track_step("mm"):
            first = prof.sampler.samples_taken
            while prof.sampler.samples_taken < first + 2:  # two sampler periods of GPU work
                _ = a @ a
                torch.cuda.synchronize()
    prof.finalize()
    rows = prof.rows[1:]  # the first iteration of a window may end before the first interval
    reasons = prof.sampler.reasons
    seen = {key for row in rows for key in row if key in GPU_COLUMNS}
    unexplained = sorted(set(GPU_COLUMNS) - seen - set(reasons))
    busy = [row["gpu_util_pct"] for row in rows if "gpu_util_pct" in row]
    ok = (
        not unexplained
        and bool(busy)
        and min(busy) > 0
        and all(0 <= r.get("host_other_cpu_pct", 0) <= 100 for r in rows)
    )
    ok = ok and all(row.get("gpu_energy_j", 1.0) > 0 and row.get("gpu_sm_clock_mhz", 1.0) > 0 for row in rows)
    return {
        "ok": ok,
        "last_row": {k: v for k, v in rows[-1].items() if k in GPU_COLUMNS or k.startswith("host_")},
        "absent_with_reason": {k: v for k, v in reasons.items() if k in GPU_COLUMNS or k == "gpu"},
        "absent_without_reason": unexplained,
    }


def policy_memory_by_category():
    """``profiler_memory`` on CUDA: categories add up to the allocator's peak, reserved >=
    allocated, a snapshot per rank at the end; then an OOM inside a region (a 10 TB tensor)
    writes the snapshot and is raised naming it and the last good step's breakdown."""
    import tempfile
    from pathlib import Path

    from scopebench.policy.run.train import PolicyTrainRun
    from scopebench.policy.settings import TrainSettings
    from scopebench.profiler import ProfilerConfig
    from scopebench.profiler.memory import CATEGORIES

    data, root = _policy_data()
    out = Path(tempfile.mkdtemp(prefix="gpu_check_memory_"))
    settings = TrainSettings(device="cuda", precision="bf16", find_unused_params=False)
    profiler = ProfilerConfig(mode="custom", warmup=1, memory=True)
    calls = [0]

    def callback():
        calls[0] += 1
        return calls[0] <= 3

    run = PolicyTrainRun(settings, dataset_root=root, chunk_size=data.chunk_size, profiler=profiler, output_dir=out)
    with run:
        run.loop(callback)
        m = run.metrics()
    snapshots = sorted(p.name for p in out.glob("*_memory_snapshot.pickle"))
    parts = sum(m[f"mem_{c}_mb"] for c in CATEGORIES)
    ok = abs(parts / m["mem_allocated_peak_mb"] - 1) < 0.05 and m["mem_reserved_peak_mb"] >= m["mem_allocated_peak_mb"]
    ok = ok and len(snapshots) == 1 and m["profiler_memory_overhead_sec"] > 0
    # An OOM inside the window: the snapshot is written before the error propagates.
    oom_out = Path(tempfile.mkdtemp(prefix="gpu_check_oom_"))
    from scopebench.profiler import create_profiler

    model = torch.nn.Linear(256, 256, device="cuda")
    prof = create_profiler("custom", "cuda", "oom", memory=True, output_dir=oom_out)
    prof.track_memory(model, torch.optim.AdamW(model.parameters()))
    message = ""
    try:
        for i in prof.iterate(lambda: True):
            with prof.track_step("forward"):
                model(torch.ones(8, 256, device="cuda")).sum().backward()
                if i == 1:
                    torch.empty(10**13, dtype=torch.uint8, device="cuda")
    except torch.OutOfMemoryError as err:
        message = str(err)
    oom_ok = "memory snapshot:" in message and "last good step's peak by category" in message
    oom_ok = oom_ok and len(list(oom_out.glob("*_memory_snapshot.pickle"))) == 1
    keys = ("mem_peak_mb", "mem_other_mb", "mem_allocated_peak_mb", "mem_reserved_peak_mb", "mem_fragmentation_pct")
    return {"ok": ok and oom_ok, "categories_mb": parts, **{k: m.get(k) for k in keys}, "oom": message[:300]}


def find_max_batch_cuda():
    """``scopebench find-max-batch`` on the GPU: real trials (doubling, bisecting), every one
    freed before the next; with a 0.05 GB budget the answer fits and its double does not."""
    import subprocess
    import tempfile
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    out = Path(tempfile.mkdtemp(prefix="gpu_check_max_batch_"))
    command = [
        sys.executable,
        "-m",
        "scopebench.cli",
        "find-max-batch",
        "--config",
        str(repo / "configs/policy/tiny.yml"),
    ]
    command += ["--device=cuda", "--memory-gb", "0.05", "--json", str(out / "max_batch.json")]
    proc = subprocess.run(
        [*command, f"--dataset.cache_dir={out / 'data'}"], capture_output=True, text=True, timeout=240
    )
    report = json.loads((out / "max_batch.json").read_text()) if proc.returncode == 0 else {}
    trials = {t["batch"]: t for t in report.get("trials", [])}
    best = report.get("largest_batch", 0)
    double = trials.get(2 * best)
    ok = best >= 1 and trials[best]["fits"] and (double is None or not double["fits"])
    return {"ok": ok, "largest_batch": best, "margin_mb": report.get("margin_mb"), "log_tail": proc.stdout[-600:]}


def _bench_inference_cuda(out, *extra: str) -> dict:
    """``scopebench bench-inference`` on the GPU with ``extra`` flags: its JSON ({} on failure)."""
    import subprocess
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    command = [
        sys.executable,
        "-m",
        "scopebench.cli",
        "bench-inference",
        "--config",
        str(repo / "configs/policy/tiny.yml"),
    ]
    command += ["--device=cuda", f"--dataset.cache_dir={out / 'data'}", "--n-warmup", "2", "--n-timed", "20"]
    command += ["--output-dir", str(out), "--json", str(out / "bench.json"), *extra]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=240)
    if proc.returncode != 0:
        return {"error": proc.stderr[-600:]}
    return json.loads((out / "bench.json").read_text())


def inference_control_rate_cuda():
    """The control-rate path on CUDA (issue 36): figures, figure PNG, cold start, and a stateful
    policy's episodes, from ``bench-inference`` on the GPU."""
    import tempfile
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    out = Path(tempfile.mkdtemp(prefix="gpu_check_control_"))
    pi05 = _bench_inference_cuda(out, "--control-hz", "30", "--n-action-steps", "4")
    control, cold = pi05.get("control") or {}, pi05.get("cold_start") or {}
    stateful = _bench_inference_cuda(
        out, "--policy", f"{repo / 'examples/stateful_policy.py'}:make_policy", "--episode-length", "5"
    )
    episodes = stateful.get("episodes") or {}
    ok = (
        control.get("calls") == 20
        and Path(pi05.get("control_figure") or "/nonexistent").is_file()
        and (cold.get("first_action_sec") or 0) > 0
        and not str(pi05.get("environment", {}).get("device", "cpu")).startswith("cpu")
        and episodes.get("episodes") == 4
    )
    return {
        "ok": ok,
        "verdict": control.get("verdict"),
        "p50_ms": (pi05.get("summary") or {}).get("p50", 0) * 1e3,
        "process_to_first_action_sec": cold.get("process_to_first_action_sec"),
        "stateful_last_over_first": episodes.get("last_over_first"),
        "errors": [r["error"] for r in (pi05, stateful) if "error" in r],
    }


def _ledger_body(prof, dist):
    """One iteration: matmuls in region ``mm``, then an all-reduce beside a tanh in ``reduce``."""
    a = torch.randn(2048, 2048, device="cuda")
    grads = torch.randn(1 << 22, device="cuda")
    with prof.track_step("mm"):
        for _ in range(5):
            a = torch.tanh(a @ a)
    with prof.track_step("reduce"):
        work = dist.all_reduce(grads, async_op=True)
        a = torch.tanh(a @ a)
        work.wait()


def device_ledger_cuda():
    """The ledger on GPUs (issue 45) on one rank of a one-rank NCCL group: (1) the torch backend in
    per-step mode gives each region's ``_compute_sec`` and ``_comm_*_sec`` from its own kernels; (2)
    ``scopebench trace-ledger`` on a scheduled run's cycle folder: the window's figures add up, the
    last step is dropped, and they match HTA's (``traceinsight``, ns rounding off) within 1 %."""
    import subprocess
    import tempfile
    from pathlib import Path

    import torch.distributed as dist

    from scopebench.profiler import create_profiler

    out = Path(tempfile.mkdtemp(prefix="gpu_check_ledger_"))
    dist.init_process_group("nccl", init_method=f"file://{out / 'store'}", rank=0, world_size=1)
    try:
        per_step = create_profiler("torch", "cuda", "gpu_check")
        calls = iter([True, True, True, False])
        for _ in per_step.iterate(lambda: next(calls)):
            _ledger_body(per_step, dist)
        per_step.finalize()
        m = per_step.get_current_metrics()
        scheduled = create_profiler("torch", "cuda", "gpu_check", active=4, per_step=False, trace_dir=out / "traces")
        calls = iter([True] * 4 + [False])
        for _ in scheduled.iterate(lambda: next(calls)):
            _ledger_body(scheduled, dist)
        scheduled.finalize()
    finally:
        dist.destroy_process_group()
    columns = {
        k: v
        for k, v in m.items()
        if k.endswith(("_compute_sec", "_comm_wait_peer_sec", "_comm_transfer_sec", "_comm_hidden_sec"))
    }
    ok = m.get("mm_compute_sec", 0) > 0 and m.get("reduce_compute_sec", 0) > 0
    ok = ok and m.get("mm_comm_transfer_sec") == 0 and m.get("reduce_comm_wait_peer_sec") == 0
    (cycle,) = list((out / "traces").glob("*/cycle0"))
    command = [sys.executable, "-m", "scopebench.cli", "trace-ledger", str(cycle), "--json", str(out / "ledger.json")]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=120)
    report = json.loads((out / "ledger.json").read_text()) if proc.returncode == 0 else {}
    rank = report.get("ranks", {}).get("0", {})
    w = rank.get("window") or {}
    eps = 1e-3  # ms
    adds_up = bool(w) and (
        0 <= w["idle_ms"] <= w["span_ms"]
        and w["compute_ms"] <= w["span_ms"] - w["idle_ms"] + eps
        and w["comm_hidden_ms"] <= min(w["comm_ms"], w["compute_ms"]) + eps
        and abs(w["comm_exposed_ms"] - (w["comm_ms"] - w["comm_hidden_ms"])) < eps
        and (w["idle_host_ms"] is None or abs(w["idle_host_ms"] + w["idle_launch_ms"] - w["idle_ms"]) < eps)
        and [s["step"] for s in rank["steps"]] == [0, 1, 2]
        and sum(s["compute_ms"] for s in rank["steps"]) <= w["compute_ms"] + eps
    )
    hta = {}
    try:
        import logging

        from hta.configs.env_options import HTAEnvOptions
        from hta.trace_analysis import TraceAnalysis

        logging.disable(logging.WARNING)
        HTAEnvOptions.instance().set_disable_ns_rounding(True)
        (t,) = TraceAnalysis(trace_dir=str(cycle)).get_temporal_breakdown(visualize=False).to_dict("records")
        hta = {
            "span_ms": t["kernel_time(us)"] / 1e3,
            "idle_ms": t["idle_time(us)"] / 1e3,
            "compute_ms": t["compute_time(us)"] / 1e3,
        }
    except ImportError as err:
        hta = {"skipped": f"HTA not installed ({err})"}
    except Exception as err:  # HTA's own failure is this check's failure, reported with the rest
        hta = {"error": f"{type(err).__name__}: {err}"}
    agrees = "skipped" in hta or ("error" not in hta and all(abs(w[k] - v) <= 0.01 * v + eps for k, v in hta.items()))
    return {
        "ok": ok and adds_up and agrees,
        "per_step_columns": columns,
        "window": w,
        "hta": hta,
        "adds_up": adds_up,
        "hta_agrees": agrees,
        "log_tail": (proc.stdout + proc.stderr)[-600:],
    }


def main() -> int:
    if not torch.cuda.is_available():
        print(json.dumps({"check": "cuda", "ok": False, "error": "CUDA is not available"}))
        return 77
    print(
        json.dumps({"check": "device", "ok": True, "name": torch.cuda.get_device_name(0), "torch": torch.__version__}),
        flush=True,
    )
    checks = [
        custom_memory,
        torch_cuda_time,
        nvidia_markers,
        policy_step,
        pnp_step,
        policy_train_run,
        policy_inference_compile,
        policy_zero2_train,
        policy_fsdp2_one_gpu,
        policy_hsdp_one_gpu,
        policy_fsdp2_train,
        host_sampler_nvml,
        policy_memory_by_category,
        find_max_batch_cuda,
        inference_control_rate_cuda,
        device_ledger_cuda,
    ]
    results = [_report(fn.__name__, fn) for fn in checks]
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
