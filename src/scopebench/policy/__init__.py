"""The policy benchmark's library: the policy interface, the built-in policies, robot data, control rate.

Any PyTorch model is a policy through :class:`UserPolicy` (``user``: a factory named by
``module:function`` returns one; docs/policies.md); pi05 is one (``pi05``).

Quick start::

    from scopebench.policy import make_policy, PolicyRunner
    model = make_policy("tiny")                      # or "small", "pi05"
    with torch.device("meta"):                       # count without allocating
        print(make_policy("pi05").num_params())

Rooms (lerobot's layout: ``policies/<name>/``, ``datasets/``; and this project's ``imaging/``):

* ``user`` (the interface, factories) and ``calls`` (the suite calling a policy's code, each
  failure in one line);
* ``pi05/``: the suite's pi05 (config, layers, model, flops, tokenizer, runner, and the
  factory in ``policy``); ``paligemma/``: Hugging Face's PaliGemma behind the same interface.
  A new built-in policy is a folder beside them;
* ``data/``: the LeRobot v3.0 format, videos, the synthetic writer, the dataset and loader;
* ``control/``: control-rate figures and the closed-loop replay;
* ``run/``: the run objects, steps and solvers; beside them the tools' shared pieces
  (``settings``, ``tools``, ``phases``, ``audit``, ``memory``, ``max_batch``, ``checkpoint``).
"""

from __future__ import annotations

from typing import Any

from scopebench.policy.audit import ParameterAudit, find_unused_parameters
from scopebench.policy.data.dataset import (
    RobotDataset,
    WeightedMixtureSampler,
    collate_robot_batch,
    make_dataloader,
)
from scopebench.policy.data.synthetic import SyntheticRobotConfig, generate_episode, write_synthetic_dataset
from scopebench.policy.pi05.config import PRESETS, Pi05Config, VisionConfig, make_config
from scopebench.policy.pi05.model import Pi05Policy, PrefixCache
from scopebench.policy.pi05.runner import PolicyRunner
from scopebench.policy.pi05.tokenizer import PromptTokenizer
from scopebench.policy.user import PolicyError, UserPolicy

__all__ = [
    "PRESETS",
    "ParameterAudit",
    "Pi05Config",
    "Pi05Policy",
    "PolicyError",
    "PolicyRunner",
    "PrefixCache",
    "PromptTokenizer",
    "RobotDataset",
    "SyntheticRobotConfig",
    "UserPolicy",
    "VisionConfig",
    "WeightedMixtureSampler",
    "collate_robot_batch",
    "find_unused_parameters",
    "generate_episode",
    "make_config",
    "make_dataloader",
    "make_policy",
    "write_synthetic_dataset",
]


def make_policy(preset: str = "tiny", **overrides: Any) -> Pi05Policy:
    """Build a randomly initialised policy.

    Under ``with torch.device("meta"):`` nothing is allocated (parameters are meta
    tensors), which is how the 3.3 B ``pi05`` preset is counted on a laptop.

    Args:
        preset: ``tiny``, ``small`` or ``pi05``.
        **overrides: :class:`Pi05Config` fields (``vision`` as a dict of
            :class:`VisionConfig` fields).

    Returns:
        The model, with parameters in ``config.dtype``.
    """
    import torch

    config = make_config(preset, **overrides)
    return Pi05Policy(config).to(getattr(torch, config.dtype))
