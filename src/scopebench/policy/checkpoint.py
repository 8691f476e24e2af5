"""Load a trained policy from a ``scopebench train`` checkpoint; what a resume of one may change.

A checkpoint folder (:mod:`scopebench.train.checkpoint`) holds ``policy_config.json``
(the preset and every field of the model's :class:`~scopebench.policy.config.Pi05Config`,
which depend on the dataset's cameras and sizes) and, under DDP or after
``scopebench convert-checkpoint``, ``model.safetensors``::

    from scopebench.policy.checkpoint import load_policy
    model = load_policy("outputs/train/tiny/checkpoints/last")
"""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["POLICY_CONFIG_FILE", "RESUME_MAY_CHANGE", "load_policy"]

POLICY_CONFIG_FILE = "policy_config.json"
#: Settings a resume may change: where and how often it logs and saves, how long it trains,
#: and what only affects speed, memory checks or where the data is cached, never the steps
#: taken. Every other training and dataset setting must match the checkpoint's.
RESUME_MAY_CHANGE = (
    "training.steps",
    "training.log_freq",
    "training.save_freq",
    "training.output_dir",
    "group_timeout_sec",
    "check_memory",
    "peak_tflops",
    "num_workers",
    "prefetch_factor",
    "device",
    "dataset.cache_dir",
)


def load_policy(checkpoint: str | Path, device: str = "cpu"):
    """The policy of a checkpoint: ``make_policy`` on its config, then its weights (strict).

    Raises:
        FileNotFoundError: no finished checkpoint there, or no ``model.safetensors`` yet
            (a ZeRO checkpoint: run ``scopebench convert-checkpoint`` first).
    """
    from safetensors.torch import load_file

    from scopebench.policy import make_policy
    from scopebench.train.checkpoint import MODEL_FILE, resolve_checkpoint

    checkpoint = resolve_checkpoint(checkpoint)
    weights = checkpoint / MODEL_FILE
    if not weights.is_file():
        raise FileNotFoundError(
            f"{weights} is missing: a ZeRO checkpoint holds sharded weights; run "
            f"`scopebench convert-checkpoint {checkpoint}` first"
        )
    saved = json.loads((checkpoint / POLICY_CONFIG_FILE).read_text())
    model = make_policy(saved["preset"], **saved["config"])
    model.load_state_dict(load_file(str(weights), device=str(device)))
    return model.to(device)
