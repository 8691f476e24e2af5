"""Validation runs on a launcher's ranks: HSDP's 4 ranks through torchrun, as benchmark rows.

What it measures: the cells of the validation benchmark (``scopebench.validation.launched.DEFAULT_CELLS``:
runs without a fault, a late rank in each phase, slow input, a NaN loss) on the ranks torchrun
started, each run the solver ``Detect``'s ``DetectRun``, scored every iteration as the objective
does. Why: a local spawn is capped at the machine's cores (2 here), HSDP needs 4 ranks.

How to run it (from the repository root)::

    OMP_NUM_THREADS=1 torchrun --standalone --nproc-per-node 4 benchmark_validation/torchrun_detect.py \\
        --backend hsdp --output benchmark_validation/outputs/hsdp.parquet

``--backend hsdp`` on 4 ranks uses a 2 x 2 mesh (2 replica groups of 2 shards). Output: rank 0
writes the rows in benchopt's layout to ``--output`` (``make_page.py`` reads it) and prints
``{"output": ..., "runs": n}`` as JSON on its last line.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main(argv: list[str] | None = None) -> int:
    import pandas as pd

    from scopebench.distributed import get_dist_info
    from scopebench.profiler import ProfilerConfig
    from scopebench.validation.launched import DEFAULT_CELLS, detect_rows, mesh_file

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="hsdp")
    parser.add_argument("--profiler-mode", nargs="+", default=["custom", "torch"])
    parser.add_argument("--iterations", type=int, default=12)
    parser.add_argument("--faults", nargs="+", default=None, help="only the default cells of these faults")
    parser.add_argument("--output", default=str(HERE / "outputs" / "hsdp.parquet"))
    args = parser.parse_args(argv)
    info = get_dist_info()
    if not info.is_distributed:
        parser.error("run it under torchrun (it takes the launcher's ranks)")
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        config = None
        if args.backend == "hsdp" and info.world_size == 4:
            config = str(mesh_file(folder, 2, 2))
        for mode in args.profiler_mode:
            profiler = ProfilerConfig(mode=mode, warmup=1)
            for seed, spec in enumerate(DEFAULT_CELLS):
                if args.faults and spec.fault not in args.faults:
                    continue
                rows += detect_rows(
                    spec,
                    profiler=profiler,
                    iterations=args.iterations,
                    seed=seed if spec.fault == "none" else 0,
                    output_dir=HERE / "outputs",
                    backend=args.backend,
                    nproc_per_node=info.world_size // info.nodes,
                    accelerate_config=config,
                )
    if info.rank == 0:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        pd.DataFrame(rows).to_parquet(args.output)
        print(json.dumps({"output": args.output, "runs": sum(1 for r in rows if r["stop_val"] == 0)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
