"""Memory by category at each region's peak, per rank: ``profiler_memory: true``.

torch's own trackers do the accounting: :class:`torch.distributed._tools.mem_tracker.MemTracker`
(a ``TorchDispatchMode`` that sees every tensor the step creates, plus the model and
optimizer it is told about) and, for a model sharded by FSDP2's ``fully_shard``,
:class:`~torch.distributed._tools.fsdp2_mem_tracker.FSDPMemTracker`. A run object tells the
profiler what it trains once, after building (:meth:`scopebench.profiler.Profiler.track_memory`);
the tracker is entered at the start of every recorded iteration and left at its end (it
refuses a second iteration until ``reset_mod_stats()``, which each iteration calls).

Categories (:data:`CATEGORIES`, bytes alive at the peak):

* ``parameters`` (FSDP2, ZeRO-3: this rank's shard; ZeRO's flat parameter groups),
* ``gradients`` (ZeRO: the gradient partitions; FSDP2: the sharded gradients),
* ``optimizer_state`` (AdamW's moments; ZeRO-2's fp32 master partition),
* ``activations`` (what the forward creates, the inputs included),
* ``temporaries`` (created in the backward, after it outside any module, or inside the
  optimizer's step and not kept in its state),
* ``buffers`` (module buffers),
* ``gather_buffers`` (communication buffers: FSDP2's and ZeRO-3's gathered parameters,
  all-gather and reduce-scatter buffers, ZeRO's and DDP's gradient buckets),
* ``other`` (on CUDA, allocated memory no tracker attributes: libraries' tensors, buffers
  made before tracking and never touched in the step; never dropped).

Under DeepSpeed the engine's own buffers are labelled from what the engine knows
(:func:`scopebench.profiler.memory_tracker.engine_labels`), and everything ZeRO-3's parameter coordinator allocates while it
fetches a module's parameters is a gather buffer.

Metrics of a recorded iteration (MB, 1e6 bytes): ``<region>_mem_<category>_mb`` and
``<region>_mem_peak_mb`` at the region's peak; ``mem_<category>_mb`` and ``mem_peak_mb`` at
the step's; on CUDA also ``<region>_mem_allocated_peak_mb``, ``<region>_mem_reserved_peak_mb``,
``mem_allocated_peak_mb``, ``mem_reserved_peak_mb``, ``mem_fragmentation_pct`` (reserved −
allocated over the allocated peak), ``num_alloc_retries`` and ``num_ooms`` (the allocator's
counters since the process started); and ``profiler_memory_overhead_sec``: the tracker's own
bookkeeping during the step (every operation's accounting, every module hook, entering and
leaving), timed inside it. Across ranks (:func:`cross_rank_memory`) rank 0 reports the worst
rank's breakdown, each rank's ``mem_peak_mb_rank<r>`` and ``mem_<category>_mb_rank<r>`` (at
that rank's step peak: the report's bars per rank) and ``mem_rank_imbalance_pct``.
"""

from __future__ import annotations

import time
from typing import Any

from scopebench.profiler.device import MB
from scopebench.profiler.memory_tracker import CATEGORIES, by_category, category_of, engine_labels, make_tracker

__all__ = ["CATEGORIES", "MemoryTracking", "category_of", "cross_rank_memory"]


def _torch_optimizer(optimizer: Any) -> Any:
    """The innermost ``torch.optim.Optimizer`` of a wrapped one (accelerate's, DeepSpeed's ZeRO
    optimizer around the torch one), or None."""
    import torch

    seen = 0
    while optimizer is not None and seen < 4 and getattr(optimizer, "optimizer", None) is not None:
        optimizer, seen = optimizer.optimizer, seen + 1
    return optimizer if isinstance(optimizer, torch.optim.Optimizer) else None


class MemoryTracking:
    """The per-region memory breakdown of one rank; the profiler drives it.

    Args:
        device: The device the step computes on (its tracker snapshot is the one reported).
        model: The trained model (the prepared one: DDP-wrapped, DeepSpeed's engine or sharded).
        optimizer: The optimizer, or None.
        engine: DeepSpeed's engine under ZeRO (its buffers are labelled), else None.
        cuda: The ``torch.cuda`` to read allocator statistics from (tests pass a recorder);
            None on the CPU.
    """

    def __init__(
        self,
        device: Any,
        model: Any,
        optimizer: Any = None,
        engine: Any = None,
        cuda: Any = None,
        run_name: Any = None,
    ):
        import torch

        self.device = torch.device(device)
        self.cuda = cuda
        self.engine = engine
        optimizer = _torch_optimizer(optimizer)
        self.tracker = make_tracker(model, optimizer)
        self.tracker.zero = engine is not None
        self._external = [x for x in (model, optimizer) if x is not None]
        self._wrap_ddp(model)
        if optimizer is not None:  # what the optimizer steps on is a gradient (ZeRO's flat fp32 partition too)
            optimizer.register_step_pre_hook(self._label_gradients)
        self.history = None
        if cuda is not None:
            from scopebench.profiler.memory_history import MemoryHistory

            self.history = MemoryHistory(cuda, run_name or (lambda: (".", "run")))
        self._last_good: dict[str, float] | None = None
        self._wrap_zero3_fetch(engine)
        self._regions: dict[str, dict[str, float]] = {}
        self._step: dict[str, float] = dict.fromkeys(CATEGORIES, 0.0)
        self._outside_sec = 0.0
        self._active = False

    # -- set-up ------------------------------------------------------------------------
    def _wrap_zero3_fetch(self, engine: Any) -> None:
        """Everything ZeRO-3's coordinator allocates while fetching a module's parameters is
        a gather buffer (the gathered parameters)."""
        zero = getattr(engine, "optimizer", None)
        offload = getattr(zero, "parameter_offload", None)
        coordinator = getattr(offload, "get_param_coordinator", None)
        if coordinator is None:
            return
        coordinator = coordinator()
        coordinator.fetch_sub_module = self._gathering(coordinator.fetch_sub_module)

    def _wrap_ddp(self, model: Any) -> None:
        """DDP's gradient buckets are gather buffers: the ones it rebuilds before its second
        forward (``_pre_forward``) and the ones made before tracking, met in the backward."""
        from torch.nn.parallel import DistributedDataParallel

        if isinstance(model, DistributedDataParallel):
            self.tracker.ddp = True
            model._pre_forward = self._gathering(model._pre_forward)

    def _gathering(self, method):
        """``method`` with every tensor it allocates labelled a gather buffer."""
        tracker = self.tracker

        def gathering(*args, **kwargs):
            tracker.gathering += 1
            try:
                return method(*args, **kwargs)
            finally:
                tracker.gathering -= 1

        return gathering

    def _label_gradients(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if not self._active:
            return
        ref = self.tracker.ref_of("gradients")
        for group in optimizer.param_groups:
            for param in group["params"]:
                if param.grad is not None:
                    self.tracker._update_and_maybe_create_winfos(param.grad, ref)

    def _label_engine(self) -> None:
        """Give the DeepSpeed engine's buffers their category (they may be new since the last
        iteration: ZeRO-2 allocates its gradient partitions at the first step)."""
        if self.engine is None:
            return
        tracker = self.tracker
        for tensor, category in engine_labels(self.engine):
            ref = tracker.ref_of(category)
            tracker.forced[tensor.untyped_storage()] = ref  # before: the ZeRO rules must not relabel it
            tracker._update_and_maybe_create_winfos(tensor, ref)

    # -- the profiler's hooks ------------------------------------------------------------
    def start_iteration(self) -> None:
        start = time.perf_counter()
        tracker = self.tracker
        tracker.reset_mod_stats()
        tracker.track_external(*self._external)  # optimizer state made outside the window
        self._label_engine()
        tracker.seen_backward = False
        tracker.overhead_sec = 0.0
        tracker.__enter__()
        self._active = True
        tracker.reset_peak()
        self._regions, self._step = {}, dict.fromkeys(CATEGORIES, 0.0)
        self._step_cuda = (0.0, 0.0)
        if self.history is not None:
            self.history.start()
        self._outside_sec = time.perf_counter() - start

    def enter_region(self, name: str) -> None:
        start = time.perf_counter()
        self._label_engine()  # ZeRO-2 makes its gradient partitions again in every backward
        self.tracker.reset_peak()
        if self.cuda is not None:
            self.cuda.synchronize(self.device)
            self.cuda.reset_peak_memory_stats(self.device)
        self._outside_sec += time.perf_counter() - start

    def exit_region(self, name: str, error: BaseException | None = None) -> None:
        if error is not None:
            self.fail(name, error)
        start = time.perf_counter()
        peak = by_category(self.tracker.get_tracker_snapshot("peak").get(self.device))
        row: dict[str, float] = dict(peak)
        if self.cuda is not None:
            self.cuda.synchronize(self.device)
            allocated = float(self.cuda.max_memory_allocated(self.device))
            reserved = float(self.cuda.max_memory_reserved(self.device))
            row["other"] += max(0.0, allocated - sum(row.values()))  # what no tracker attributes
            row["allocated_peak"], row["reserved_peak"] = allocated, reserved
            self._step_cuda = (max(self._step_cuda[0], allocated), max(self._step_cuda[1], reserved))
        total = sum(row[c] for c in CATEGORIES)
        before = self._regions.get(name)
        if before is None or total > sum(before[c] for c in CATEGORIES):
            self._regions[name] = row
        if total > sum(self._step.values()):
            self._step = {c: row[c] for c in CATEGORIES}
        self._outside_sec += time.perf_counter() - start

    def iteration_metrics(self) -> dict[str, Any]:
        start = time.perf_counter()
        self.stop()
        out: dict[str, Any] = {}
        for name, row in self._regions.items():
            for key in CATEGORIES:
                out[f"{name}_mem_{key}_mb"] = row[key] / MB
            out[f"{name}_mem_peak_mb"] = sum(row[c] for c in CATEGORIES) / MB
            if self.cuda is not None:
                out[f"{name}_mem_allocated_peak_mb"] = row["allocated_peak"] / MB
                out[f"{name}_mem_reserved_peak_mb"] = row["reserved_peak"] / MB
        for key in CATEGORIES:
            out[f"mem_{key}_mb"] = self._step[key] / MB
        out["mem_peak_mb"] = sum(self._step.values()) / MB
        if self.cuda is not None:
            allocated, reserved = self._step_cuda
            stats = self.cuda.memory_stats(self.device)
            out["mem_allocated_peak_mb"] = allocated / MB
            out["mem_reserved_peak_mb"] = reserved / MB
            out["mem_fragmentation_pct"] = (reserved - allocated) / allocated * 100.0 if allocated else None
            out["num_alloc_retries"] = stats.get("num_alloc_retries")
            out["num_ooms"] = stats.get("num_ooms")
        self._last_good = self.last_breakdown()
        out["profiler_memory_overhead_sec"] = self.tracker.overhead_sec + self._outside_sec
        out["profiler_memory_overhead_sec"] += time.perf_counter() - start
        return out

    def stop(self) -> None:
        """Leave the tracker (the iteration ended, or was abandoned)."""
        if self._active:
            self._active = False
            self.tracker.__exit__(None, None, None)

    def fail(self, region: str, error: BaseException) -> None:
        """An error left ``region``: an OOM writes the snapshot and is raised again, named."""
        if self.history is not None:
            self.stop()
            self.history.fail(region, error, self._last_good)

    def close(self) -> list:
        """End of the run: leave the tracker; on CUDA write the window's snapshot. Returns the files."""
        self.stop()
        if self.history is None:
            return []
        path = self.history.dump()
        return [path] if path is not None else []

    def held_bytes(self) -> float:
        """Bytes alive now that the step starts from (model, optimizer state, the engine's
        buffers, DDP's buckets), outside an iteration: what :meth:`start_iteration` registers."""
        tracker = self.tracker
        if not self._active:
            tracker.reset_mod_stats()
            tracker.track_external(*self._external)
            self._label_engine()
            tracker.__enter__()  # FSDPMemTracker registers its shards and optimizer state here
            tracker.__exit__(None, None, None)
            tracker.reset_mod_stats()
        total = tracker.get_tracker_snapshot().get(self.device, {}).get("Total", 0)
        return float(total)

    def last_breakdown(self) -> dict[str, float]:
        """The step's peak by category (MB) of the last finished iteration."""
        return {key: value / MB for key, value in self._step.items()}


def cross_rank_memory(per_rank: list[dict[str, Any]]) -> dict[str, Any]:
    """Rank 0's memory columns from every rank's: the worst rank's breakdown (so its categories
    add up), ``mem_worst_rank``, ``mem_peak_mb_rank<r>``, each rank's step breakdown
    ``mem_<category>_mb_rank<r>`` and ``mem_rank_imbalance_pct`` (``(max - min) / max x 100``
    of the ranks' step peaks).

    :Examples:
        >>> out = cross_rank_memory([{"mem_peak_mb": 8.0, "mem_activations_mb": 5.0},
        ...                          {"mem_peak_mb": 10.0, "mem_activations_mb": 4.0}])
        >>> out["mem_worst_rank"], out["mem_activations_mb"], out["mem_rank_imbalance_pct"]
        (1, 4.0, 20.0)
        >>> out["mem_activations_mb_rank0"], out["mem_activations_mb_rank1"]
        (5.0, 4.0)
    """
    peaks = [row.get("mem_peak_mb") for row in per_rank]
    if any(p is None for p in peaks):
        return {}
    worst = max(range(len(peaks)), key=lambda r: peaks[r])
    out: dict[str, Any] = {k: v for k, v in per_rank[worst].items() if "mem_" in k and k.endswith("_mb")}
    out["mem_worst_rank"] = worst
    for rank, peak in enumerate(peaks):
        out[f"mem_peak_mb_rank{rank}"] = peak
        for key in CATEGORIES:
            if f"mem_{key}_mb" in per_rank[rank]:
                out[f"mem_{key}_mb_rank{rank}"] = per_rank[rank][f"mem_{key}_mb"]
    top = max(peaks)
    out["mem_rank_imbalance_pct"] = (top - min(peaks)) / top * 100.0 if top > 0 else 0.0
    return out
