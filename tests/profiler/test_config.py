"""Bad profiler settings get one clear error before any work."""

from __future__ import annotations

import pytest

from scopebench.harness import ProfiledSolverMixin
from scopebench.profiler import PROFILER_DEFAULTS, ProfilerConfig, create_profiler


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"mode": "fast"}, r"profiler_mode must be one of null, custom, torch, nvidia, got 'fast'"),
        ({"mode": "custom", "warmup": -1}, r"profiler_warmup must be an integer >= 0, got -1"),
        ({"mode": "custom", "active": -2}, r"profiler_active must be an integer >= 0, got -2"),
        ({"mode": "custom", "active": 2.5}, r"profiler_active must be an integer >= 0, got 2.5 \(float\)"),
        ({"mode": "custom", "active": "3"}, r"profiler_active must be an integer >= 0, got '3' \(str\)"),
        ({"mode": "custom", "warmup": True}, r"profiler_warmup must be an integer >= 0, got True \(bool\)"),
        ({"mode": "custom", "repeat": -1}, r"profiler_repeat must be an integer >= 0, got -1"),
        ({"mode": "custom", "save_file": "yes"}, r"profiler_save_file must be true or false, got 'yes' \(str\)"),
        ({"mode": "torch", "per_step": 1}, r"profiler_per_step must be true or false, got 1 \(int\)"),
    ],
)
def test_bad_values_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        create_profiler(device="cpu", name="x", **kwargs)


def test_unwritable_trace_dir_is_refused(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    with pytest.raises(ValueError, match=r"profiler_trace_dir=.*a_file/traces.*cannot be created"):
        create_profiler("torch", "cpu", "x", per_step=False, trace_dir=blocker / "traces")


def test_validating_a_trace_dir_creates_nothing(tmp_path):
    ProfilerConfig(mode="torch", per_step=False, trace_dir=tmp_path / "a" / "b")
    assert list(tmp_path.iterdir()) == []


def test_read_only_output_folders_are_refused_before_any_work(read_only_dir):
    with pytest.raises(ValueError, match=r"profiler_trace_dir=.*read_only/traces.*not a writable directory"):
        ProfilerConfig(mode="torch", per_step=False, trace_dir=read_only_dir / "traces")
    config = ProfilerConfig(mode="custom", save_file=True)
    with pytest.raises(ValueError, match=r"profiler_save_file=.*read_only.*not a writable directory"):
        config.check_outputs(read_only_dir)
    ProfilerConfig(mode="custom", save_file=False).check_outputs(read_only_dir)  # nothing to write: fine


def test_trace_dir_needs_torch_mode(tmp_path):
    with pytest.raises(ValueError, match="profiler_trace_dir is only used by profiler_mode=torch"):
        ProfilerConfig(mode="custom", trace_dir=tmp_path)


def test_null_spellings():
    for spelling in (None, "null", "none"):
        assert ProfilerConfig(mode=spelling).mode == "null"


def test_solver_mixin_defaults_and_validation():
    # The documented defaults, written out: a changed default must change this test too.
    assert ProfiledSolverMixin.parameters == {
        "profiler_mode": ["custom"],
        "profiler_warmup": [0],
        "profiler_active": [0],
        "profiler_save_file": [False],
        "profiler_per_step": [True],
        "profiler_repeat": [1],
        "profiler_trace_dir": [None],
        "profiler_memory": [False],
    }
    assert PROFILER_DEFAULTS["profiler_mode"] == "custom"

    class FakeSolver(ProfiledSolverMixin):
        profiler_mode = "torch"
        profiler_active = -1

    with pytest.raises(ValueError, match="profiler_active"):
        FakeSolver().validate_profiler()
    solver = FakeSolver()
    solver.profiler_active = 2
    assert solver.validate_profiler().active == 2
    assert solver.profiler_kwargs()["profiler_mode"] == "torch"


def test_unknown_parameter_is_refused():
    with pytest.raises(ValueError, match="unknown profiler parameter"):
        ProfilerConfig.from_params(profiler_mdoe="custom")


def test_solver_mixin_drives_a_run_object(tmp_path):
    from scopebench.harness.run import RankRun

    class Work(RankRun):
        def step(self, profiler):
            with profiler.track_step("work"):
                pass

    class FakeSolver(ProfiledSolverMixin):
        profiler_mode = "custom"
        profiler_warmup = 1
        profiler_save_file = True

    solver = FakeSolver()
    run = Work(profiler=solver.validate_profiler(tmp_path), output_dir=tmp_path, name="fake")
    assert run.metrics() == {}
    seen, calls = [], iter(range(4))

    def callback():
        seen.append(run.metrics())
        return next(calls) < 3

    solver.start_run(run)
    assert solver.profiler is run.profiler
    # Before the window: the set-up time and the host (docs/profiler.md, "The host").
    assert run.metrics().keys() == {
        "setup_time_sec",
        "host_records_json",
        "load_average_1m_start",
        "load_average_1m_end",
    }
    solver.finish_run(run, callback)
    assert ["work_time_sec" in m for m in seen] == [False, False, True, True]
    assert "work_time_sec" in run.metrics()
    assert len(list(tmp_path.glob("fake_*_rank0_gpu_metrics.csv"))) == 1


def test_the_eight_defaults_are_written_once_in_profiler_config():
    # They were written three times (PROFILER_DEFAULTS, ProfilerConfig, create_profiler's
    # keywords): the solver parameters and create_profiler's keywords read ProfilerConfig's.
    import ast
    import inspect

    import scopebench.profiler.config as config_module

    signature = inspect.signature(create_profiler)
    for key, default in PROFILER_DEFAULTS.items():
        name = key.removeprefix("profiler_")
        assert default == getattr(ProfilerConfig(), name)
        if name != "mode":  # create_profiler's mode has no default
            assert signature.parameters[name].default == default, name
    function = ast.parse(inspect.getsource(create_profiler)).body[0]
    written = [ast.unparse(d) for d in function.args.defaults[2:]]  # after device and name
    assert all(d.startswith("ProfilerConfig.") for d in written), written
    assignment = next(
        node
        for node in ast.parse(inspect.getsource(config_module)).body
        if isinstance(node, ast.AnnAssign) and ast.unparse(node.target) == "PROFILER_DEFAULTS"
    )
    assert not isinstance(assignment.value, ast.Dict), "PROFILER_DEFAULTS is derived from ProfilerConfig's fields"
