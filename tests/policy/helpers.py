"""Builders shared by the policy tests: synthetic batches and non-trivial weights."""

from __future__ import annotations

import torch

from scopebench.policy import Pi05Policy

#: ``Pi05Train``'s phases and the columns other tools (the report's diagnosis rules) read:
#: frozen here, independently of the library's own constants.
TRAIN_PHASES = ("dataload_wait", "forward", "bwd", "unscale_clip", "optim_step", "zero_grad_sched", "sync_gather")
TRAIN_COLUMNS = [f"{p}_time_sec" for p in TRAIN_PHASES] + [
    "backward_step_time_sec",
    "samples_per_sec",
    "steps_per_sec",
    "max_rss_mb",
    "max_gpu_mb",
    "max_rss_mb_rank0",
    "achieved_flops_per_sec",
    "mfu",
    "peak_flops_per_sec",
    "peak_flops_source",
    "setup_time_sec",
    "world_size",
]


def make_batch(model: Pi05Policy, batch_size: int = 4, seed: int = 0) -> dict:
    """A training batch for ``model`` with a padded prompt and padded action tails."""
    cfg = model.config
    g = torch.Generator().manual_seed(seed)
    s = cfg.vision.image_size
    prompt_mask = torch.ones(batch_size, cfg.prompt_max_length, dtype=torch.bool)
    prompt_mask[:, cfg.prompt_max_length // 2 :] = False  # right padding, as the tokenizer does
    is_pad = torch.zeros(batch_size, cfg.chunk_size, dtype=torch.bool)
    is_pad[0, -2:] = True  # one sample ends its episode inside the chunk
    return {
        "images": torch.rand(batch_size, cfg.num_cameras, 3, s, s, generator=g),
        "prompt_ids": torch.randint(2, cfg.text_vocab_size, (batch_size, cfg.prompt_max_length), generator=g),
        "prompt_mask": prompt_mask,
        "state": torch.rand(batch_size, cfg.state_dim, generator=g) * 2 - 1,
        "actions": torch.randn(batch_size, cfg.chunk_size, cfg.action_dim, generator=g) * 0.5,
        "action_is_pad": is_pad,
    }


def randomize_modulations(model: Pi05Policy, seed: int = 0) -> None:
    """Give the zero-initialised adaptive norms random values.

    At init every expert block is the identity (zero gates), so the actions would not
    depend on the prefix at all and cache tests would pass vacuously.
    """
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "modulation" in name or "norm" in name:
                param.copy_(torch.randn(param.shape, generator=g) * 0.3)


def train_tool(args: list[str], capsys) -> tuple[int, str, str]:
    """``scopebench train <args>`` in this process: exit code, stdout, stderr."""
    from scopebench.cli import main

    code = main(["train", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


#: The head of a test module of inference policies (written to a file the tests name with
#: ``--policy path:function``): ``_policy(sample, **extra)`` is a 4-feature linear model
#: with a dataset, ``sample`` and ``observation``; ``extra`` goes to ``UserPolicy`` (``reset``).
SAMPLE_POLICY_SOURCE = """
import time

import torch
from scopebench.policy import UserPolicy


def _policy(sample, **extra):
    data = torch.utils.data.TensorDataset(torch.randn(8, 4))
    return UserPolicy(
        model=torch.nn.Linear(4, 4),
        loss=lambda model, batch: model(batch[0]).sum(),
        dataset=data,
        sample=sample,
        observation=lambda batch_size: torch.randn(batch_size, 4),
        **extra,
    )
"""
