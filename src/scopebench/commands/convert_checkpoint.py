"""Consolidate a sharded checkpoint into one ``model.safetensors`` (upstream ``convert_checkpoint.sh``).

What it does: reads the shards of a checkpoint written by ``scopebench train`` under a backend
that does not save whole weights (``scopebench convert-checkpoint --help`` lists them; each
backend consolidates its own): DeepSpeed's ``pytorch_model/`` shards and ``latest`` (its
``zero_to_fp32``: the fp32 master weights of every rank's partition, put back together on one
process, no GPU needed), or the ``fsdp_model/`` shards of torch's ``fully_shard``
(torch.distributed.checkpoint, read without a process group, its ``.metadata`` unpickled from
DCP's own classes only), and writes ``model.safetensors`` into the checkpoint folder, atomically,
listing it in its ``manifest.json``. A checkpoint that holds it already needs nothing (DDP's). The file loads with
``scopebench.policy.checkpoint.load_policy(<checkpoint>)`` (``make_policy`` on the saved
``policy_config.json``, then the weights). Why: use the weights for inference or
evaluation without the ranks and backend that trained them.

How to run::

    scopebench convert-checkpoint outputs/train/z3/checkpoints/000040
    scopebench convert-checkpoint outputs/train/z3            # its checkpoints/last
    scripts/convert_checkpoint.sh outputs/train/z3/checkpoints/000040

Output: one line ``wrote <path> (<n> tensors, <m> parameters)``; JSON (``--json PATH``):
``tool`` ("convert-checkpoint"), ``checkpoint``, ``model_file``, ``tensors``, ``parameters``,
``backend``, ``step``. The ``--json`` path is checked and held before anything is read (a second
run writing it meanwhile is refused).

The files are first checked against the checkpoint's ``manifest.json`` (sizes and sha256, as a
resume checks them: :func:`scopebench.train.checkpoint.verify_files`), then loaded as data only
(``torch.load(weights_only=True)`` and DCP's metadata from exact types, see
:mod:`scopebench.train.data_only`): a file holding pickled Python code is refused with
``scopebench convert-checkpoint: <file> holds ...`` and exit code 2, before anything in it runs.
So is a checkpoint that names a path outside itself or holds a file its manifest does not
list (docs/distributed.md, "What a checkpoint may reference").
"""

from __future__ import annotations

import argparse

from scopebench.commands._common import refuses

HELP = "consolidate a sharded training checkpoint (a backend that saves no whole weights) into model.safetensors"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", help="checkpoint folder, its checkpoints/ folder or the run's output folder")
    parser.add_argument("--json", default=None, help="also write a JSON summary to this path")


@refuses("convert-checkpoint")
def run(args: argparse.Namespace) -> int:
    from safetensors import safe_open

    from scopebench.policy.tools import check_json_path
    from scopebench.train.checkpoint import read_step_file, resolve_checkpoint
    from scopebench.train.consolidate import consolidate
    from scopebench.train.data_only import data_only_loading

    check_json_path("--json", args.json)
    with data_only_loading():  # a shard holding pickled code is refused (ValueError), never run
        checkpoint = resolve_checkpoint(args.checkpoint)
        meta = read_step_file(checkpoint)
        path = consolidate(checkpoint)
    with safe_open(str(path), "pt") as fh:
        keys = list(fh.keys())
        parameters = sum(_numel(fh.get_slice(key).get_shape()) for key in keys)
    from scopebench.train.backends import DEFAULT_BACKEND, MODEL_FILE, find_backend

    backend = meta.get("backend", DEFAULT_BACKEND)
    recorded = find_backend(backend)
    whole = recorded is not None and MODEL_FILE in recorded.checkpoint_files
    note = f" (a {recorded.title} checkpoint: already consolidated)" if whole else ""
    print(f"wrote {path} ({len(keys)} tensors, {parameters} parameters){note}")
    if args.json:
        from scopebench.policy.tools import write_json

        summary = {"tool": "convert-checkpoint", "checkpoint": str(checkpoint), "model_file": str(path)}
        summary.update(tensors=len(keys), parameters=parameters, backend=backend, step=meta.get("step"))
        write_json(args.json, summary)
    return 0


def _numel(shape) -> int:
    out = 1
    for dim in shape:
        out *= int(dim)
    return out
