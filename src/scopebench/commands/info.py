"""Print the versions of the suite's main packages, the device and the CPU resources, as JSON.

Run: ``scopebench info``. Output keys: ``versions`` (package -> version), ``device``
(the CUDA device's name, else the CPU's), ``cpu_count`` (logical CPUs of the machine),
``torch_threads`` (intra-op threads torch uses in this process).
"""

from __future__ import annotations

import argparse
import json
import os
import platform

HELP = "versions and device, as JSON"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    pass


def info() -> dict:
    import torch

    from scopebench.environment import device_name, package_version

    versions = {name: package_version(name) for name in ("scopebench", "deepinv", "benchopt")}
    versions.update(torch=torch.__version__, python=platform.python_version())
    device = device_name("cuda" if torch.cuda.is_available() else "cpu")
    return {
        "versions": versions,
        "device": device,
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
    }


def run(args: argparse.Namespace) -> int:
    print(json.dumps(info(), indent=2))
    return 0
