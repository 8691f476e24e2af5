"""Per-rank memory of a policy training step, estimated before launch, without allocating the model.

What it estimates: for the config's preset (``pi05`` at its real size included), backend,
number of ranks and per-rank batch, the bytes per rank at the step's peak by category —
``parameters``, ``gradients``, ``optimizer_state`` (each whole or sharded over the ranks as the
backend holds it: the backend table of docs/distributed.md; DeepSpeed's optimizer state holds
an fp32 master copy), the backend's buffers by name (DDP's and ``fully_shard``'s
``gather_buffers``; DeepSpeed's ``reduce_bucket`` and ZeRO-3's
``persistent_parameters`` and ``live_parameters``, read from the DeepSpeed config the
backend builds over DeepSpeed's defaults), what only the optimizer step holds (ZeRO's
``fp32_gradient_partition``) and ``activations`` (measured by one fake forward of the
model's own code: ``FakeTensorMode`` on a meta-device model, every tensor autograd saves
counted once). With ``--gpu A100``: torch's cuBLAS/cuBLASLt workspaces
(``cublas_workspace``) and the caching allocator's 512-byte blocks
(``allocator_rounding``); ``cuda_context`` and ``fragmentation_reserve`` are shown unknown
(``null``): no document sizes them. Then whether it fits in ``--memory-gb`` and the
largest per-rank batch that does (activations are linear in the batch: measured at batch
1 and 2). What it leaves out (docs/distributed.md, "Memory before launch"): one
operation's temporaries, allocator fragmentation, NCCL's buffers, DataLoader workers and
the process's libraries.

How to run::

    scopebench estimate-memory --config configs/policy/pi05.yml --backend zero2 --nproc-per-node 8 \\
        --batch-size 16 --precision bf16 --memory-gb 80 --gpu A100
    scopebench estimate-memory --config configs/policy/tiny.yml --json outputs/memory.json

Output: one line per category (GB per rank), the peak, and with ``--memory-gb``
whether it fits and the largest batch. JSON (``--json``): ``tool`` ("estimate-memory"),
``config``, ``preset``, ``backend``, ``world_size``, ``batch_size``, ``precision``,
``gpu`` (``--gpu`` or null), ``num_params``, ``bytes`` (every line by name -> bytes per
rank, null where unknown; ``gather_buffers``, the buffers' sum; and ``peak``), ``buffers``
and ``step_only`` (the names in ``bytes`` that are buffers / step-only terms),
``gradients_before_forward``, ``activations_per_sample_bytes``, ``device_memory_bytes``,
``fits``, ``largest_batch``.

``--nproc`` and ``--device-memory-gb``, the old spellings, still work and print one
deprecation line on stderr.

Exit status: 2 with one line for a refused input, else 0.
"""

from __future__ import annotations

import argparse

from scopebench.commands._common import (
    add_memory_gb,
    add_nproc_per_node,
    finish,
    memory_gb,
    nproc_per_node,
    refuses,
)

HELP = "per-rank memory of a training step by category, before launch (no model allocated)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from scopebench.commands._policy_options import add_backend_arguments, add_config_arguments

    add_config_arguments(parser)
    add_backend_arguments(parser)
    add_nproc_per_node(parser, "ranks the model is trained on (default: the config's)", deprecated=("--nproc",))
    parser.add_argument("--batch-size", "--batch_size", dest="batch_size", type=int, default=None, help="per rank")
    parser.add_argument("--precision", default=None, help="fp32 or bf16 (autocast)")
    add_memory_gb(parser, "memory of one device (GB, 1e9 bytes)", deprecated=("--device-memory-gb",))
    parser.add_argument(
        "--gpu", default=None, metavar="NAME",
        help="the CUDA device the run will use (A100): counts its cuBLAS workspaces and the allocator's "
        "512-byte blocks (default: none, the tensors alone)",
    )  # fmt: skip


@refuses("estimate-memory")
def run(args: argparse.Namespace) -> int:
    from scopebench.commands._policy_options import backend_flags
    from scopebench.policy.tools import check_json_path, load_config

    backend, file = backend_flags(args)
    flags = {**backend, "batch_size": args.batch_size, "precision": args.precision}
    # The estimate is for --nproc-per-node ranks; nothing is started, so no cores check applies.
    config = load_config(args, flags=flags)
    if config.train.policy != "pi05":  # the estimate reads the preset's config, without building
        raise ValueError(
            f"estimate-memory estimates policy pi05 from its preset, got policy={config.train.policy}; "
            "run profile-step on it (its max_rss_mb / max_gpu_mb columns)"
        )
    world = nproc_per_node(args) or config.train.nproc_per_node
    limit = memory_gb(args)
    check_json_path("--json", args.json)
    gpu = args.gpu
    if gpu is not None:
        from scopebench.train.memory import CUDA_WORKSPACES
        from scopebench.validate import choice

        choice("--gpu", gpu, tuple(CUDA_WORKSPACES))
    return _estimate(config, world, limit, args.json, gpu, file)


def _line(key: str, value: float | None, note: str = "") -> None:
    from scopebench.train.memory import GB

    shown = "   unknown" if value is None else f"{value / GB:10.3f}"
    print(f"  {key:<24} {shown} GB per rank{note}")


def _estimate(
    config, world: int, limit_gb: float | None, json_path: str | None, gpu: str | None = None, file=None
) -> int:
    from scopebench.policy.memory import largest_batch, run_memory
    from scopebench.policy.pi05.config import make_config
    from scopebench.policy.run.checks import model_overrides
    from scopebench.train.memory import GB

    s, d = config.train, config.dataset
    # The dataset's cameras and chunk; state and action as the preset pads them (the
    # synthetic data's 7 dims are below every preset's).
    model_config = make_config(s.preset, num_cameras=d.num_cameras, chunk_size=d.chunk_size, **model_overrides(s))
    memory = run_memory(s, model_config, world, gpu=gpu, file=file)
    print(
        f"scopebench estimate-memory: preset={s.preset} ({memory['num_params'] / 1e9:.2f} B parameters) "
        f"backend={s.backend} ranks={world} batch_size={s.batch_size} per rank precision={s.precision}"
        f"{f' gpu={gpu}' if gpu else ''}"
    )
    for key in ("parameters", "gradients", "optimizer_state"):
        _line(key, memory[key])
    for key, value in memory["buffers"].items():
        _line(key, value, " (gather_buffers)")
    for key, value in memory["step"].items():
        _line(key, value, " (optimizer step only)")
    _line("activations", memory["activations"])
    if gpu is not None:
        _line("allocator_rounding", memory["allocator_rounding"], " (512-byte blocks)")
        for key, value in memory["runtime"].items():
            _line(key, value, " (not in torch's allocator statistics)" if value is None else "")
    _line("fragmentation_reserve", memory["fragmentation_reserve"], " (not counted: no documented figure)")
    held = "gradients + " if memory["gradients_before_forward"] else ""
    other = "step" if held else "gradients + step"
    print(
        f"  {'peak':<24} {memory['peak'] / GB:10.3f} GB per rank "
        f"(parameters + optimizer_state + buffers + runtime + {held}max(activations, {other}))"
    )
    print(f"  activations per sample: {memory['activations_per_sample'] / GB:.4f} GB")
    fits = best = None
    if limit_gb is not None:
        fits = memory["peak"] <= limit_gb * GB
        best = largest_batch(memory, limit_gb * GB)
        verdict = "fits" if fits else "does NOT fit"
        print(f"  on a {limit_gb:g} GB device: {verdict}; largest per-rank batch that fits: {best}")
    print("  not counted: temporaries, fragmentation, NCCL buffers, workers, libraries")
    keys = ("parameters", "gradients", "optimizer_state", "gather_buffers", "activations")
    counted = {k: memory[k] for k in keys}
    counted.update(memory["buffers"])
    counted.update(memory["step"])
    if gpu is not None:
        counted["allocator_rounding"] = memory["allocator_rounding"]
        counted.update(memory["runtime"])
    counted["fragmentation_reserve"] = memory["fragmentation_reserve"]
    counted["peak"] = memory["peak"]
    payload = {
        "tool": "estimate-memory",
        "config": config.source,
        "preset": s.preset,
        "backend": s.backend,
        "world_size": world,
        "batch_size": s.batch_size,
        "precision": s.precision,
        "gpu": gpu,
        "num_params": memory["num_params"],
        "bytes": counted,
        "buffers": sorted(memory["buffers"]),
        "step_only": sorted(memory["step"]),
        "gradients_before_forward": memory["gradients_before_forward"],
        "activations_per_sample_bytes": memory["activations_per_sample"],
        "device_memory_bytes": None if limit_gb is None else limit_gb * GB,
        "fits": fits,
        "largest_batch": best,
    }
    return finish(None, payload, json_path)
