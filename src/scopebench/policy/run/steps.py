"""One training step, one dataloader step and one action-chunk inference, in named phases.

The run objects (:mod:`~scopebench.policy.run.train`, :mod:`~scopebench.policy.run.inference`)
call these with a profiler; each phase is a profiler region, named as
:mod:`scopebench.policy.phases` lists them (with what each holds per backend). The model
itself never sees the profiler (docs/style.md rule 3).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import torch

from scopebench.policy.pi05.model import Pi05Policy
from scopebench.policy.run.nonfinite import NonFiniteLoss

__all__ = [
    "MEMORY_KEYS",
    "BatchStream",
    "DataloaderStep",
    "InferenceStep",
    "TrainStep",
    "validation_loss",
]

#: Per-rank memory peaks gathered in ``sync_gather``, after the loss and its terms.
MEMORY_KEYS = ("max_rss_mb", "max_gpu_mb")
#: Loss gathers a training step keeps in flight before it takes those that have completed itself
#: (a driver that reads the losses, a save or the loop's end takes them before): the values of a
#: run that nobody reads stay bounded, taken in one batch every this many gathers.
IN_FLIGHT_MAX = 64


class BatchStream:
    """Endless batches from a dataloader: a new epoch starts when one ends.

    It counts where it is, for checkpoints: :attr:`epoch` (epochs finished) and
    :attr:`position` (batches taken in the current epoch).
    """

    def __init__(self, loader: Iterable) -> None:
        self.loader = loader
        self._iter: Iterator | None = None
        self.epoch = 0
        self.position = 0

    def __iter__(self) -> BatchStream:
        return self

    def __next__(self) -> Mapping:
        if self._iter is None:
            self._iter = iter(self.loader)
        try:
            batch = next(self._iter)
        except StopIteration:
            self.epoch, self.position = self.epoch + 1, 0
            self._iter = iter(self.loader)
            batch = next(self._iter)
        self.position += 1
        return batch

    def state(self) -> dict[str, int]:
        """``{"epoch", "position"}``: what :meth:`resume` needs."""
        return {"epoch": self.epoch, "position": self.position}

    def resume(
        self,
        epoch: int,
        position: int,
        sampler: Any,
        samples_per_batch: int,
        *,
        taken: int | None = None,
        source: str = "training_step.json",
    ) -> None:
        """Continue at batch ``position`` of epoch ``epoch``, as if never interrupted.

        Args:
            epoch: Epochs finished when the state was saved.
            position: Batches taken in that epoch.
            sampler: The loader's index sampler (``skip_next``/``set_epoch``).
            samples_per_batch: Indices the sampler yields per batch of this rank (all ranks'
                batches: accelerate hands each rank every ``world_size``-th batch).
            taken: Batches the saved steps took (steps x accumulation), a bound on ``epoch``
                and ``position`` (None: not checked).
            source: Where ``epoch`` and ``position`` come from, for the messages.

        Raises:
            ValueError: ``position`` is more than an epoch's batches, or ``epoch`` and
                ``position`` more batches than ``taken``: the data order cannot continue
                there (an edited file, another dataset), naming ``source`` and the key.
        """
        if self._iter is not None:
            raise RuntimeError("resume() must come before the first batch")
        per_epoch = len(self.loader)
        if position > per_epoch:
            raise ValueError(
                f"{source}: position {position} is more than the {per_epoch} batches of an epoch of this run: the "
                "data order cannot continue there (the file was edited, or the data changed); refused"
            )
        if taken is not None and epoch * per_epoch + position > taken:
            raise ValueError(
                f"{source}: epoch {epoch}, position {position} is {epoch * per_epoch + position} batches of "
                f"{per_epoch} per epoch, more than the {taken} the saved steps took: the data order cannot continue "
                "there (the file was edited); refused"
            )
        if position >= per_epoch:  # saved at the end of an epoch: the next one starts
            epoch, position = epoch + 1, 0
        set_epoch = getattr(self.loader, "set_epoch", None) or sampler.set_epoch
        set_epoch(epoch)
        sampler.skip_next(position * samples_per_batch)
        self.epoch, self.position = epoch, position


class TrainStep:
    """One optimizer step of a model prepared by an ``accelerate.Accelerator``.

    Args:
        accelerator: The run's accelerator (autocast, and what the backend's hooks use).
        backend: The run's :class:`~scopebench.train.backends.TrainingBackend` (None: the default,
            ``ddp``): its step hooks run each micro-batch's gradient sync and backward, the
            clipping, the optimizer step and ``zero_grad`` (``micro_batch``, ``backward``,
            ``clip``, ``optimizer_step``, ``zero_grad``); the step itself never asks which backend it is.
        model: The prepared model (DDP-wrapped with several ranks, DeepSpeed's engine, or the
            model sharded in place by FSDP2's ``fully_shard``).
        optimizer: The prepared optimizer, or None (``no_optim``: gradients are dropped).
        scheduler: The prepared LR scheduler, or None.
        batches: Endless dataloader batches.
        prepare: Batch -> model inputs on the device (the policy's ``preprocess``, or the copy).
        loss: ``(model, inputs) -> (loss, {name: term})`` (:func:`scopebench.policy.calls.policy_loss`).
        grad_clip: Maximum global gradient norm; 0 disables clipping (DeepSpeed clips
            inside its ``step`` from its own config).
        gather_every: Gather loss terms and peaks every this many steps.
        accumulation: Micro-batches per optimizer step.
        memory: ``() -> (rss_mb, gpu_mb)`` of this rank, read in ``sync_gather``.

    Each gather carries the loss and terms of every step since the previous gather. It is
    started in ``sync_gather`` and never waited for there: an asynchronous all-gather (on CUDA
    followed by a copy to pinned host memory, both queued behind the step's own work), so the step
    adds no host-device synchronisation and no wait for the other ranks.
    Reading :attr:`gathered` or :attr:`nonfinite`, or calling :meth:`check` (before a
    checkpoint, at the loop's end), takes every gather started, waiting for those not complete,
    and checks them on the host (:mod:`scopebench.policy.run.nonfinite`): the first step whose
    loss is not finite becomes :attr:`nonfinite`, the same record on every rank since every rank
    reads the same gathered values. The callers do it outside the step's clock (a callback that
    logs every step therefore waits every step, in its own time). Gathers nobody reads are taken
    by the step itself once :data:`IN_FLIGHT_MAX` are in flight, those complete only (no wait).
    Under a profiler whose ``async_collectives`` is false (the torch backend: a collective running
    when its cycle stops races kineto) the step waits for its gather in ``sync_gather``, as before.
    """

    def __init__(
        self,
        *,
        accelerator: Any,
        model: torch.nn.Module,
        backend: Any = None,
        optimizer: Any,
        scheduler: Any,
        batches: Iterator,
        prepare: Callable[[Any], Any],
        loss: Callable[[torch.nn.Module, Any], tuple[torch.Tensor, Mapping]],
        grad_clip: float,
        gather_every: int = 1,
        accumulation: int = 1,
        memory: Callable[[], tuple[float, float]] = lambda: (0.0, 0.0),
    ) -> None:
        self.accelerator = accelerator
        self.model = model
        self.optimizer = optimizer
        #: accelerate's autocast, a fresh context manager a step, only where it casts.
        self._autocast = accelerator.autocast if accelerator.mixed_precision != "no" else contextlib.nullcontext
        #: One process: the gather is the host sync of the values alone.
        self._alone = accelerator.num_processes == 1
        self.scheduler = scheduler
        self.batches = batches
        self.prepare = prepare
        self.loss = loss
        self.grad_clip = grad_clip
        self.gather_every = gather_every
        self.accumulation = accumulation
        self.memory = memory
        if backend is None:
            from scopebench.train.backends import DEFAULT_BACKEND, get_backend

            backend = get_backend(DEFAULT_BACKEND)
        #: The run's backend: its hooks run the backward, clipping, optimizer step and zero_grad.
        self.backend = backend
        #: What the backend's hooks act on (built once).
        self.parts = backend.step_parts(accelerator, model, optimizer, grad_clip=grad_clip, accumulation=accumulation)
        #: DeepSpeed's engine (the prepared model) under ZeRO, else None.
        self.engine = backend.engine(model)
        #: The global gradient norm before clipping at the last step (a tensor; None without clipping).
        self.grad_norm: torch.Tensor | None = None
        self.params = self.parts.params
        self.steps = 0
        #: The gathered names: ``train_loss`` and the loss's terms (fixed at the first gather).
        self.loss_keys: tuple[str, ...] | None = None
        self._gathered: list[dict[str, float]] | None = None
        self._nonfinite: NonFiniteLoss | None = None
        #: The steps not gathered yet: (step, its micro-batches' detached loss and terms).
        self._unchecked: list[tuple[int, list]] = []
        #: Gathers started and not taken yet, oldest first.
        self._in_flight: list[_Gather] = []

    def __call__(self, prof) -> None:
        backend, parts = self.backend, self.parts
        if not self.model.training:  # train() walks every module: 0.4 ms a step on PaliGemma, 2.5 % of it
            self.model.train()
        losses: list[tuple[torch.Tensor, Mapping[str, torch.Tensor]]] = []
        for micro in range(self.accumulation):
            last = micro == self.accumulation - 1
            with prof.track_step("dataload_wait"):
                inputs = self.prepare(next(self.batches))
            with backend.micro_batch(parts, last):  # DDP: the gradients are all-reduced on the last only
                with prof.track_step("forward"):
                    with self._autocast():
                        loss, terms = self.loss(self.model, inputs)
                with prof.track_step("bwd"):
                    backend.backward(parts, loss, last)
            losses.append((loss.detach(), {k: torch.as_tensor(v).detach() for k, v in terms.items()}))
        with prof.track_step("unscale_clip"):
            norm = backend.clip(parts)
            if norm is not None:
                self.grad_norm = norm
        with prof.track_step("optim_step"):
            backend.optimizer_step(parts)
        with prof.track_step("zero_grad_sched"):
            backend.zero_grad(parts)
            if self.scheduler is not None:
                self.scheduler.step()
        self._unchecked.append((self.steps + 1, losses))
        with prof.track_step("sync_gather"):
            if self.steps % self.gather_every == 0:
                self._start_gather()
            if not getattr(prof, "async_collectives", True):  # the torch profiler's cycles
                self._take(wait=True)
            elif len(self._in_flight) >= IN_FLIGHT_MAX:  # nobody read them: take those done, at once
                self._take(wait=False)
        self.steps += 1

    @property
    def gathered(self) -> list[dict[str, float]] | None:
        """Every rank's loss, terms and :data:`MEMORY_KEYS` at the last gather started (rank
        order), or None before the first; waits for the gathers in flight."""
        self._take(wait=True)
        return self._gathered

    @property
    def nonfinite(self) -> NonFiniteLoss | None:
        """The first non-finite loss among the steps gathered so far (the same on every rank), or
        None; waits for the gathers in flight (the steps not gathered yet: :meth:`check`)."""
        self._take(wait=True)
        return self._nonfinite

    def check(self) -> NonFiniteLoss | None:
        """Gather the steps not gathered yet now, wait for every gather, then :attr:`nonfinite`.

        A collective when there are several ranks: every rank calls it at the same step (they
        all hold the same unchecked steps). ``scopebench train`` calls it before each save, so
        with ``gather_every > 1`` no checkpoint is written after a non-finite loss either.
        """
        if self._unchecked:
            self._start_gather()
        return self.nonfinite

    def _start_gather(self) -> None:
        pending, self._unchecked = self._unchecked, []
        steps = [_mean_over_micro_batches(losses) for _, losses in pending]
        loss, terms = steps[-1]
        if self.loss_keys is None:  # every rank runs the same loss: the same names, in this order
            self.loss_keys = ("train_loss", *sorted(terms))
        keys = self.loss_keys
        rss, gpu = self.memory()
        device = loss.device
        nan = torch.tensor(float("nan"), device=device)
        # the loss and terms of every step since the last gather, the last step's last: with
        # gather_every 1 exactly the values logged, and no more device work for the check
        values = [
            value
            for step_loss, step_terms in steps
            for value in (step_loss.float(), *(step_terms.get(key, nan).to(device).float() for key in keys[1:]))
        ]
        peaks = torch.tensor([rss, gpu], device=device)
        mine = torch.cat([torch.stack(values), peaks])
        self._in_flight.append(_Gather(mine, None if self._alone else self.world_size, [s for s, _ in pending]))

    def _take(self, wait: bool) -> None:
        """Check the gathers that have completed (``wait``: every one started), oldest first."""
        while self._in_flight and (wait or self._in_flight[0].ready()):
            gather = self._in_flight.pop(0)
            rows, keys = gather.rows(), self.loss_keys
            last = len(keys) + len(MEMORY_KEYS)
            self._gathered = [dict(zip(keys + MEMORY_KEYS, row[-last:])) for row in rows]
            if self._nonfinite is None:
                self._nonfinite = _first_nonfinite(rows, gather.steps, keys, self.gather_every)

    @property
    def world_size(self) -> int:
        return self.accelerator.num_processes


class _Gather:
    """Every rank's values (a 1-D float tensor per rank) gathered without waiting: started here,
    :meth:`ready` polls, :meth:`rows` takes them.

    Gloo: ``all_gather`` into one tensor per rank, asynchronous (gloo's own threads run it), its
    completion polled on its future. NCCL: ``all_gather_into_tensor``; its
    ``Work.wait`` only makes the current stream wait for it (not the host), then a copy to pinned
    host memory and an event are queued behind it, and :meth:`ready` queries the event: nothing
    here waits for the device. One process: nothing to gather (on CUDA the copy and event alone).

    Args:
        mine: This rank's values.
        world_size: Ranks to gather from; None: this process alone.
        steps: The optimizer steps whose losses the values hold.
    """

    def __init__(self, mine: torch.Tensor, world_size: int | None, steps: list[int]) -> None:
        self.steps = steps
        self._width = mine.numel()
        self._work: Any = None
        self._event: Any = None
        out: Any = mine
        nccl = False
        if world_size is not None:
            import torch.distributed as dist

            nccl = dist.get_backend() == "nccl"
            if nccl:
                from scopebench.profiler.collectives import recorder

                out = torch.empty(world_size * self._width, dtype=mine.dtype, device=mine.device)
                with recorder.completion_at_wait():
                    self._work = dist.all_gather_into_tensor(out, mine, async_op=True)
                self._work.wait()  # NCCL: a stream dependency, the host goes on
            else:  # gloo has no all_gather_into_tensor
                out = [torch.empty_like(mine) for _ in range(world_size)]
                from scopebench.profiler.collectives import recorder

                with recorder.completion_at_wait():  # no Python callback on gloo's thread
                    self._work = dist.all_gather(out, mine, async_op=True)
        if mine.is_cuda and (self._work is None or nccl):
            flat = torch.cat(out) if isinstance(out, list) else out
            out = torch.empty(flat.shape, dtype=flat.dtype, pin_memory=True)
            out.copy_(flat, non_blocking=True)
            self._event = torch.cuda.Event()
            self._event.record()
            self._work = None
        self._out = out

    def ready(self) -> bool:
        """Whether :meth:`rows` would return without waiting."""
        if self._event is not None:
            return bool(self._event.query())
        return self._work is None or self._work.get_future().done()

    def rows(self) -> list[list[float]]:
        """Every rank's values in rank order, waiting for them if need be (a ``Work.wait``, which
        the ledger sees as the rank blocked, only then)."""
        if self._event is not None:
            self._event.synchronize()
        elif self._work is not None:
            future = self._work.get_future()
            if future.done():
                future.value()  # a failed gather raises its error here
            else:
                self._work.wait()
        out = self._out
        flat = torch.cat(out) if isinstance(out, list) else out
        return flat.view(-1, self._width).tolist()


def _first_nonfinite(
    rows: list[list[float]], steps: list[int], keys: tuple[str, ...], gather_every: int
) -> NonFiniteLoss | None:
    """The first step whose loss (``keys[0]``) is not finite in the gathered ``rows`` (per rank:
    each step's loss and terms, in ``keys`` order, then the memory peaks), on the lowest rank;
    None when every loss is finite. Every rank holds the same rows: every rank finds the same.

    The term named is the first of that step's terms that is not finite on that rank, else the
    loss itself: a NaN loss is most often one term's NaN. A term that is not finite while the
    loss is (a logged diagnostic; NaN also stands for a term a step lacks) stops nothing.

    :Examples:

    >>> nan = float("nan")
    >>> rows = [[1.0, 0.5, 0.5, nan, 0.2, nan, 0.0, 0.0], [1.0, 0.5, 0.5, 2.0, nan, 2.0, 0.0, 0.0]]
    >>> _first_nonfinite(rows, [3, 4], ("train_loss", "a", "b"), 2).describe()
    "step 4: loss term 'b' is nan on rank 0 (train_loss nan)"
    """
    width = len(keys)
    for index, step in enumerate(steps):
        for rank, row in enumerate(rows):
            loss, *terms = row[index * width : (index + 1) * width]
            if math.isfinite(loss):
                continue
            bad = [(key, value) for key, value in zip(keys[1:], terms) if not math.isfinite(value)]
            term, value = bad[0] if bad else (keys[0], loss)
            return NonFiniteLoss(
                step=step,
                term=term,
                value=value,
                train_loss=loss,
                rank=rank,
                world_size=len(rows),
                checked_at=steps[-1],
                gather_every=gather_every,
            )
    return None


def _mean_over_micro_batches(losses):
    """The step's loss and loss terms: their means over its micro-batches."""
    if len(losses) == 1:
        return losses[0]
    loss = torch.stack([loss for loss, _ in losses]).mean()
    terms = {key: torch.stack([t[key] for _, t in losses]).mean() for key in losses[0][1]}
    return loss, terms


class DataloaderStep:
    """One batch of the training dataloader, without a model: ``fetch``, ``decode``, ``h2d``.

    ``h2d`` is the host preprocessing and the copy to the device (``prepare``), exactly what
    ``dataload_wait`` adds to the fetch in :class:`TrainStep`. ``decode`` is the camera-frame
    decoding that ran in this process during the fetch (with 0 workers), taken out of
    ``fetch``'s time; with workers it runs in them and the region is absent.
    :attr:`decode_sec` and :attr:`decoded_frames` add up the decoding of every batch so far,
    wherever it ran (the samples' ``decode_time_sec``, in a dict batch of the robot dataset),
    and the camera frames decoded (``cameras`` per sample).
    """

    def __init__(
        self, batches: Iterator, prepare: Callable[[Any], Any], decoder: str | None = None, cameras: int = 0
    ) -> None:
        self.batches = batches
        self.prepare = prepare
        #: What decodes the frames (the dataset's ``decoder``: ``pyav``, ``pil``), for the reports.
        self.decoder = decoder
        self.cameras = cameras
        self.decode_sec = 0.0
        self.decoded_frames = 0
        #: Whether the loader decodes in this process (no workers): then ``decode`` is measured.
        self.decodes_here = getattr(getattr(batches, "loader", None), "num_workers", None) == 0

    def __call__(self, prof) -> None:
        from scopebench.policy.data.dataset import decode_seconds
        from scopebench.policy.phases import DECODE_PHASE

        before = decode_seconds()
        with prof.track_step("fetch"):
            batch = next(self.batches)
        if self.decodes_here:
            prof.split_region("fetch", DECODE_PHASE, decode_seconds() - before)
        per_sample = batch.pop("decode_time_sec", None) if isinstance(batch, dict) else None
        if per_sample is not None:
            self.decode_sec += float(per_sample.sum())
            self.decoded_frames += per_sample.numel() * self.cameras
        with prof.track_step("h2d"):
            self.prepare(batch)


class InferenceStep:
    """One inference call on one observation, in its phases.

    ``preprocess`` (host observation -> model inputs on the device), ``prefill`` (when the
    policy has one: the once-per-call part, pi05's prefix KV cache), ``denoise`` (the
    policy's ``sample``: the ``num_steps`` loop) and ``postprocess`` (the output on the host).

    Args:
        observation: A host observation (the policy's ``observation(1)``).
        prepare: Observation -> model inputs on the device.
        sample: ``(state, num_steps) -> output``, where ``state`` is what ``prefill`` returned,
            else the prepared inputs (compiled by the run object when asked).
        num_steps: Steps per call (a call may override it).
        prefill: ``inputs -> state``, or None (no ``prefill`` phase).
        postprocess: Output -> the result on the host.
        model: The model (put in eval mode before each call).
        compiled: The callables are ``torch.compile``d: each call starts a new CUDA-graph
            step (``reduce-overhead``), so the previous call's graph outputs may be reused.
        reset: A stateful policy's ``() -> initial state`` (:attr:`UserPolicy.reset`): ``sample``
            then takes ``(inputs, num_steps, state)`` and returns ``(output, new state)``, and
            the state goes from one call to the next until :meth:`reset` starts an episode.
    """

    def __init__(
        self,
        observation: Any,
        *,
        prepare: Callable[[Any], Any],
        sample: Callable[[Any, int], Any],
        num_steps: int,
        postprocess: Callable[[Any], Any],
        model: torch.nn.Module,
        prefill: Callable[[Any], Any] | None = None,
        compiled: bool = False,
        reset: Callable[[], Any] | None = None,
    ) -> None:
        self.observation = observation
        self.start_episode = reset
        #: The stateful policy's state, carried from call to call (:meth:`reset` starts it).
        self.state: Any = None
        #: Calls since the episode began.
        self.position = 0
        self.prepare = prepare
        self.sample = sample
        self.num_steps = num_steps
        self.prefill = prefill
        self.postprocess = postprocess
        self.model = model
        self.compiled = compiled

    @torch.inference_mode()
    def __call__(self, prof, num_steps: int | None = None) -> Any:
        """One call: the postprocessed output (pi05: the action chunk in dataset units, on the CPU)."""
        if self.model.training:  # eval() walks every module
            self.model.eval()
        if self.compiled:
            torch.compiler.cudagraph_mark_step_begin()
        with prof.track_step("preprocess"):
            state = self.prepare(self.observation)
        if self.prefill is not None:
            with prof.track_step("prefill"):
                state = self.prefill(state)
        with prof.track_step("denoise"):
            if self.start_episode is None:
                output = self.sample(state, num_steps or self.num_steps)
            else:
                output, self.state = self.sample(state, num_steps or self.num_steps, self.state)
        self.position += 1
        with prof.track_step("postprocess"):
            return self.postprocess(output)

    @torch.inference_mode()
    def reset(self) -> None:
        """Start an episode: a stateful policy's initial state, and position 0."""
        self.position = 0
        if self.start_episode is not None:
            self.state = self.start_episode()


def validation_loss(model: Pi05Policy, batch: Mapping, stats: Mapping | None, seed: int = 0) -> float:
    """pi05's loss on ``batch`` (a dataloader batch of its robot dataset, with ``stats``), its
    noise and times fixed by ``seed``: :func:`scopebench.policy.calls.validation_loss` of the
    pi05 policy around ``model``, as the training run computes it."""
    from scopebench.policy.calls import validation_loss as policy_validation_loss
    from scopebench.policy.pi05.runner import Preprocessor
    from scopebench.policy.user import UserPolicy

    def preprocess(batch: Mapping, device: torch.device) -> dict:
        return Preprocessor(model.config, stats, device, next(model.parameters()).dtype).preprocess(batch)

    policy = UserPolicy(model=model, loss=lambda m, obs: m(obs), dataset=[None], preprocess=preprocess)
    return policy_validation_loss(policy, model, batch, seed)
