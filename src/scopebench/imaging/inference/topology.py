"""Which process layouts can run a reconstruction, decided before anything starts.

:func:`check_topology` returns ``None`` when a layout works and otherwise one sentence
naming the parameters that disagree, so a benchopt solver can decline the combination
(``skip``) instead of crashing, or hanging, half-way through a grid.
"""

from __future__ import annotations

import shutil

from scopebench.cluster import CellLayout, gres_gpu_count

__all__ = ["check_topology", "count_patches"]


def count_patches(shape: tuple[int, ...], patch_size: int, overlap: int) -> int:
    """Number of tiles deepinv's tiling strategy cuts a signal of ``shape`` into.

    ``shape`` is the full ``(B, C, *spatial)`` shape; every spatial axis is tiled.

    :Examples:
        >>> count_patches((1, 3, 64, 64), 32, 8)
        4
    """
    from deepinv.distributed.strategies.utils import tiling_splitting_strategy

    dims = tuple(range(-(len(shape) - 2), 0))
    slices, _ = tiling_splitting_strategy(shape, patch_size=patch_size, overlap=overlap, tiling_dims=dims)
    return len(slices)


def check_topology(
    layout: CellLayout,
    *,
    distribute_physics: bool,
    distribute_denoiser: bool,
    num_operators: int,
    signal_shape: tuple[int, ...],
    patch_size: int | None,
    overlap: int,
    launcher_world_size: int | None = None,
    compile_mode: str = "none",
) -> str | None:
    """``None`` if the layout can run, else why not (naming the parameters).

    Args:
        layout: Requested processes and SLURM job (:class:`scopebench.cluster.CellLayout`).
        distribute_physics: Split the operators across ranks.
        distribute_denoiser: Split the denoiser's tiles across ranks.
        num_operators: Operators of the problem.
        signal_shape: ``(B, C, *spatial)`` of the reconstruction.
        patch_size: Tile side, ``None`` for no tiling.
        overlap: Halo of each tile.
        launcher_world_size: World size announced by torchrun / SLURM, ``None`` when the
            run starts as a single process (then ranks are spawned locally).
        compile_mode: ``none``, ``denoiser``, ``physics`` or ``both``.
    """
    try:
        world = layout.ranks(launcher_world_size).world_size
    except ValueError as err:
        return str(err)
    gpus = gres_gpu_count(layout.slurm_gres)
    per_node = world // layout.slurm_nodes
    if gpus is not None and gpus != per_node:
        return (
            f"slurm_gres={layout.slurm_gres!r} gives {gpus} GPU(s) per node but "
            f"{per_node} rank(s) per node would share them (one GPU per rank)"
        )
    if launcher_world_size is not None and launcher_world_size not in (1, world):
        return f"the launcher started {launcher_world_size} processes but the cell's layout has {world} ranks"
    flags = [
        name
        for name, on in (("distribute_physics", distribute_physics), ("distribute_denoiser", distribute_denoiser))
        if on
    ]
    if world == 1 and flags:
        return f"{' and '.join(flags)} need(s) more than one process, got nproc_per_node={layout.nproc_per_node}"
    if world > 1 and not flags:
        return (
            f"nproc_per_node={layout.nproc_per_node} (world size {world}) without distribute_physics or "
            "distribute_denoiser: the extra ranks would only repeat rank 0's work"
        )
    if distribute_physics and num_operators < world:
        return f"distribute_physics with {world} processes needs at least {world} operators, the problem has {num_operators}"
    spatial = signal_shape[2:]
    if patch_size is not None:
        if patch_size >= min(spatial):
            return f"patch_size={patch_size} must be smaller than the signal's side {min(spatial)}"
        if 2 * overlap >= min(spatial):
            return f"overlap={overlap} is too large for a signal of side {min(spatial)}"
    if distribute_denoiser:
        if patch_size is None:
            return "distribute_denoiser needs patch_size (the denoiser is split into tiles across ranks)"
        patches = count_patches(tuple(signal_shape), patch_size, overlap)
        if patches < world:
            return (
                f"distribute_denoiser with {world} processes needs at least {world} tiles; "
                f"patch_size={patch_size} cuts the signal {tuple(spatial)} into {patches}"
            )
    if compile_mode != "none" and shutil.which("cc") is None and shutil.which("gcc") is None:
        return f"compile={compile_mode!r} needs a C compiler for torch.compile's CPU backend; none was found"
    return None
