"""Validated settings of the policy runs, and the policy run configs (``configs/policy/*.yml``).

Three dataclasses, each the parameter set of one consumer, validated when built (every
error names the key, the value and what is allowed, through :mod:`scopebench.validate`):

* :class:`TrainSettings`: the ``Pi05Train`` / ``Pi05Dataloader`` solver parameters (less
  the ``profiler_*`` ones) and the top level of a run config;
* :class:`InferenceSettings`: the ``Pi05Inference`` parameters and the ``policy:`` section;
* :class:`DatasetSettings`: the synthetic dataset and the ``dataset:`` section;
* :class:`TrainLoopSettings`: ``scopebench train``'s steps, output folder, log and save
  frequencies, the ``training:`` section.

A run config is YAML (see ``configs/policy/tiny.yml``)::

    preset: tiny            # top level: TrainSettings fields
    batch_size: 4
    policy:                 # InferenceSettings fields (policy_args, preset, precision, attention,
      num_steps: 10         #   seed, device and check_memory come from the top level)
      factory: pi05         # the policy (or a top-level ``policy: mypkg.policies:make_policy``)
    dataset:                # DatasetSettings fields
      num_episodes: 4

:func:`load_run_config` reads it and applies command-line overrides ``--batch_size=12``,
``--policy.num_steps=5``, ``--dataset.image_size=64`` (values parsed as YAML scalars, so
``--fused_adamw=null`` is ``None`` and ``--batch_size=abc`` is refused by the validator).
An unknown key, in the file or in an override, is an error that lists the known ones.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import InitVar, dataclass, field
from pathlib import Path
from typing import Any

from scopebench.distributed.device import check_device
from scopebench.parameters import solver_parameters  # re-exported for the policy's solvers and dataset
from scopebench.policy.data.synthetic import SyntheticRobotConfig
from scopebench.policy.pi05.config import ATTENTION_IMPLEMENTATIONS, PRESETS
from scopebench.train.backends import DEFAULT_BACKEND, backend_names, get_backend
from scopebench.train.backends.base import PRECISIONS
from scopebench.train.optim import SCHEDULERS
from scopebench.validate import choice, flag, integer, load_yaml, number, optional, quote, seed, yaml_mapping

__all__ = [
    "DatasetSettings",
    "InferenceSettings",
    "RunConfig",
    "TrainLoopSettings",
    "TrainSettings",
    "backend_conflict",
    "compile_modes",
    "load_run_config",
    "parse_overrides",
    "settings_from",
    "solver_parameters",
]

#: Top-level keys a policy section inherits from the top level of a run config.
SHARED_KEYS = (
    "policy",
    "policy_args",
    "preset",
    "precision",
    "attention_implementation",
    "seed",
    "device",
    "check_memory",
)


@functools.lru_cache(maxsize=1)
def compile_modes() -> tuple[str, ...]:
    """``none`` plus every ``torch.compile`` mode this torch knows."""
    import torch._inductor

    return ("none", *torch._inductor.list_mode_options())


@dataclass(frozen=True, kw_only=True)
class TrainSettings:
    """One training (or dataloader) run of the policy, on every rank."""

    policy: str = "pi05"
    """The policy: ``pi05`` (the suite's re-implementation) or a factory ``module:function`` (or
    ``path/to/file.py:function``) returning a :class:`scopebench.policy.UserPolicy` (docs/policies.md)."""
    policy_args: dict = field(default_factory=dict)
    """Keyword arguments of the factory (``--policy-arg key=value``); pi05's come from the settings."""
    preset: str = "tiny"
    """pi05's model size: ``tiny``, ``small`` or ``pi05`` (a user policy sizes its own model)."""
    batch_size: int = 4
    """Samples per step and rank (global batch = ``batch_size x ranks``)."""
    num_workers: int = 0
    """DataLoader worker processes per rank (0: load in the training process)."""
    prefetch_factor: int = 2
    """Batches prefetched per worker (ignored with 0 workers)."""
    nproc_per_node: int = 1
    """Processes to start on this machine when no launcher started them (this one is rank 0)."""
    backend: str = DEFAULT_BACKEND
    """The training backend: a name of :func:`scopebench.train.backends.backend_names` (``ddp``,
    DistributedDataParallel, by default; the table of docs/distributed.md says what each shards and
    its fewest ranks)."""
    accelerate_config: str | None = None
    """accelerate config file with the ZeRO / FSDP2 knobs (None: ``configs/accelerate/`` file of ``backend``)."""
    gradient_accumulation_steps: int = 1
    """Micro-batches per optimizer step (global batch = ``batch_size x ranks x`` this)."""
    no_optim: bool = False
    """No optimizer is created or stepped (raw forward + backward; gradients are dropped)."""
    find_unused_params: bool = True
    """DDP's ``find_unused_parameters`` (see ``scopebench find-unused-params``)."""
    fused_adamw: bool | None = None
    """None: torch's default AdamW; true/false: force the fused kernel on or off."""
    attention_implementation: str = "sdpa"
    """``sdpa`` or ``eager``."""
    gradient_checkpointing: bool = False
    """Recompute each joint layer in the backward pass."""
    torch_compile: bool = False
    """Compile the model (inductor); the first steps pay for compilation."""
    precision: str = "fp32"
    """``fp32``, or ``bf16`` autocast over fp32 weights."""
    learning_rate: float = 1e-3
    """AdamW learning rate."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    grad_clip: float = 1.0
    """Maximum global gradient norm; 0 disables clipping."""
    scheduler: str = "constant"
    """Learning-rate schedule after warm-up: ``constant`` or ``cosine``."""
    warmup_steps: int = 0
    """Steps of linear learning-rate warm-up."""
    gather_every: int = 1
    """Gather the loss terms and memory peaks across ranks every this many steps."""
    ce_weight: float = 1.0
    """Weight of the discrete-action cross-entropy (0 leaves the discrete head unused)."""
    seed: int = 0
    """Seed of the weights and the sampler."""
    group_timeout_sec: float | None = None
    """Process-group timeout (None: DistSession's default for local runs)."""
    peak_tflops: float | None = None
    """Peak TFLOP/s of one device for MFU (None: measured on CPU, looked up on CUDA)."""
    check_memory: bool = True
    """Refuse a preset whose weights and optimizer state exceed the free memory."""
    device: str = "auto"
    """``auto`` (this rank's GPU if any, else CPU), ``cpu``, ``cuda`` or ``cuda:<index>``."""

    def __post_init__(self) -> None:
        check_policy(self.policy, self.policy_args)
        choice("preset", self.preset, PRESETS)
        integer("batch_size", self.batch_size, low=1)
        integer("num_workers", self.num_workers, low=0)
        integer("prefetch_factor", self.prefetch_factor, low=1)
        integer("nproc_per_node", self.nproc_per_node, low=1)
        choice("backend", self.backend, backend_names())
        if self.accelerate_config is not None and (
            not isinstance(self.accelerate_config, str) or not self.accelerate_config
        ):
            raise ValueError(f"accelerate_config must be a file path or null, got {self.accelerate_config!r}")
        integer("gradient_accumulation_steps", self.gradient_accumulation_steps, low=1)
        for name in ("no_optim", "find_unused_params", "gradient_checkpointing", "torch_compile", "check_memory"):
            flag(name, getattr(self, name))
        optional(flag, "fused_adamw", self.fused_adamw)
        choice("attention_implementation", self.attention_implementation, ATTENTION_IMPLEMENTATIONS)
        choice("precision", self.precision, PRECISIONS)
        _put(self, "learning_rate", number("learning_rate", self.learning_rate, low=0, low_open=True))
        _put(self, "weight_decay", number("weight_decay", self.weight_decay, low=0))
        _put(self, "grad_clip", number("grad_clip", self.grad_clip, low=0))
        choice("scheduler", self.scheduler, SCHEDULERS)
        integer("warmup_steps", self.warmup_steps, low=0)
        integer("gather_every", self.gather_every, low=1)
        _put(self, "ce_weight", number("ce_weight", self.ce_weight, low=0))
        seed("seed", self.seed)
        _put(
            self,
            "group_timeout_sec",
            optional(number, "group_timeout_sec", self.group_timeout_sec, low=0, low_open=True),
        )
        _put(self, "peak_tflops", optional(number, "peak_tflops", self.peak_tflops, low=0, low_open=True))
        check_device("device", self.device)
        conflict = backend_conflict(self.backend, self.gradient_checkpointing, self.no_optim)
        if conflict:
            raise ValueError(conflict)
        if self.policy != "pi05" and self.gradient_checkpointing:
            raise ValueError(
                f"gradient_checkpointing=true applies to policy pi05 only, got policy={self.policy}: a user policy "
                "turns checkpointing on in its own model (a policy_args key of its factory)"
            )


def _put(settings: Any, name: str, value: Any) -> None:
    """Keep the validated value of a frozen settings field (``number`` turns ``"1e-3"``, what
    YAML 1.1 reads from ``1e-3``, into ``0.001``; an ``int`` into a ``float``)."""
    object.__setattr__(settings, name, value)


def check_policy(policy: Any, policy_args: Any) -> None:
    """``policy`` (its form: nothing is imported) and ``policy_args`` (a mapping of identifiers to
    YAML values), refused naming the key.

    :Examples:

    >>> check_policy("mypkg:make", {"hidden": 8})
    >>> check_policy("pi05", {"hidden": 8})
    Traceback (most recent call last):
    ...
    ValueError: policy_args must be empty with policy pi05 (its arguments come from the run's settings), got {'hidden': 8}
    """
    from scopebench.policy.user import check_policy_name

    check_policy_name("policy", policy)
    if not isinstance(policy_args, dict) or not all(isinstance(k, str) and k.isidentifier() for k in policy_args):
        raise ValueError(f"policy_args must be a mapping of argument names to values, got {policy_args!r}")
    if policy == "pi05" and policy_args:
        raise ValueError(
            f"policy_args must be empty with policy pi05 (its arguments come from the run's settings), got {policy_args!r}"
        )


def backend_conflict(
    backend: str, gradient_checkpointing: bool, no_optim: bool, world_size: int | None = None
) -> str | None:
    """Why ``backend`` cannot run with these settings (None: it can): the backend's own
    :meth:`~scopebench.train.backends.TrainingBackend.conflict`. A solver declines the
    combination with it (``Solver.skip``); :class:`TrainSettings` refuses it.

    :Examples:

    >>> backend_conflict("zero2", False, False, world_size=1)[:60]
    'backend=zero2 shards training state across ranks and needs a'
    """
    return get_backend(backend).conflict(
        gradient_checkpointing=gradient_checkpointing, no_optim=no_optim, world_size=world_size
    )


@dataclass(frozen=True, kw_only=True)
class InferenceSettings:
    """One inference call benchmark at batch 1 (pi05: ``sample_actions``; a user policy: its ``sample``)."""

    policy: str = "pi05"
    """The policy: ``pi05`` or a factory ``module:function`` (see :class:`TrainSettings`)."""
    policy_args: dict = field(default_factory=dict)
    """Keyword arguments of the factory."""
    preset: str = "tiny"
    """pi05's model size: ``tiny``, ``small`` or ``pi05``."""
    num_cameras: int | None = None
    """pi05: camera images per observation (None: the dataset's)."""
    num_steps: int = 10
    """Steps per call: pi05's Euler steps of the action expert; a user policy's ``sample`` argument."""
    chunk_size: int | None = None
    """pi05: actions predicted per call (None: the dataset's chunk size)."""
    n_action_steps: int | None = None
    """pi05: actions returned per call, at most ``chunk_size`` (None: all of them); also the
    actions executed per chunk in the control-rate figures (:mod:`scopebench.policy.control.figures`)."""
    control_hz: float | None = None
    """The robot's control rate (Hz) for the control-rate figures (None: no figures)."""
    compile_mode: str = "none"
    """``none`` (eager) or a ``torch.compile`` mode, applied to prefill and denoise only."""
    precision: str = "fp32"
    """Weights and activations: ``fp32`` or ``bf16``."""
    attention_implementation: str = "sdpa"
    """``sdpa`` or ``eager``."""
    n_warmup: int = 5
    """Calls before timing (the first pays for compilation)."""
    prompt_words: int = 24
    """pi05: words of the prompt (bounded by the model's ``prompt_max_length`` tokens)."""
    seed: int = 0
    """Seed of the weights and the noise."""
    check_memory: bool = True
    """Refuse a preset whose weights exceed the free memory."""
    device: str = "auto"
    """``auto`` (the GPU if any, else CPU), ``cpu``, ``cuda`` or ``cuda:<index>``."""

    def __post_init__(self) -> None:
        check_policy(self.policy, self.policy_args)
        choice("preset", self.preset, PRESETS)
        optional(integer, "num_cameras", self.num_cameras, low=1)
        integer("num_steps", self.num_steps, low=1)
        optional(integer, "chunk_size", self.chunk_size, low=1)
        optional(integer, "n_action_steps", self.n_action_steps, low=1)
        if self.chunk_size is not None and self.n_action_steps is not None and self.n_action_steps > self.chunk_size:
            raise ValueError(f"n_action_steps must be at most chunk_size={self.chunk_size}, got {self.n_action_steps}")
        _put(self, "control_hz", optional(number, "control_hz", self.control_hz, low=0, low_open=True))
        choice("compile_mode", self.compile_mode, compile_modes())
        choice("precision", self.precision, PRECISIONS)
        choice("attention_implementation", self.attention_implementation, ATTENTION_IMPLEMENTATIONS)
        integer("n_warmup", self.n_warmup, low=2 if self.compile_mode != "none" else 0)
        integer("prompt_words", self.prompt_words, low=1)
        seed("seed", self.seed)
        flag("check_memory", self.check_memory)
        check_device("device", self.device)


@dataclass(frozen=True, kw_only=True)
class DatasetSettings:
    """The robot dataset a run reads: a LeRobot v3.0 folder (``lerobot``), or the synthetic
    dataset of the other fields (written once, then cached)."""

    # The synthetic dataset's fields take the writer's defaults (SyntheticRobotConfig: one
    # source, so the two cannot drift as denoiser_sigma once did).
    num_episodes: int = SyntheticRobotConfig.num_episodes
    """Episodes."""
    episode_length: int = SyntheticRobotConfig.episode_length
    """Frames per episode."""
    image_size: int = SyntheticRobotConfig.image_size
    """Side of the camera frames in pixels."""
    num_cameras: int = SyntheticRobotConfig.num_cameras
    """Cameras per frame."""
    chunk_size: int = 8
    """Actions per training sample (the policy's chunk size in training)."""
    seed: int = SyntheticRobotConfig.seed
    """Seed of the trajectories."""
    video: bool = SyntheticRobotConfig.video
    """Synthetic camera frames as MP4 video (true) or as PNG images (false, for comparison)."""
    codec: str = SyntheticRobotConfig.codec
    """Codec of the synthetic videos: ``h264`` (libx264) or ``av1`` (libsvtav1)."""
    cache_dir: str = "outputs/datasets"
    """Folder of the cached datasets (relative to the working directory)."""
    lerobot: str | None = None
    """A local LeRobot v3.0 dataset folder to read instead of the synthetic dataset (nothing is
    downloaded; the synthetic fields are then unused, ``chunk_size`` still applies)."""

    key_prefix: InitVar[str] = "dataset."
    """How errors name this section's keys (``dataset.num_episodes``); the benchopt dataset,
    whose parameters a user types bare, passes ``""``. Not a setting (not in the YAML)."""

    def __post_init__(self, key_prefix: str) -> None:
        object.__setattr__(self, "key_prefix", key_prefix)
        integer(f"{self.key_prefix}chunk_size", self.chunk_size, low=1)
        if not isinstance(self.cache_dir, str) or not self.cache_dir:
            raise ValueError(f"{self.key_prefix}cache_dir must be a folder path, got {self.cache_dir!r}")
        if self.lerobot is not None and (not isinstance(self.lerobot, str) or not self.lerobot):
            raise ValueError(f"{self.key_prefix}lerobot must be a dataset folder path or null, got {self.lerobot!r}")
        seed(f"{self.key_prefix}seed", self.seed)
        self.synthetic()  # validates the rest

    def synthetic(self) -> SyntheticRobotConfig:
        """The writer's config."""
        return SyntheticRobotConfig(
            num_episodes=self.num_episodes,
            episode_length=self.episode_length,
            image_size=self.image_size,
            num_cameras=self.num_cameras,
            seed=self.seed,
            video=self.video,
            codec=self.codec,
            key_prefix=self.key_prefix,
        )

    def materialize(self) -> Path:
        """The dataset's folder: the ``lerobot`` folder, checked whole (every file, no frame
        decoded) so that a broken one is refused before any run starts; or the synthetic
        dataset, written if it is not cached yet."""
        from scopebench.policy.data.synthetic import cached_synthetic_dataset

        if self.lerobot is None:
            return cached_synthetic_dataset(self.cache_dir, self.synthetic())
        from scopebench.policy.data.lerobot import LeRobotFolder

        root = Path(self.lerobot).expanduser()
        if not root.is_dir():
            raise FileNotFoundError(f"{self.key_prefix}lerobot: no dataset folder at {root}")
        LeRobotFolder(root).check_videos()
        return root


@dataclass(frozen=True, kw_only=True)
class TrainLoopSettings:
    """``scopebench train``: how many steps, where the checkpoints go, how often to log and save."""

    output_dir: str = "outputs/train/run"
    """Folder of the run: ``checkpoints/<step>/`` and ``checkpoints/last``."""
    steps: int = 100
    """Optimizer steps in all (a resumed run continues up to this step)."""
    log_freq: int = 10
    """Print loss, samples/s and the phase means every this many steps."""
    save_freq: int = 0
    """Save a checkpoint every this many steps (0: only at the end; the end always saves)."""

    def __post_init__(self) -> None:
        if not isinstance(self.output_dir, str) or not self.output_dir:
            raise ValueError(f"training.output_dir must be a folder path, got {self.output_dir!r}")
        integer("training.steps", self.steps, low=1)
        integer("training.log_freq", self.log_freq, low=1)
        integer("training.save_freq", self.save_freq, low=0)


@dataclass(frozen=True)
class RunConfig:
    """A policy run config after overrides: one settings object per consumer."""

    train: TrainSettings
    inference: InferenceSettings
    dataset: DatasetSettings
    source: str = field(default="")
    """The file it came from."""
    training: TrainLoopSettings = field(default_factory=TrainLoopSettings)
    """The ``training:`` section (``scopebench train``)."""

    def to_yaml(self) -> str:
        """The config as a run config file (all values explicit): ``train_config.yaml``."""
        import yaml

        top = dataclasses.asdict(self.train)
        policy = {"factory": top.pop("policy")}  # the policy: key is the inference section
        policy.update((k, v) for k, v in dataclasses.asdict(self.inference).items() if k not in SHARED_KEYS)
        sections = {"policy": policy, "dataset": dataclasses.asdict(self.dataset)}
        sections["training"] = dataclasses.asdict(self.training)
        return yaml.safe_dump({**top, **sections}, sort_keys=False)


def settings_from(cls, source: Any, **extra: Any):
    """A settings dataclass from the fields found on ``source`` — a dict, or an object with
    attributes such as a benchopt solver — plus ``extra``; everything else is ignored.

    :Examples:

    >>> settings_from(TrainSettings, {"batch_size": 2, "profiler_mode": "custom"}, seed=3).batch_size
    2
    """
    missing = object()
    get = source.get if isinstance(source, dict) else (lambda key, default: getattr(source, key, default))
    values = {name: get(name, missing) for name in _fields(cls)}
    return cls(**{**{k: v for k, v in values.items() if v is not missing}, **extra})


def _fields(cls) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


def parse_overrides(args: list[str]) -> list[tuple[str, Any]]:
    """``--key=value`` / ``--section.key=value`` arguments as (dotted key, YAML value) pairs.

    :Examples:

    >>> parse_overrides(["--batch_size=12", "--policy.num_steps=5", "--fused_adamw=null"])
    [('batch_size', 12), ('policy.num_steps', 5), ('fused_adamw', None)]
    """
    pairs = []
    for arg in args:
        if not arg.startswith("--") or "=" not in arg:
            raise ValueError(f"expected an override --key=value, got {arg!r}")
        key, text = arg[2:].split("=", 1)
        pairs.append((key.replace("-", "_"), _scalar(text)))
    return pairs


def _scalar(text: str) -> Any:
    """A command-line value: an int, a float (``1e-3`` too, which YAML 1.1 reads as a
    string), else a YAML scalar (``true``, ``null``, words stay strings)."""
    for convert in (int, float):
        try:
            return convert(text)
        except ValueError:
            pass
    return load_yaml("a command-line value", text) if text else None


def _section(path: Path, name: str, value: Any) -> dict:
    """The ``name:`` section of the run config ``path`` as a mapping (absent or empty: ``{}``).

    >>> _section(Path("run.yml"), "training", 5)
    Traceback (most recent call last):
    ...
    ValueError: run.yml: section 'training' must be a mapping of settings (training:, then one 'key: value' per indented line), got 5
    """
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValueError(
            f"{path}: section {name!r} must be a mapping of settings ({name}:, then one 'key: value' per indented "
            f"line), got {quote(value)}"
        )
    return dict(value)


def load_run_config(path: str | Path, overrides: list[tuple[str, Any]] | None = None) -> RunConfig:
    """Read a policy run config and apply overrides; validates everything.

    Raises:
        FileNotFoundError: the file does not exist (the message names it).
        ValueError: an unknown key (in the file or an override) or an invalid value.
    """
    path = Path(path)
    raw = yaml_mapping(path, "policy config")
    factory = raw.pop("policy", None)
    if isinstance(factory, dict):  # the inference section, which may name the factory too
        raw["policy"], factory = factory, factory.pop("factory", None)
    sections = {name: _section(path, name, raw.pop(name, None)) for name in ("policy", "dataset", "training")}
    top = dict(raw)
    if factory is not None:
        top["policy"] = factory
    known = {
        "": _fields(TrainSettings),
        "policy": [k for k in _fields(InferenceSettings) if k not in SHARED_KEYS],
        "dataset": _fields(DatasetSettings),
        "training": _fields(TrainLoopSettings),
    }
    for section, values in (("", top), *sections.items()):
        unknown = sorted(set(values) - set(known[section]), key=repr)
        if unknown:
            where = f"section {section!r} of {path}" if section else str(path)
            raise ValueError(f"unknown key(s) {unknown} in {where}; expected some of {known[section]}")
    for key, value in overrides or []:
        section, _, name = key.rpartition(".")
        if section == "policy_args" and name.isidentifier():  # --policy_args.hidden=64
            top["policy_args"] = {**(top.get("policy_args") or {}), name: value}
            continue
        if section not in known or name not in known[section]:
            allowed = [k for k in known[""]] + [f"{s}.{k}" for s in ("policy", "dataset", "training") for k in known[s]]
            raise ValueError(f"unknown override key {key!r}; expected one of {allowed} or policy_args.<name>")
        (sections[section] if section else top)[name] = value
    train = TrainSettings(**top)
    shared = {k: getattr(train, k) for k in SHARED_KEYS}
    inference = InferenceSettings(**{**shared, **sections["policy"]})
    dataset = DatasetSettings(**sections["dataset"])
    training = TrainLoopSettings(**sections["training"])
    return RunConfig(train=train, inference=inference, dataset=dataset, source=str(path), training=training)
