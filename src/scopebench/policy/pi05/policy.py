"""The suite's pi05 re-implementation as a :class:`~scopebench.policy.user.UserPolicy` (``policy: pi05``).

Every policy tool and solver drives a :class:`UserPolicy`; this factory is how pi05 becomes
one, so pi05 and a user's model share one code path (the same phases, backends, FLOPs and
reports). What the run knows about its data is passed in: the synthetic robot dataset's
folder and chunk size, the ``preset`` and the model settings of the run (training:
``attention_implementation``, ``gradient_checkpointing``, ``ce_weight``; inference:
``attention_implementation``, ``num_cameras``, ``chunk_size``, ``prompt_words``,
``n_action_steps``; see :func:`pi05_args`).

Training: ``preprocess`` is the host preprocessing (tokenize, normalise, pad) and the copy
to the device; ``loss`` is the flow-matching MSE plus the discrete-action cross-entropy,
logged as ``mse_loss`` and ``ce_loss``; FLOPs come from the model's own formula; FSDP2
shards every joint layer, vision block and the patch embedding. Inference: ``prefill`` is
the prefix's KV cache, ``sample`` the ``num_steps`` Euler steps of the action expert,
``postprocess`` crops and un-normalises the actions.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from scopebench.policy.pi05.config import Pi05Config, make_config
from scopebench.policy.pi05.model import Pi05Policy
from scopebench.policy.user import UserPolicy

if TYPE_CHECKING:
    from scopebench.policy.data.dataset import RobotDataset

__all__ = ["config_for_dataset", "make_observation", "make_pi05_policy", "pi05_args", "policy_for_dataset"]


def pi05_args(settings: Any, *, dataset_root: str, chunk_size: int, task: str = "train") -> dict[str, Any]:
    """The arguments of :func:`make_pi05_policy` for a run: its data, and the model settings of
    ``settings`` (a :class:`~scopebench.policy.settings.TrainSettings` for ``train`` and
    ``dataloader``, an :class:`~scopebench.policy.settings.InferenceSettings` for ``inference``)."""
    args: dict[str, Any] = dict(
        dataset_root=str(dataset_root),
        chunk_size=chunk_size,
        preset=settings.preset,
        attention_implementation=settings.attention_implementation,
    )
    if task == "dataloader":  # the preprocessing needs the config only: no weights are allocated
        args.update(meta_model=True)
    if task == "inference":
        args.update(
            chunk_size=settings.chunk_size or chunk_size,
            num_cameras=settings.num_cameras,
            prompt_words=settings.prompt_words,
            n_action_steps=settings.n_action_steps,
        )
    else:
        args.update(gradient_checkpointing=settings.gradient_checkpointing, ce_weight=settings.ce_weight)
    return args


def config_for_dataset(preset: str, dataset: RobotDataset, **overrides) -> Pi05Config:
    """The config of ``preset`` with cameras, chunk and padded state/action sizes that fit ``dataset``."""
    base = make_config(preset)
    sizes = dict(
        num_cameras=len(dataset.cameras),
        chunk_size=dataset.chunk_size,
        state_dim=max(base.state_dim, dataset.state_dim),
        action_dim=max(base.action_dim, dataset.action_dim),
    )
    return make_config(preset, **{**sizes, **overrides})


def policy_for_dataset(preset: str, dataset: RobotDataset, **overrides) -> Pi05Policy:
    """A randomly initialised policy with :func:`config_for_dataset`'s config."""
    config = config_for_dataset(preset, dataset, **overrides)
    return Pi05Policy(config).to(getattr(torch, config.dtype))


def make_observation(sample: Mapping, num_cameras: int, prompt_words: int) -> dict:
    """A batch-1 observation from one dataset sample: its camera images, cycled to
    ``num_cameras``; its task prompt, repeated to ``prompt_words`` words (then bounded by
    the model's ``prompt_max_length`` tokens); its state.

    :Examples:

    >>> sample = {"camera0": torch.zeros(3, 4, 4), "state": torch.zeros(2), "prompt": "pick it"}
    >>> obs = make_observation(sample, num_cameras=2, prompt_words=5)
    >>> sorted(obs), obs["prompt"], tuple(obs["camera1"].shape)
    (['camera0', 'camera1', 'prompt', 'state'], ['pick it pick it pick'], (1, 3, 4, 4))
    """
    cams = sorted(k for k in sample if k.startswith("camera"))
    words = str(sample.get("prompt", "")).split() or ["go"]
    obs = {f"camera{i}": sample[cams[i % len(cams)]][None] for i in range(num_cameras)}
    obs["state"] = sample["state"][None]
    obs["prompt"] = [" ".join(words[i % len(words)] for i in range(prompt_words))]
    return obs


def make_pi05_policy(
    *,
    dataset_root: str,
    chunk_size: int,
    preset: str = "tiny",
    num_cameras: int | None = None,
    prompt_words: int = 24,
    n_action_steps: int | None = None,
    meta_model: bool = False,
    **overrides: Any,
) -> UserPolicy:
    """pi05 of ``preset`` sized for the robot dataset at ``dataset_root``, random weights.

    Args:
        dataset_root: Folder of the robot dataset (training samples; the inference observation
            is its first frame, see :func:`make_observation`).
        chunk_size: Actions per sample.
        preset: ``tiny``, ``small`` or ``pi05``.
        num_cameras: Cameras of the model (None: the dataset's).
        prompt_words: Words of the inference prompt.
        n_action_steps: Actions an inference call returns (None: the whole chunk).
        meta_model: Build the model on the meta device (the dataloader benchmark: its
            preprocessing reads the config, and the ``pi05`` preset's 3.3 B weights are not allocated).
        **overrides: :class:`~scopebench.policy.pi05.config.Pi05Config` fields.
    """
    from scopebench.policy.data.dataset import RobotDataset, collate_robot_batch
    from scopebench.policy.pi05.runner import Preprocessor
    from scopebench.train.fsdp import DEFAULT_UNITS

    dataset = RobotDataset(dataset_root, chunk_size=chunk_size)
    if num_cameras is not None:
        overrides["num_cameras"] = num_cameras
    with torch.device("meta") if meta_model else contextlib.nullcontext():
        model = policy_for_dataset(preset, dataset, **overrides)
    config = model.config
    preprocessors: dict[tuple, Preprocessor] = {}

    def preprocessor(device: torch.device) -> Preprocessor:
        dtype = next(model.parameters()).dtype  # bf16 weights take bf16 images
        key = (str(device), dtype)
        if key not in preprocessors:
            preprocessors[key] = Preprocessor(config, dataset.stats, device, dtype)
        return preprocessors[key]

    def preprocess(batch: dict, device: torch.device) -> dict:
        return preprocessor(device).preprocess(batch)

    def postprocess(actions: torch.Tensor) -> torch.Tensor:
        out = preprocessor(actions.device).postprocess(actions)
        return out[:, :n_action_steps] if n_action_steps else out

    def observation(batch_size: int) -> dict:
        obs = make_observation(dataset[0], config.num_cameras, prompt_words)
        if batch_size == 1:
            return obs
        return {
            k: v * batch_size if isinstance(v, list) else v.expand(batch_size, *v.shape[1:]) for k, v in obs.items()
        }

    return UserPolicy(
        model=model,
        loss=lambda m, obs: m(obs),
        dataset=dataset,
        collate_fn=collate_robot_batch,
        preprocess=preprocess,
        prefill=lambda m, obs: m.prefill(obs),
        sample=lambda m, cache, num_steps: m.denoise(cache, None, num_steps),
        postprocess=postprocess,
        observation=observation,
        flops_per_sample=model.estimate_flops(1, "train"),
        shard_modules=[m for m in model.modules() if type(m).__name__ in DEFAULT_UNITS],
    )
