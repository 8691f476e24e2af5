"""The policy benchmark's library: the policy interface, pi05, cost accounting and robot data.

Any PyTorch model is a policy through :class:`UserPolicy` (``user``: a factory named by
``module:function`` returns one; docs/policies.md); pi05 is one (``pi05``).

Quick start::

    from scopebench.policy import make_policy, PolicyRunner
    model = make_policy("tiny")                      # or "small", "pi05"
    with torch.device("meta"):                       # count without allocating
        print(make_policy("pi05").num_params())

Modules: ``config`` (dataclasses, presets), ``model`` (the network), ``flops`` (cost
formulas), ``tokenizer`` (stub tokenizers), ``runner`` (preprocess / prefill / denoise /
postprocess), ``audit`` (unused parameters), ``data`` (synthetic dataset writer),
``dataset`` (reader, mixture sampler, DataLoader).
"""

from __future__ import annotations

from typing import Any

from scopebench.policy.audit import ParameterAudit, find_unused_parameters
from scopebench.policy.config import PRESETS, Pi05Config, VisionConfig, make_config
from scopebench.policy.data import SyntheticRobotConfig, generate_episode, write_synthetic_dataset
from scopebench.policy.dataset import (
    RobotDataset,
    WeightedMixtureSampler,
    collate_robot_batch,
    make_dataloader,
)
from scopebench.policy.model import Pi05Policy, PrefixCache
from scopebench.policy.runner import PolicyRunner
from scopebench.policy.tokenizer import PromptTokenizer
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
