"""Versions and device name recorded with every result."""

from __future__ import annotations

import torch

from scopebench.cli import main
from scopebench.environment import environment_metrics, package_version


def test_environment_metrics():
    env = environment_metrics("cpu")
    assert env["torch_version"] == torch.__version__
    assert env["scopebench_version"] == package_version("scopebench") != "unknown"
    assert env["device_name"].startswith("cpu")
    assert environment_metrics(torch.device("cpu")) == env
    assert package_version("surely-not-an-installed-package") is None


def test_info_command(capsys):
    import json

    assert main(["info"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["versions"]["torch"] == torch.__version__
