"""The five policy tools on tiny: text layout, JSON (validated against schemas defined here),
environment variables, progress bars only on a terminal, ranks."""

from __future__ import annotations

import io
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import jsonschema
import numpy as np
import pytest

from scopebench.cli import main

REPO = Path(__file__).resolve().parents[2]
TINY = str(REPO / "configs" / "policy" / "tiny.yml")

NUM = {"type": "number"}
NUM_LIST = {"type": "array", "items": NUM, "minItems": 1}
STATS = {
    "type": "object",
    "properties": {"mean_sec": NUM, "median_sec": NUM, "p95_sec": NUM},
    "required": ["mean_sec", "median_sec", "p95_sec"],
}
PHASE = {**STATS, "properties": {**STATS["properties"], "share": NUM}, "required": STATS["required"] + ["share"]}
ENVIRONMENT = {
    "type": "object",
    "required": ["host", "device", "python", "torch", "accelerate", "cpu_count", "torch_threads"],
}
TRAIN_PHASE_NAMES = ["dataload_wait", "forward", "bwd", "unscale_clip", "optim_step", "zero_grad_sched", "sync_gather"]

PROFILE_STEP_SCHEMA = {
    "type": "object",
    "required": [
        "tool",
        "config",
        "settings",
        "warmup",
        "measured",
        "world_size",
        "batch_size",
        "num_workers",
        "prefetch_factor",
        "wall_clock_sec",
        "setup_time_sec",
        "phases",
        "throughput",
        "memory",
        "mfu",
        "per_rank",
        "samples",
        "environment",
    ],
    "properties": {
        "tool": {"const": "profile-step"},
        "measured": {"type": "integer", "minimum": 1},
        "world_size": {"type": "integer", "minimum": 1},
        "phases": {
            "type": "object",
            "properties": {name: PHASE for name in TRAIN_PHASE_NAMES + ["backward_step", "total"]},
            "required": TRAIN_PHASE_NAMES + ["backward_step", "total"],
        },
        "throughput": {
            "type": "object",
            "properties": {"steps_per_sec": NUM, "global_samples_per_sec": NUM},
            "required": ["steps_per_sec", "global_samples_per_sec"],
        },
        "memory": {
            "type": "object",
            "required": ["max_rss_mb", "max_gpu_mb", "per_rank"],
            "properties": {
                "per_rank": {
                    "type": "array",
                    "items": {"type": "object", "required": ["rank", "max_rss_mb", "max_gpu_mb"]},
                }
            },
        },
        "mfu": {
            "type": "object",
            "required": ["mfu", "achieved_flops_per_sec", "peak_flops_per_sec", "peak_flops_source"],
            "properties": {"mfu": {"type": ["number", "null"]}, "peak_flops_source": {"type": ["string", "null"]}},
        },
        "per_rank": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["rank", "step_time_sec", "samples"],
                "properties": {
                    "step_time_sec": STATS,
                    "samples": {
                        "type": "object",
                        "properties": {
                            "step_time_sec": NUM_LIST,
                            **{f"{p}_time_sec": NUM_LIST for p in TRAIN_PHASE_NAMES},
                        },
                        "required": ["step_time_sec"] + [f"{p}_time_sec" for p in TRAIN_PHASE_NAMES],
                    },
                },
            },
        },
        "samples": {"type": "object", "additionalProperties": NUM_LIST},
        "environment": ENVIRONMENT,
    },
}
PROFILE_DATALOADER_SCHEMA = {
    "type": "object",
    "required": [
        "tool",
        "config",
        "settings",
        "warmup",
        "measured",
        "world_size",
        "batch_size",
        "num_workers",
        "prefetch_factor",
        "wall_clock_sec",
        "per_rank",
        "batches_per_sec",
        "cluster_samples_per_sec",
        "environment",
    ],
    "properties": {
        "tool": {"const": "profile-dataloader"},
        "per_rank": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["rank", "fetch", "h2d", "batches_per_sec", "samples"],
                "properties": {
                    "fetch": STATS,
                    "h2d": STATS,
                    "batches_per_sec": NUM,
                    "samples": {
                        "type": "object",
                        "properties": {"fetch_time_sec": NUM_LIST, "h2d_time_sec": NUM_LIST},
                        "required": ["fetch_time_sec", "h2d_time_sec"],
                    },
                },
            },
        },
        "batches_per_sec": {"type": "object", "required": ["min", "mean", "max"], "additionalProperties": NUM},
        "cluster_samples_per_sec": NUM,
        "environment": ENVIRONMENT,
    },
}
ENTRY = {
    "type": "object",
    "required": ["name", "module", "shape", "numel"],
    "properties": {"shape": {"type": "array", "items": {"type": "integer"}}, "numel": {"type": "integer"}},
}
FIND_UNUSED_SCHEMA = {
    "type": "object",
    "required": [
        "tool",
        "config",
        "settings",
        "include_zero_grad",
        "unused",
        "frozen",
        "zero_grad",
        "used_count",
        "counts",
        "safe_without_find_unused",
    ],
    "properties": {
        "tool": {"const": "find-unused-params"},
        "unused": {"type": "array", "items": ENTRY},
        "frozen": {"type": "array", "items": ENTRY},
        "zero_grad": {"type": "array", "items": ENTRY},
        "used_count": {"type": "integer"},
        "safe_without_find_unused": {"type": "boolean"},
    },
}
BENCH_INFERENCE_SCHEMA = {
    "type": "object",
    "required": [
        "tool",
        "config",
        "settings",
        "policy",
        "compile_mode",
        "num_params",
        "n_warmup",
        "n_timed",
        "warmup_sec",
        "samples_sec",
        "summary",
        "phases",
        "compile_time_sec",
        "first_call_ratio",
        "peak_memory",
        "environment",
    ],
    "properties": {
        "tool": {"const": "bench-inference"},
        "warmup_sec": {"type": "array", "items": NUM},
        "samples_sec": NUM_LIST,
        "summary": {
            "type": "object",
            "required": ["mean", "std", "p50", "p95", "p99", "min", "max"],
            "additionalProperties": NUM,
        },
        "phases": {
            "type": "object",
            "required": ["preprocess", "prefill", "denoise", "postprocess"],
            "additionalProperties": STATS,
        },
        "compile_time_sec": {"type": ["number", "null"]},
        "first_call_ratio": {"type": ["number", "null"]},
        "peak_memory": {"type": "object", "required": ["max_rss_mb", "max_gpu_mb"], "additionalProperties": NUM},
        "environment": {
            **ENVIRONMENT,
            "required": ENVIRONMENT["required"] + ["cuda_driver", "cuda_runtime", "cudnn", "scopebench"],
        },
    },
}
DECOMPOSE_SCHEMA = {
    "type": "object",
    "required": [
        "tool",
        "config",
        "settings",
        "num_steps",
        "repeats",
        "latency_sec",
        "median_sec",
        "p95_sec",
        "denoise_sec",
        "fixed_sec",
        "per_step_sec",
        "r2",
        "r2_all_calls",
        "fit_applies",
        "fit_reason",
        "trend_z",
        "trend_p",
        "expert_share",
        "denoise_share",
        "environment",
    ],
    "properties": {
        "tool": {"const": "decompose-latency"},
        "num_steps": {"type": "array", "items": {"type": "integer"}, "minItems": 2},
        "latency_sec": {"type": "object", "additionalProperties": NUM_LIST},
        "median_sec": {"type": "object", "additionalProperties": NUM},
        "fixed_sec": NUM,
        "per_step_sec": NUM,
        "r2": NUM,
        "fit_applies": {"type": "boolean"},
        "fit_reason": {"type": ["string", "null"]},
        "trend_z": NUM,
        "trend_p": {"type": "number", "minimum": 0, "maximum": 1},
        # a share only where the fit applies (a latency that does not grow has none)
        "expert_share": {"type": ["number", "null"], "minimum": 0, "maximum": 1},
    },
    "if": {"properties": {"fit_applies": {"const": False}}},
    "then": {"properties": {"expert_share": {"type": "null"}, "fit_reason": {"type": "string"}}},
    "else": {"properties": {"expert_share": {"type": "number"}, "fit_reason": {"type": "null"}}},
}


def run_tool(args, capsys):
    code = main(args)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_profile_step_layout_json_and_environment_variables(data_args, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PROFILE_STEPS", "4")
    monkeypatch.setenv("PROFILE_NO_OPTIM", "1")
    monkeypatch.setenv("PROFILE_STEP_JSON", str(tmp_path / "env.json"))
    code, out, err = run_tool(["profile-step", *data_args, "--warmup", "1", "--batch_size", "2"], capsys)
    assert code == 0, err
    report = json.loads((tmp_path / "env.json").read_text())
    jsonschema.validate(report, PROFILE_STEP_SCHEMA)
    assert report["measured"] == 4 and report["warmup"] == 1 and report["batch_size"] == 2
    assert report["settings"]["no_optim"] is True
    assert report["phases"]["optim_step"]["mean_sec"] < report["phases"]["forward"]["mean_sec"]
    lines = out.splitlines()
    assert lines[1] == "warmup=1 measured=4 ranks=1" and lines[2].startswith("batch_size=2 num_workers=0")
    assert lines[3].startswith("wall-clock over full loop: ")
    names = [line.split()[0] for line in lines[7:16]]
    assert names == TRAIN_PHASE_NAMES[:-1] + ["backward_step", "sync_gather", "total"]
    assert all(" mean=" in line and " median=" in line and " p95=" in line for line in lines[7:16])
    assert any(line.startswith("throughput: ") and "global samples/s" in line for line in lines)
    assert any(line.startswith("mfu: ") for line in lines) and any(line.startswith("peak memory: ") for line in lines)
    assert err == ""  # no progress bar when stderr is not a terminal
    # flags win over the environment
    code, _, _ = run_tool(
        ["profile-step", *data_args, "--warmup", "0", "--steps", "2", "--json", str(tmp_path / "f.json")], capsys
    )
    assert code == 0 and json.loads((tmp_path / "f.json").read_text())["measured"] == 2


def test_profile_dataloader(data_args, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PROFILE_BATCHES", "5")
    code, out, err = run_tool(
        ["profile-dataloader", *data_args, "--warmup", "1", "--json", str(tmp_path / "d.json")], capsys
    )
    assert code == 0, err
    report = json.loads((tmp_path / "d.json").read_text())
    jsonschema.validate(report, PROFILE_DATALOADER_SCHEMA)
    assert report["measured"] == 5 and len(report["per_rank"][0]["samples"]["fetch_time_sec"]) == 5
    assert out.startswith("[rank 0/1] fetch=mean=") and "cluster-wide samples/s (ceiling, no model): " in out
    b = report["batches_per_sec"]
    assert b["min"] <= b["mean"] <= b["max"] and report["cluster_samples_per_sec"] == pytest.approx(4 * b["mean"])


def test_find_unused_params_names_the_discrete_head_only_when_its_weight_is_zero(data_args, tmp_path, capsys):
    code, out, _ = run_tool(["find-unused-params", *data_args, "--json", str(tmp_path / "u.json")], capsys)
    report = json.loads((tmp_path / "u.json").read_text())
    jsonschema.validate(report, FIND_UNUSED_SCHEMA)
    assert code == 0 and report["unused"] == [] and report["safe_without_find_unused"]
    assert "UNUSED is empty: DDP can run with find_unused_parameters=False" in out
    code, out, _ = run_tool(
        ["find-unused-params", *data_args, "--ce_weight=0", "--json", str(tmp_path / "z.json")], capsys
    )
    report = json.loads((tmp_path / "z.json").read_text())
    jsonschema.validate(report, FIND_UNUSED_SCHEMA)
    unused = {entry["name"] for entry in report["unused"]}
    assert {"discrete_head.weight", "discrete_head.bias"} <= unused and not report["safe_without_find_unused"]
    assert "  [discrete_head]  (2 tensors, " in out


def test_find_unused_params_include_zero_grad(data_args, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("INCLUDE_ZERO_GRAD", "true")
    code, out, _ = run_tool(["find-unused-params", *data_args, "--json", str(tmp_path / "u.json")], capsys)
    report = json.loads((tmp_path / "u.json").read_text())
    # zero-initialised gates give the expert's projections all-zero gradients at init
    assert code == 0 and report["include_zero_grad"] and any(".expert." in e["name"] for e in report["zero_grad"])
    assert "ZERO GRAD" in out


def test_bench_inference_writes_its_json_under_the_output_dir(data_args, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("BENCH_OUTPUT_DIR", str(tmp_path / "results"))
    monkeypatch.setenv("BENCH_N_TIMED", "4")
    monkeypatch.setenv("BENCH_N_WARMUP", "2")
    code, out, err = run_tool(["bench-inference", *data_args], capsys)
    assert code == 0, err
    (path,) = (tmp_path / "results").iterdir()
    host = __import__("socket").gethostname()
    assert path.name.startswith(f"{host}_tiny_") and path.suffix == ".json"
    report = json.loads(path.read_text())
    jsonschema.validate(report, BENCH_INFERENCE_SCHEMA)
    assert report["n_timed"] == 4 and len(report["warmup_sec"]) == 2 and report["compile_time_sec"] is None
    s = report["summary"]
    assert s["min"] <= s["p50"] <= s["p95"] <= s["p99"] <= s["max"]
    assert "timed calls (ms): mean=" in out


def test_decompose_latency_fits_a_line(data_args, tmp_path, capsys):
    args = ["decompose-latency", *data_args, "--num-steps", "1,2,4,8", "--repeats", "20", "--policy.n_warmup=2"]
    code, out, err = run_tool([*args, "--json", str(tmp_path / "l.json")], capsys)
    assert code == 0, err
    report = json.loads((tmp_path / "l.json").read_text())
    jsonschema.validate(report, DECOMPOSE_SCHEMA)
    assert sorted(int(n) for n in report["latency_sec"]) == [1, 2, 4, 8]
    assert all(len(v) == 20 for v in report["latency_sec"].values())
    # The fit is the least-squares line of the report's own medians (and of every call),
    # checked against numpy; how straight the line is depends on the machine's load, so it
    # is not asserted here (fit_latency's doctest checks a perfect line).
    steps = [1, 2, 4, 8]
    medians = [statistics.median(report["latency_sec"][str(n)]) for n in steps]
    assert [report["median_sec"][str(n)] for n in steps] == pytest.approx(medians)
    slope, fixed = np.polyfit(steps, medians, 1)
    assert report["per_step_sec"] == pytest.approx(slope, rel=1e-6, abs=1e-12)
    assert report["fixed_sec"] == pytest.approx(fixed, rel=1e-6, abs=1e-12)
    residual = np.sum((np.array(medians) - fixed - slope * np.array(steps)) ** 2)
    r2 = 1 - residual / np.sum((np.array(medians) - np.mean(medians)) ** 2)
    assert report["r2"] == pytest.approx(r2, rel=1e-6, abs=1e-9)
    every_x = [n for n in steps for _ in report["latency_sec"][str(n)]]
    every_y = [t for n in steps for t in report["latency_sec"][str(n)]]
    slope_all, fixed_all = np.polyfit(every_x, every_y, 1)
    fitted = fixed_all + slope_all * np.array(every_x)
    r2_all = 1 - np.sum((np.array(every_y) - fitted) ** 2) / np.sum((np.array(every_y) - np.mean(every_y)) ** 2)
    assert report["r2_all_calls"] == pytest.approx(r2_all, rel=1e-6, abs=1e-9)
    assert "fit: L(N) = F + N*s" in out


def test_decompose_latency_warms_every_num_steps_before_its_first_timed_call(data_args, capsys, monkeypatch):
    # Was: only settings.num_steps was warmed (run.start(warmup_num_steps=...) inside `with run:`
    # was a no-op), so the other points of the fit were measured cold.
    from scopebench.policy.run.steps import InferenceStep
    from scopebench.profiler.backends import NullProfiler

    calls = []
    real_call = InferenceStep.__call__

    def recording_call(self, prof, num_steps=None):
        calls.append(("warmup" if isinstance(prof, NullProfiler) else "timed", num_steps))
        return real_call(self, prof, num_steps)

    monkeypatch.setattr(InferenceStep, "__call__", recording_call)
    args = ["decompose-latency", *data_args, "--num-steps", "1,2,4", "--repeats", "2", "--policy.n_warmup=2"]
    code, _, err = run_tool(args, capsys)
    assert code == 0, err
    for n in (1, 2, 4):
        first_timed = calls.index(("timed", n))
        assert calls[:first_timed].count(("warmup", n)) == 2, (n, calls)
    assert [c for c in calls if c[0] == "timed"] == [("timed", n) for _ in range(2) for n in (1, 2, 4)]


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (["profile-step", "--config", "nope.yml"], "policy config file not found: nope.yml"),
        (["profile-step", "--config", TINY, "--batch_sise=3"], "unknown override key 'batch_sise'"),
        (["profile-step", "--config", TINY, "--batch_size", "0"], "batch_size must be an integer >= 1, got 0"),
        (["profile-step", "--config", TINY, "--preset=huge"], "preset must be one of 'tiny', 'small', 'pi05'"),
        (["bench-inference", "--config", TINY, "--policy.num_steps=0"], "num_steps must be an integer >= 1, got 0"),
        (["bench-inference", "--config", TINY, "--compile-mode", "turbo"], "compile_mode must be one of 'none'"),
        (
            ["bench-inference", "--config", TINY, "--policy.chunk_size=4", "--policy.n_action_steps=5"],
            "n_action_steps must be at most chunk_size=4, got 5",
        ),
    ],
)
def test_bad_inputs_get_one_line_naming_the_key(args, match, capsys):
    code, out, err = run_tool(args, capsys)
    assert code == 2 and out == ""
    (line,) = err.strip().splitlines()
    assert match in line


def test_progress_bar_only_on_a_terminal():
    from scopebench.policy.tools import progress_bar

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    tty, pipe = Terminal(), io.StringIO()
    for stream in (tty, pipe):
        with progress_bar(3, "steps", stream=stream) as bar:
            bar.update(3)
    assert "steps:" in tty.getvalue() and "/3 [" in tty.getvalue()
    assert pipe.getvalue() == ""


@pytest.mark.slow
def test_profile_step_with_two_local_ranks(data_args, tmp_path, capsys):
    code, out, err = run_tool(
        [
            "profile-step",
            *data_args,
            "--nproc-per-node",
            "2",
            "--warmup",
            "1",
            "--steps",
            "3",
            "--json",
            str(tmp_path / "r.json"),
        ],
        capsys,
    )
    assert code == 0, err
    report = json.loads((tmp_path / "r.json").read_text())
    jsonschema.validate(report, PROFILE_STEP_SCHEMA)
    assert report["world_size"] == 2 and [r["rank"] for r in report["per_rank"]] == [0, 1]
    assert all(len(r["samples"]["step_time_sec"]) == 3 for r in report["per_rank"])
    t = report["throughput"]
    assert t["global_samples_per_sec"] == pytest.approx(2 * 4 * t["steps_per_sec"])
    assert "ranks=2" in out


@pytest.mark.slow
def test_profile_step_under_accelerate_launch(robot_data, tmp_path):
    """accelerate launch (torchrun underneath) starts both ranks; accelerate must see two."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}
    cmd = [
        sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
        "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", "0",
        "-m", "scopebench.cli", "profile-step", "--config", TINY, f"--dataset.cache_dir={robot_data[0].cache_dir}",
        "--warmup", "1", "--steps", "2", "--json", str(tmp_path / "a.json"),
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((tmp_path / "a.json").read_text())
    assert report["world_size"] == 2 and len(report["per_rank"]) == 2
    assert proc.stdout.count("profile_step results") == 1  # rank 0 reports, rank 1 is quiet


def test_commands_without_overrides_still_refuse_unknown_arguments(capsys):
    with pytest.raises(SystemExit) as err:
        main(["info", "--batch_size=3"])
    assert err.value.code == 2 and "unrecognized arguments: --batch_size=3" in capsys.readouterr().err
