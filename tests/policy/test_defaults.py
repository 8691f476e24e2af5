"""Each default lives in one place: the settings dataclasses. The benchopt solvers' and the
dataset's grids, the tools' run configs and the writer of the synthetic data all read it."""

from __future__ import annotations

import ast
import dataclasses
import inspect
from pathlib import Path

import pytest

from scopebench.parameters import defaults
from scopebench.policy.data.synthetic import SyntheticRobotConfig
from scopebench.policy.settings import DatasetSettings, InferenceSettings, TrainSettings, load_run_config
from scopebench.preflight import load_classes

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def classes():
    return load_classes(REPO)


@pytest.mark.parametrize(
    ("solver", "settings"),
    [("Pi05Train", TrainSettings), ("Pi05Dataloader", TrainSettings), ("Pi05Inference", InferenceSettings)],
)
def test_solver_grids_hold_the_settings_defaults(classes, solver, settings):
    grid = classes.solvers[solver]
    fields = defaults(settings)
    run_settings = {key: values for key, values in grid.items() if key in fields}
    assert run_settings and all(values == [fields[key]] for key, values in run_settings.items()), run_settings
    assert "seed" not in grid  # the dataset's seed seeds the run


def test_pi05_train_varies_every_training_setting(classes):
    assert set(defaults(TrainSettings)) - set(classes.solvers["Pi05Train"]) == {"seed"}
    assert classes.solvers["Pi05Train"]["learning_rate"] == [TrainSettings().learning_rate]


def test_the_dataset_grid_and_the_writer_hold_the_dataset_settings_defaults(classes):
    (grid,) = classes.datasets.values()
    fields = defaults(DatasetSettings)
    # the synthetic dataset writes its data; `lerobot` (a user's folder) is the tools' key only
    assert set(grid) == set(fields) - {"cache_dir", "lerobot"}
    assert all(values == [fields[key]] for key, values in grid.items())
    writer = defaults(SyntheticRobotConfig)
    assert {key: writer[key] for key in grid if key in writer} == {key: fields[key] for key in grid if key in writer}


def test_the_dataset_settings_take_the_writers_defaults():
    # DatasetSettings repeated 7 of SyntheticRobotConfig's defaults (the pattern that let
    # denoiser_sigma drift): each shared field now reads the writer's.
    shared = {f.name for f in dataclasses.fields(DatasetSettings)} & {
        f.name for f in dataclasses.fields(SyntheticRobotConfig)
    }
    (cls,) = ast.parse(inspect.getsource(DatasetSettings)).body
    written = {
        node.target.id: ast.unparse(node.value)
        for node in cls.body
        if isinstance(node, ast.AnnAssign) and node.target.id in shared
    }
    assert written == {name: f"SyntheticRobotConfig.{name}" for name in shared}


def test_dataset_errors_name_the_key_the_user_typed(tmp_path):
    config = REPO / "configs" / "policy" / "tiny.yml"
    with pytest.raises(ValueError, match=r"^dataset\.num_episodes must be an integer >= 1, got 0"):
        load_run_config(config, [("dataset.num_episodes", 0)])
    with pytest.raises(ValueError, match=r"^image_size must be an integer >= 8, got 4"):
        DatasetSettings(image_size=4, cache_dir=str(tmp_path), key_prefix="")  # the benchopt dataset's keys
