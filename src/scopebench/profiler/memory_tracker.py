"""The tracker behind ``profiler_memory`` (:mod:`scopebench.profiler.memory`): torch's
``MemTracker`` / ``FSDPMemTracker`` subclassed to reset its peak per region, time its own
bookkeeping, and label what torch does not know: gather buffers, DeepSpeed's and DDP's buffers.
"""

from __future__ import annotations

import time
from typing import Any

__all__ = ["CATEGORIES", "by_category", "category_of", "engine_labels", "make_tracker"]

CATEGORIES = (
    "parameters",
    "gradients",
    "optimizer_state",
    "activations",
    "temporaries",
    "buffers",
    "gather_buffers",
    "other",
)
#: torch's reference types (MemTracker's and FSDPMemTracker's values) -> category.
_TORCH_CATEGORY = {
    "Parameter": "parameters",
    "Sharded Param": "parameters",
    "Gradient": "gradients",
    "Sharded Grad": "gradients",
    "Optstate": "optimizer_state",
    "OptState": "optimizer_state",
    "Activation": "activations",
    "Inputs": "activations",
    "Temp": "temporaries",
    "Buffer": "buffers",
    "Unsharded Param": "gather_buffers",
    "Unsharded Grad": "gather_buffers",
    "All Gather": "gather_buffers",
    "Reduce Scatter": "gather_buffers",
    "Gather Buffer": "gather_buffers",
    "Other": "other",
}
_GATHER = "Gather Buffer"


def category_of(reftype: Any) -> str:
    """The category of one of torch's reference types (an enum member or its value).

    :Examples:
        >>> category_of("Sharded Param"), category_of("Temp"), category_of("Total")
        ('parameters', 'temporaries', 'other')
    """
    return _TORCH_CATEGORY.get(str(getattr(reftype, "value", reftype)), "other")


def by_category(snapshot: dict[Any, int] | None) -> dict[str, float]:
    """A tracker snapshot of one device (reference type -> bytes) as category -> bytes."""
    out = dict.fromkeys(CATEGORIES, 0.0)
    for key, value in (snapshot or {}).items():
        if str(key) != "Total":
            out[category_of(key)] += value
    return out


def make_tracker(model: Any, optimizer: Any):
    """A tracker for ``model``: FSDPMemTracker when it is an FSDP2 root, else MemTracker; subclassed
    to reset its peak per region, time its own bookkeeping and label gather buffers."""
    import torch
    from torch.distributed._tools.mem_tracker import MemTracker, _RefType
    from torch.utils.weak import WeakIdKeyDictionary

    base, args = MemTracker, ()
    try:
        from torch.distributed.fsdp import FSDPModule

        if isinstance(model, FSDPModule):
            from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

            base, args = FSDPMemTracker, (model, optimizer)
    except ImportError:  # pragma: no cover - torch without FSDP2
        pass

    class Tracker(base):
        """``base`` with per-region peaks, a clock on its bookkeeping and gather labels."""

        def __init__(self, *a):
            super().__init__(*a)
            values = [m.value for m in self._ref_class] + [_GATHER]
            # Members compare and hash as their strings: torch's own members index the same slots.
            self._ref_class = _RefType("ScopebenchRef", {v.upper().replace(" ", "_"): v for v in values})
            self._gather_ref = self._ref_class(_GATHER)
            self.gathering = 0  # > 0 while DeepSpeed fetches parameters
            self.zero = False  # a DeepSpeed engine: its parameters and gradient buckets are relabelled
            self.ddp = False  # DDP: storages made before tracking, met in the backward, are its buckets
            #: Storage -> reference type that no later registration changes (the engine's buffers).
            self.forced = WeakIdKeyDictionary()
            self.seen_backward = False
            self.overhead_sec = 0.0
            self._clock = 0

        def ref_of(self, category: str):
            """This tracker's reference type of ``category`` (FSDPMemTracker spells them its own way)."""
            return next(m for m in self._ref_class if category_of(m) == category)

        def reset_peak(self) -> None:
            from copy import deepcopy

            snap = self._curr_mem_snap
            self._peak_mem = {dev: s["Total"] for dev, s in snap.items()}
            self._peak_mem_snap = deepcopy(snap)

        def _update_peak_stats(self, peak_state) -> None:
            # The step's peak only: torch's version also updates every active module's own
            # peak after every operation, which this breakdown does not read (and costs most).
            start = time.perf_counter()
            peak, snap = self._peak_mem, self._peak_mem_snap
            for dev, dev_snap in self._curr_mem_snap.items():
                if peak.get(dev, 0) < dev_snap["Total"]:
                    peak[dev] = dev_snap["Total"]
                    snap[dev] = dict(dev_snap)
            self.overhead_sec += time.perf_counter() - start

        _clocked_update = _clocked(base, "_update_and_maybe_create_winfos")

        def _update_and_maybe_create_winfos(self, t, reftype, update_existing=False):
            return self._clocked_update(t, self._relabel(t, reftype), update_existing)

        def _made_before(self, t) -> bool:
            """A storage met for the first time that another tensor already shares (the output
            is a view): it was allocated before tracking (the tensor, its storage object and
            the ``_track`` call hold 2 references to a new one)."""
            st = t.untyped_storage()
            return st not in self._WINFO and torch._C._storage_Use_Count(st._cdata) > 2

        def _relabel(self, t, reftype):
            """The engine's buffers keep their label; under ZeRO a full parameter (``ds_tensor``
            is its shard) is a gathered copy, and a gradient that is a view into a larger flat
            buffer sits in a communication bucket."""
            if self.forced:
                forced = self.forced.get(t.untyped_storage())
                if forced is not None:
                    return forced
            if self.zero:
                value = str(getattr(reftype, "value", reftype))
                if value == "Parameter" and hasattr(t, "ds_tensor"):
                    return self._gather_ref
                if value == "Gradient" and t.untyped_storage().nbytes() > t.numel() * t.element_size():
                    return self._gather_ref
            return reftype

        _pre_fw_hook = _clocked(base, "_pre_fw_hook")
        _post_fw_hook = _clocked(base, "_post_fw_hook")
        _post_bw_hook = _clocked(base, "_post_bw_hook")
        _clocked_pre_bw = _clocked(base, "_pre_bw_hook")

        def _pre_bw_hook(self, module, args):
            self.seen_backward = True
            return self._clocked_pre_bw(module, args)

        def _track(self, reftype, t):
            start = time.perf_counter()
            value = str(getattr(reftype, "value", reftype))
            if self.gathering:
                reftype = self._gather_ref
            elif self.forced and t.untyped_storage() in self.forced:
                reftype = self.forced[t.untyped_storage()]
            elif self.ddp and self._mod_tracker.is_bw and self._made_before(t):
                reftype = self._gather_ref
            elif category_of(value) == "optimizer_state":
                # Made inside the optimizer's step: its intermediates, unless the step keeps them
                # (the post-step hook files what ``optimizer.state`` holds as optimizer state).
                reftype = self.ref_of("temporaries")
            elif value == "Activation" and self.seen_backward and not self._mod_tracker.is_bw:
                if self._mod_tracker.parents <= {"Global"}:  # after the backward, outside any module
                    reftype = self.ref_of("temporaries")
            base._track(self, reftype, t)
            self.overhead_sec += time.perf_counter() - start

    return Tracker(*args)


def _clocked(base: type, name: str):
    """``base.<name>`` with its time added to the tracker's ``overhead_sec`` (outermost call only)."""
    method = getattr(base, name)

    def clocked(self, *args, **kwargs):
        if self._clock:
            return method(self, *args, **kwargs)
        self._clock += 1
        start = time.perf_counter()
        try:
            return method(self, *args, **kwargs)
        finally:
            self._clock -= 1
            self.overhead_sec += time.perf_counter() - start

    return clocked


def engine_labels(engine: Any) -> list[tuple[Any, str]]:
    """``(tensor, category)`` of the buffers a DeepSpeed engine's ZeRO optimizer holds."""
    zero = getattr(engine, "optimizer", None)
    found: list[tuple[Any, str]] = []

    def add(value: Any, category: str) -> None:
        import torch

        if isinstance(value, torch.Tensor):
            found.append((value, category))
        elif isinstance(getattr(value, "flat_partition", None), torch.Tensor):  # ZeRO-2's gradient partition
            found.append((value.flat_partition, category))
        elif isinstance(value, dict):
            for item in value.values():
                add(item, category)
        elif isinstance(value, (list, tuple)):
            for item in value:
                add(item, category)

    if zero is None:
        return found
    params = [getattr(zero, "bit16_groups_flat", None), getattr(zero, "fp16_partitioned_groups_flat", None)]
    add(params, "parameters")
    param_ids = {id(t.untyped_storage()) for t, _ in found}
    masters = getattr(zero, "single_partition_of_fp32_groups", None) or getattr(
        zero, "fp32_partitioned_groups_flat", []
    )
    for master in masters:  # ZeRO-3 in fp32 trains the partition itself: no second copy
        if id(master.untyped_storage()) not in param_ids:
            add(master, "optimizer_state")
    add(getattr(zero, "averaged_gradients", None), "gradients")
    add(getattr(zero, "grads_in_partition", None), "gradients")
    add(getattr(zero, "grad_partitions_flat_buffer", None), "gradients")
    for bucket in (getattr(zero, "ipg_buckets", None) or {}).values():
        add(getattr(bucket, "buffer", None), "gather_buffers")
    return found
