"""``scopebench train``: train the policy for real, with logs, checkpoints and exact resume.

The run is one :class:`~scopebench.policy.run.train.PolicyTrainRun`, the training step of
``Pi05Train`` and ``profile-step`` (the same phases, the same backends), driven for
``training.steps`` optimizer steps::

    result = train_policy(config, resume_from=None)

Every rank, at the top of each iteration (outside the timed step), saves a checkpoint when
``training.save_freq`` divides the step (:func:`scopebench.train.checkpoint.save_checkpoint`:
a collective under DeepSpeed); rank 0 then logs every ``training.log_freq`` steps and
decides when to stop. The last step is always saved. A resumed run restores weights,
optimizer, LR schedule, every rank's RNG states, the step count and the data position (the
epoch and the batch within it: the sampler skips what was already seen, without loading
it), so it takes the steps the uninterrupted run would have taken.

A resume is exact or refused: :func:`check_resume` verifies the checkpoint (its manifest's
sizes and sha256, its step file, the settings of :func:`resume_settings` and the model
config) before anything is built; only the settings of
:data:`~scopebench.policy.checkpoint.RESUME_MAY_CHANGE` may differ,
and a changed ``training.steps`` / ``log_freq`` / ``save_freq`` is printed.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any, TextIO

from scopebench.policy.checkpoint import RESUME_MAY_CHANGE
from scopebench.policy.phases import TRAIN_PHASES
from scopebench.policy.settings import RunConfig

__all__ = ["TrainLog", "check_output_dir", "check_resume", "resume_settings", "train_policy"]

#: The allowed changes printed on resume (the others are where or how fast, not what).
_PRINTED_CHANGES = ("training.steps", "training.log_freq", "training.save_freq")


def check_output_dir(output_dir: str | Path, resume: bool) -> None:
    """Refuse to start a new run over an older run's checkpoints (they would be mixed).

    An older run is there when ``checkpoints/last`` is, or any finished checkpoint (one
    holding ``training_step.json``, which is written last: the test of
    :func:`scopebench.train.checkpoint.read_step_file`), even without ``last``. Folders a
    crashed save left unfinished are not results: a new run may write over them.

    Raises:
        ValueError: ``resume`` is false and ``output_dir`` holds an older run's checkpoints,
            naming the folder, the checkpoint and how to continue it.
    """
    from scopebench.train.checkpoint import CHECKPOINTS, CONFIG_FILE, LAST, STEP_FILE

    if resume:
        return
    checkpoints = Path(output_dir) / CHECKPOINTS
    last = checkpoints / LAST
    if last.exists() or last.is_symlink():
        raise ValueError(
            f"output_dir {output_dir} already holds checkpoints ({last} -> {last.readlink()}): pass --resume true "
            "to continue that run, or choose another --output_dir"
        )
    finished = sorted(p for p in checkpoints.glob("[!.]*") if (p / STEP_FILE).is_file()) if checkpoints.is_dir() else []
    if finished:
        raise ValueError(
            f"output_dir {output_dir} already holds checkpoints of an earlier run ({len(finished)} finished in "
            f"{checkpoints}, the newest {finished[-1].name}; no {LAST} link): pass --resume true --config "
            f"{finished[-1] / CONFIG_FILE} to continue that run, or choose another --output_dir"
        )


def resume_settings(config: RunConfig, world_size: int) -> dict[str, Any]:
    """The settings an exact resume needs unchanged: the training settings (top-level keys)
    and the dataset's (``dataset.<key>``), less :data:`RESUME_MAY_CHANGE`; ``nproc_per_node``
    is the run's number of ranks (what a launcher started, whatever the file says)."""
    train = {**dataclasses.asdict(config.train), "nproc_per_node": world_size}
    dataset = {f"dataset.{key}": value for key, value in dataclasses.asdict(config.dataset).items()}
    return {key: value for key, value in {**train, **dataset}.items() if key not in RESUME_MAY_CHANGE}


def check_resume(config: RunConfig, checkpoint: str | Path, world_size: int) -> None:
    """Refuse a checkpoint that would not resume ``config`` exactly; nothing is built.

    :func:`scopebench.train.checkpoint.verify_checkpoint` (step file, manifest, the settings
    of :func:`resume_settings`), then the model config of ``policy_config.json`` against the
    one the preset gives on this dataset now (a user policy: its factory and arguments).

    Raises:
        ValueError: in one line, naming the file, the key or the settings that differ.
    """
    import json

    from scopebench.policy.checkpoint import POLICY_CONFIG_FILE
    from scopebench.policy.data.dataset import RobotDataset
    from scopebench.policy.pi05 import config_for_dataset
    from scopebench.policy.run.checks import model_overrides
    from scopebench.train.checkpoint import verify_checkpoint

    checkpoint = Path(checkpoint)
    verify_checkpoint(checkpoint, settings=resume_settings(config, world_size))
    path = checkpoint / POLICY_CONFIG_FILE
    saved = json.loads(path.read_text())  # listed in the manifest: present and as written
    if config.train.policy != "pi05":  # a user policy: rebuilt by the same factory and arguments
        now = {"policy": config.train.policy, "policy_args": config.train.policy_args}
        if saved != now:
            raise ValueError(
                f"{path}: the checkpoint holds policy {saved}, not {now}: an exact resume needs the same model"
            )
        return
    dataset = RobotDataset(config.dataset.materialize(), chunk_size=config.dataset.chunk_size)
    model = config_for_dataset(config.train.preset, dataset, **model_overrides(config.train))
    now = {"preset": config.train.preset, "config": json.loads(json.dumps(dataclasses.asdict(model)))}
    if saved != now:
        was, want = saved.get("config", {}), now["config"]
        differ = [
            f"{key} {was.get(key)!r} in the checkpoint, {want.get(key)!r} now"
            for key in sorted(set(was) | set(want))
            if was.get(key) != want.get(key)
        ] or [f"preset {saved.get('preset')!r} in the checkpoint"]
        raise ValueError(
            f"{path}: the model config differs from preset {config.train.preset}'s on this dataset "
            f"({', '.join(differ)}): an exact resume needs the same model"
        )


def _allowed_changes(config: RunConfig, resume_from: str | Path) -> list[str]:
    """``resume: training.steps 10 -> 20 (allowed to change)`` for each printed allowed change
    against the checkpoint's ``train_config.yaml``."""
    from scopebench.train.checkpoint import CONFIG_FILE
    from scopebench.validate import load_yaml

    file = Path(resume_from) / CONFIG_FILE
    written = (load_yaml(file) or {}) if file.is_file() else {}  # the one YAML reader (duplicate keys refused)
    saved = written.get("training") if isinstance(written, dict) else None
    saved = saved if isinstance(saved, dict) else {}
    lines = []
    for key in _PRINTED_CHANGES:
        name = key.split(".", 1)[1]
        before, now = saved.get(name), getattr(config.training, name)
        if before is not None and before != now:
            lines.append(f"resume: {key} {before} -> {now} (allowed to change)")
    return lines


#: What ``scopebench train`` keeps of each trained step: its time, the host sampler's values and
#: the profiler's own cost (:mod:`scopebench.report.cost`'s columns).
_HOST_KEYS = (
    "total_time_sec",
    "step_time_sec",
    "host_other_cpu_pct",
    "host_steal_pct",
    "profiler_overhead_sec",
    "profiler_inside_sec",
    "profiler_sampler_cpu_sec",
)


class TrainLog:
    """Rank 0's callback: log every ``log_freq`` steps, stop after step ``steps``, or at once when
    the training step found a non-finite loss (``work.nonfinite``: every rank then stops).

    Each log line gives the step, the loss (mean over ranks of the last step), global
    samples/s and each phase's mean over the steps since the previous line.
    """

    def __init__(self, run: Any, *, start: int, steps: int, log_freq: int, out: TextIO, bar=None) -> None:
        self.run, self.start, self.steps, self.log_freq = run, start, steps, log_freq
        self.out, self.bar = out, bar
        self.window: list[dict[str, Any]] = []
        self.records: list[dict[str, Any]] = []
        #: Each trained step's time, host sampler values and profiler cost (``scopebench train``
        #: says how busy the machine was over them and what the profiler cost,
        #: :func:`scopebench.report.contention.measured_steps`, :func:`scopebench.report.cost.measured_cost`).
        self.host: list[dict[str, Any]] = []

    def __call__(self) -> bool:
        step = self.run.work.steps
        if step > self.start:
            metrics = self.run.metrics()
            if "total_time_sec" in metrics:
                self.window.append(metrics)
                self.host.append({k: metrics.get(k) for k in _HOST_KEYS})
            if self.bar is not None:
                self.bar.update(1)
            if step % self.log_freq == 0 or step == self.steps:
                self._log(step)
        return step < self.steps and self.run.work.nonfinite is None

    def _log(self, step: int) -> None:
        from scopebench.stats import mean

        if not self.window:
            return
        last = self.window[-1]
        phases = {p: mean([m[f"{p}_time_sec"] for m in self.window]) for p in TRAIN_PHASES}
        record = {
            "step": step,
            "train_loss": last.get("train_loss"),
            "samples_per_sec": mean([m["samples_per_sec"] for m in self.window]),
            "phases_mean_sec": phases,
        }
        self.records.append(record)
        loss = "nan" if record["train_loss"] is None else f"{record['train_loss']:.4f}"
        text = " ".join(f"{p}={sec * 1e3:.1f}ms" for p, sec in phases.items())
        line = f"step {step}/{self.steps} loss={loss} {record['samples_per_sec']:.1f} samples/s | {text}"
        (self.bar.write if self.bar is not None and not self.bar.disable else self._print)(line)
        self.window = []

    def _print(self, line: str) -> None:
        print(line, file=self.out, flush=True)


def train_policy(
    config: RunConfig, *, resume_from: str | Path | None = None, out: TextIO | None = None, accelerate_file: Any = None
) -> dict:
    """Train ``config`` on every rank of the current group; rank 0 logs to ``out``.

    ``accelerate_file``: the run's accelerate file as the command resolved it (its backend is the
    run's), else None: resolved by the run.

    A loss that is NaN or infinite on any rank (:mod:`scopebench.policy.run.nonfinite`) stops the
    run on every rank at the next iteration, and no checkpoint is saved of its step or a later one:
    each save first checks the steps not yet checked (:meth:`TrainStep.check`), so
    ``checkpoints/last`` stays on the last checkpoint whose losses were all finite.

    Returns:
        On every rank: ``start_step``, ``steps``, ``checkpoints`` (folders written),
        ``world_size``, ``accelerate_num_processes`` (what accelerate sees), ``backend``,
        ``log`` (rank 0's log records), ``host_samples`` (rank 0's: each trained step's
        ``total_time_sec``, ``step_time_sec``, ``host_other_cpu_pct``, ``host_steal_pct`` and the
        profiler's ``profiler_overhead_sec``, ``profiler_inside_sec``, ``profiler_sampler_cpu_sec``), ``nonfinite_loss`` (None, or the
        :meth:`~scopebench.policy.run.nonfinite.NonFiniteLoss.record` of the first non-finite
        loss, its ``message`` the line that says so and which checkpoint is kept).
    """
    from scopebench.policy.run.train import PolicyTrainRun
    from scopebench.policy.tools import data_root, progress_bar
    from scopebench.profiler import ProfilerConfig

    out = sys.stdout if out is None else out
    loop = config.training
    root = data_root(config)
    run = PolicyTrainRun(
        config.train,
        dataset_root=root,
        chunk_size=config.dataset.chunk_size,
        profiler=ProfilerConfig(mode="custom"),
        output_dir=loop.output_dir,
        name="train",
        resume_from=resume_from,
        accelerate_file=accelerate_file,
    )
    saved: list[str] = []
    with run:
        main = run.rank == 0
        start = run.work.steps
        to_save = dataclasses.replace(config, train=dataclasses.replace(config.train, nproc_per_node=run.world_size))
        must_match = resume_settings(config, run.world_size)
        if main:
            _print_header(run, config, start, resume_from, out)

        def save() -> None:
            if run.work.check() is not None:  # a collective, like the save: never a checkpoint of NaN weights
                return
            path = run.save_checkpoint(
                loop.output_dir, files={"train_config.yaml": to_save.to_yaml()}, settings=must_match
            )
            saved.append(str(path))
            if main:
                print(f"saved {path}", file=out, flush=True)

        def save_if_due() -> None:
            step = run.work.steps
            if step > start and loop.save_freq and step % loop.save_freq == 0:
                save()

        with progress_bar(max(0, loop.steps - start), "train", enabled=main) as bar:
            log = TrainLog(run, start=start, steps=loop.steps, log_freq=loop.log_freq, out=out, bar=bar)
            if start < loop.steps:
                run.loop(log, before_callback=save_if_due)
        if run.work.steps > start and (not loop.save_freq or run.work.steps % loop.save_freq):  # not saved yet
            save()
        if main and start >= loop.steps:
            print(f"nothing to do: the checkpoint is at step {start}, training.steps={loop.steps}", file=out)
        stopped = run.work.nonfinite
        return {
            "start_step": start,
            "steps": run.work.steps,
            "checkpoints": saved,
            "world_size": run.world_size,
            "accelerate_num_processes": run.accelerator.num_processes,
            "backend": run.settings.backend,
            "log": log.records,
            "host_samples": log.host,
            "nonfinite_loss": None if stopped is None else _stopped(stopped, loop.output_dir),
        }


def _stopped(found: Any, output_dir: str | Path) -> dict[str, Any]:
    """The record of a run stopped at a non-finite loss, its ``message`` naming the checkpoint
    kept: ``step 3: loss term 'mse_loss' is nan (train_loss nan): stopped; the last checkpoint,
    step 2, is kept as <output_dir>/checkpoints/last``."""
    from scopebench.train.checkpoint import CHECKPOINTS, LAST, read_step_file

    last = Path(output_dir) / CHECKPOINTS / LAST
    kept = "no checkpoint was written"
    if last.exists():
        kept = f"the last checkpoint, step {read_step_file(last)['step']}, is kept as {last}"
    record = found.record()
    return {**record, "message": f"{record['message']}: stopped; {kept}"}


def _print_header(run: Any, config: RunConfig, start: int, resume_from: Any, out: TextIO) -> None:
    from scopebench.policy.tools import policy_label
    from scopebench.train import settings_in_force

    s = run.settings
    file = run.accelerate_file
    lines = [
        f"scopebench train: {policy_label(s)} ranks={run.world_size} backend={s.backend} "
        f"(accelerate config {file.path})",
        f"phases: {run.backend.describe_phases()}",
        "in force: " + "; ".join(settings_in_force(file, s)),
        f"global batch: {run.global_batch_size} = batch_size {s.batch_size} x {run.world_size} ranks x "
        f"{s.gradient_accumulation_steps} accumulation",
        f"output: {config.training.output_dir} (save every {config.training.save_freq or 'end'}, "
        f"log every {config.training.log_freq})",
    ]
    if resume_from is not None:
        state = run.training_state()
        lines.append(
            f"resumed from {resume_from} at step {start} (epoch {state['epoch']}, batch {state['position']} "
            "of it: the data order continues where it stopped)"
        )
        lines += _allowed_changes(config, run.resume_from)
    print("\n".join(lines), file=out, flush=True)
