"""Load a trained policy from a ``scopebench train`` checkpoint; what a resume of one may change.

A checkpoint folder (:mod:`scopebench.train.checkpoint`) holds ``policy_config.json``
(for pi05 the preset and every field of the model's :class:`~scopebench.policy.pi05.config.Pi05Config`,
which depend on the dataset's cameras and sizes; for a user policy its factory and
arguments, ``policy`` and ``policy_args``) and, under DDP or after
``scopebench convert-checkpoint``, ``model.safetensors``::

    from scopebench.policy.checkpoint import load_policy
    model = load_policy("outputs/train/tiny/checkpoints/last")
"""

from __future__ import annotations

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
    """The model of a checkpoint, its weights loaded (strict): pi05 rebuilt by ``make_policy``
    from its config, a user policy's model by its factory with the recorded arguments
    (:func:`scopebench.policy.user.build_policy`; the factory must be importable here, as
    when it trained).

    The two files read are files of the checkpoint its manifest lists, regular, not links out
    of it (:func:`scopebench.train.consolidate.listed_file`; ``convert-checkpoint`` lists the
    weights it writes).

    Raises:
        FileNotFoundError: no finished checkpoint there, or no ``model.safetensors`` yet
            (a backend that writes sharded weights, named from the checkpoint's record: run
            ``scopebench convert-checkpoint`` first).
        ValueError: ``policy_config.json`` holds neither record, named; a factory that cannot
            be found or raises (:class:`~scopebench.policy.user.PolicyError`); either file not
            listed in the manifest, a link out of the checkpoint or not a regular file.
    """
    from safetensors.torch import load_file

    from scopebench.policy import make_policy
    from scopebench.train.backends import find_backend
    from scopebench.train.checkpoint import MODEL_FILE, read_step_file, resolve_checkpoint
    from scopebench.train.checkpoint_files import read_json
    from scopebench.train.consolidate import listed_file

    checkpoint = resolve_checkpoint(checkpoint)
    weights = checkpoint / MODEL_FILE
    if not (weights.exists() or weights.is_symlink()):
        recorded = find_backend(read_step_file(checkpoint).get("backend"))  # the registry's, not a list here
        what = f"a {recorded.title} checkpoint" if recorded is not None else "this checkpoint"
        raise FileNotFoundError(
            f"{weights} is missing: {what} holds sharded weights; run `scopebench convert-checkpoint {checkpoint}` "
            "first"
        )
    weights = listed_file(checkpoint, MODEL_FILE, hint=f"run `scopebench convert-checkpoint {checkpoint}` again")
    record_file = listed_file(checkpoint, POLICY_CONFIG_FILE)
    saved = read_json(record_file, POLICY_CONFIG_FILE)
    if isinstance(saved, dict) and {"preset", "config"} <= set(saved):
        model = make_policy(saved["preset"], **saved["config"])
    elif isinstance(saved, dict) and isinstance(saved.get("policy"), str):
        from scopebench.policy.user import build_policy

        model = build_policy(saved["policy"], saved.get("policy_args") or {}).model
    else:
        raise ValueError(
            f"{record_file} must hold pi05's 'preset' and 'config' or a user policy's 'policy' and 'policy_args', "
            f"got keys {sorted(saved) if isinstance(saved, dict) else type(saved).__name__}"
        )
    model.load_state_dict(load_file(str(weights), device=str(device)))
    return model.to(device)
