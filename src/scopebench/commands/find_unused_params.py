"""Parameters that get no gradient in one forward + backward (upstream ``find_unused_params``).

What it measures: one forward + backward of the policy of a run config on that run's first
batch, on one device, without DDP (the model, data and batch of ``Pi05Train``). Lists every
parameter with ``requires_grad`` and no ``grad`` (UNUSED: what DDP refuses with
``find_unused_parameters=False``), the FROZEN ones, and with ``INCLUDE_ZERO_GRAD=true`` the
ones whose gradient is all zeros; grouped by module; ends with whether
``find_unused_parameters=False`` (``FIND_UNUSED_PARAMS=false``) is safe. Why: DDP with
``find_unused_parameters=True`` walks the autograd graph every step; turn it off when
nothing is unused. With ``--ce_weight=0`` the discrete-action head gets no gradient.

How to run (a single process, no launcher)::

    scopebench find-unused-params --config configs/policy/tiny.yml [--ce_weight=0] [--json out.json]
    INCLUDE_ZERO_GRAD=true scopebench find-unused-params --config configs/policy/tiny.yml

Output: the text report; JSON (``--json``), keys: ``tool`` ("find-unused-params"),
``config``, ``settings``, ``include_zero_grad``, ``unused`` / ``frozen`` / ``zero_grad``
(lists of ``name, module, shape, numel``), ``used_count`` (tensors with a non-zero
gradient), ``counts`` (category -> ``tensors, params``), ``safe_without_find_unused``.
"""

from __future__ import annotations

import argparse

from scopebench.commands._common import finish, refuses

HELP = "which policy parameters get no gradient (is find_unused_parameters=False safe?)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from scopebench.commands._policy_options import add_config_arguments

    add_config_arguments(parser)
    parser.add_argument("--include-zero-grad", choices=["true", "false"], default=None, help="INCLUDE_ZERO_GRAD")


@refuses("find-unused-params")
def run(args: argparse.Namespace) -> int:
    from scopebench.policy.tools import check_json_path, env_bool, load_config

    zero = args.include_zero_grad == "true" if args.include_zero_grad else env_bool("INCLUDE_ZERO_GRAD", False)
    config = load_config(args, flags={"nproc_per_node": 1})
    check_json_path("--json", args.json)
    return _audit(config, zero, args.json)


def _audit(config, include_zero_grad: bool, json_path: str | None) -> int:
    from scopebench.policy.run.train import audit_parameters
    from scopebench.policy.tools import data_root, settings_dict

    root = data_root(config)
    audit = audit_parameters(
        config.train, dataset_root=root, chunk_size=config.dataset.chunk_size, include_zero_grad=include_zero_grad
    )

    def entries(category: str) -> list[dict]:
        return [
            {"name": n, "module": n.rpartition(".")[0], "shape": list(audit.shapes[n]), "numel": audit.numel[n]}
            for n in getattr(audit, category)
        ]

    zero = set(audit.zero_grad)
    payload = {
        "tool": "find-unused-params",
        "config": config.source,
        "settings": settings_dict(config.train),
        "include_zero_grad": include_zero_grad,
        "unused": entries("unused"),
        "frozen": entries("frozen"),
        "zero_grad": entries("zero_grad"),
        "used_count": len([n for n in audit.used if n not in zero]),
        "counts": {
            c: {"tensors": len(getattr(audit, c)), "params": audit.count(c)}
            for c in ("unused", "frozen", "used", "zero_grad")
        },
        "safe_without_find_unused": audit.safe_without_find_unused,
    }
    return finish(audit.format(), payload, json_path)
