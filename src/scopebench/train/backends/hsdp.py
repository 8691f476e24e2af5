"""``hsdp``: FSDP2 on a 2-D device mesh, sharded within a node and replicated across nodes.

Hybrid sharding: each parameter is sharded over the ``shard`` ranks of its replica group
(one node's ranks by default) and every replica group holds the whole model; gradients are
reduce-scattered within a replica group, then all-reduced across groups (one copy of each
shard per node travels between nodes, not every rank's). Everything else is
:class:`~scopebench.train.backends.fsdp2.FSDPBackend`'s: the units, mixed precision,
clipping by the total norm, DCP checkpoints read as data only.

The accelerate file that selects it is an FSDP2 file with accelerate's
``parallelism_config``: ``parallelism_config_dp_replicate_size`` (replica groups) and
``parallelism_config_dp_shard_size`` (ranks per group), each an integer or ``auto``. ``auto``
is the suite's: from the layout, replicas = nodes and shard = ranks per node
(``accelerate launch`` itself needs integers). Their product must be the world size, or the
run is refused naming the file and both keys.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from scopebench.train.backends.fsdp2 import FSDPBackend

__all__ = ["BACKEND", "HSDPBackend", "mesh_shape"]

REPLICATE, SHARD = "parallelism_config_dp_replicate_size", "parallelism_config_dp_shard_size"


def mesh_shape(sizes: Mapping[str, Any], world_size: int, nodes: int = 1, where: str = "") -> tuple[int, int]:
    """``(replicate, shard)`` of a run of ``world_size`` ranks on ``nodes`` nodes from the file's
    ``sizes`` (:data:`REPLICATE`, :data:`SHARD`: integers or ``auto``).

    :Examples:
        >>> mesh_shape({REPLICATE: "auto", SHARD: "auto"}, 4, nodes=2)
        (2, 2)
        >>> mesh_shape({REPLICATE: 2, SHARD: "auto"}, 8)
        (2, 4)
        >>> mesh_shape({REPLICATE: 3, SHARD: "auto"}, 4, where="h.yaml")
        Traceback (most recent call last):
        ...
        ValueError: parallelism_config in h.yaml: 3 replica group(s) do not divide 4 ranks: set parallelism_config_dp_replicate_size x parallelism_config_dp_shard_size = 4
    """
    replicate, shard = sizes.get(REPLICATE, "auto"), sizes.get(SHARD, "auto")
    place = f"parallelism_config{f' in {where}' if where else ''}"
    need = f"set {REPLICATE} x {SHARD} = {world_size}"
    if replicate == "auto" and shard == "auto":
        replicate = nodes if nodes >= 1 and world_size % nodes == 0 else 1
    if replicate == "auto":
        if world_size % shard:
            raise ValueError(f"{place}: a shard of {shard} rank(s) does not divide {world_size} ranks: {need}")
        replicate = world_size // shard
    if shard == "auto":
        if world_size % replicate:
            raise ValueError(f"{place}: {replicate} replica group(s) do not divide {world_size} ranks: {need}")
        shard = world_size // replicate
    if replicate * shard != world_size:
        raise ValueError(
            f"{place}: {REPLICATE}={replicate} x {SHARD}={shard} = {replicate * shard} ranks, but the run has "
            f"{world_size}: {need}"
        )
    return replicate, shard


@dataclass(frozen=True, kw_only=True)
class HSDPBackend(FSDPBackend):
    """FSDP2 on a ``(replicate, shard)`` mesh (see the module docstring)."""

    def selects(self, distributed_type: str, raw: Mapping[str, Any]) -> bool:
        return distributed_type == "FSDP" and bool(raw.get("parallelism_config"))

    def read_file(self, raw: Mapping[str, Any], key: Callable[[str], str]) -> dict[str, Any]:
        out = super().read_file(raw, key)
        sizes = raw.get("parallelism_config")
        if not isinstance(sizes, dict):
            raise ValueError(f"{key('parallelism_config')} must be a mapping, got {sizes!r}")
        unknown = sorted(set(sizes) - {REPLICATE, SHARD})
        if unknown:
            raise ValueError(
                f"{key('parallelism_config')}: {unknown} not supported; hsdp reads {REPLICATE} and {SHARD}"
            )
        for name in (REPLICATE, SHARD):
            value = sizes.get(name, "auto")
            if value != "auto" and (type(value) is not int or value < 1):
                raise ValueError(f"{key(f'parallelism_config.{name}')} must be an integer >= 1 or auto, got {value!r}")
        return {**out, "mesh": {name: sizes.get(name, "auto") for name in (REPLICATE, SHARD)}}

    def _shape(self, file: Any, world_size: int, nodes: int) -> tuple[int, int]:
        sizes = getattr(file, "mesh", None) or {}
        return mesh_shape(sizes, world_size, nodes, where=getattr(file, "path", ""))

    def shard_degree(self, file: Any, world_size: int, nodes: int = 1) -> int:
        return self._shape(file, world_size, nodes)[1]

    def mesh(self, device: Any, file: Any, world_size: int, nodes: int = 1) -> Any:
        import torch
        from torch.distributed.device_mesh import init_device_mesh

        shape = self._shape(file, world_size, nodes)
        return init_device_mesh(torch.device(device).type, shape, mesh_dim_names=("replicate", "shard"))

    def check_layout(self, file: Any, world_size: int, nodes: int = 1) -> None:
        """Refuse a mesh that does not divide the run's ranks, before anything is built."""
        self._shape(file, world_size, nodes)


BACKEND = HSDPBackend(
    name="hsdp",
    title="HSDP (FSDP2, 2-D mesh)",
    order=4,
    accelerate_file="hsdp.yaml",
    compared_with=("fsdp2",),
    phase_contents={
        "forward": "forward + per-unit parameter all-gather within the node's shard group",
        "bwd": "backward + parameter re-gather + gradient reduce-scatter in the shard group, "
        "all-reduce across replica groups",
        "unscale_clip": "clipping by the total norm over the shards (an all-reduce)",
        "optim_step": "AdamW on this rank's shards",
        "zero_grad_sched": "zero_grad + LR schedule",
    },
)
