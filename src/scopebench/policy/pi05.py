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
from typing import Any

import torch

from scopebench.policy.user import UserPolicy

__all__ = ["make_pi05_policy", "pi05_args"]


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
            is its first frame, see :func:`scopebench.policy.run.inference.make_observation`).
        chunk_size: Actions per sample.
        preset: ``tiny``, ``small`` or ``pi05``.
        num_cameras: Cameras of the model (None: the dataset's).
        prompt_words: Words of the inference prompt.
        n_action_steps: Actions an inference call returns (None: the whole chunk).
        meta_model: Build the model on the meta device (the dataloader benchmark: its
            preprocessing reads the config, and the ``pi05`` preset's 3.3 B weights are not allocated).
        **overrides: :class:`~scopebench.policy.config.Pi05Config` fields.
    """
    from scopebench.policy.dataset import RobotDataset, collate_robot_batch
    from scopebench.policy.run.inference import make_observation
    from scopebench.policy.run.steps import policy_for_dataset
    from scopebench.policy.runner import Preprocessor
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
