"""What the profiler's cross-rank exchange sends, per rank and recorded iteration, and what that
makes at 1024 ranks (docs/performance.md, "What watching costs").

What it measures: ``profile-step``'s run object (DDP, ``--nproc`` local gloo ranks, rank 0 in
this process) on the example user policy, the exchange deferred as ``profile-step`` defers it.
Each gather the profiler makes after the loop is recorded on rank 0 with the bytes rank 0 sends
(``pickle.dumps`` of its object, what ``all_gather_object`` sends), split into the ledger's records
and the metrics; and the time each chunk's gathers and arithmetic took. Then, from the measured
bytes per rank and iteration ``b`` and the chunk size ``C`` (``EXCHANGE_CHUNK``), the model of one
chunk's exchange at ``N`` ranks: every rank receives ``(N - 1) * C * b`` bytes (``all_gather_object``
gives every rank every rank's object) and holds ``N * C`` records at once; a ring all-gather moves
that in about ``(N - 1) * C * b / B`` seconds at a link bandwidth ``B`` (``--bandwidth-gb``); and
each rank's ledger arithmetic reads every rank's record of each iteration (``ledger_metrics``),
so it grows as ``N`` times the measured per-rank arithmetic.

Why: the exchange left the step path (issue 47), but what it sends per window must be stated and
bounded, and its growth with the world size shown.

Run: ``.venv/bin/python perf/exchange_bytes.py [--nproc 2 --steps 64 --bandwidth-gb 10]``
(``torchrun --nproc-per-node 4 perf/exchange_bytes.py`` for 4 ranks: then every rank runs it).

Output: readable lines, then one JSON object on the last line::

    {"nproc": int, "steps": int, "chunk": int, "gathers": [{"what", "bytes"}],
     "bytes_per_iteration": {"records": float, "metrics": float, "total": float},
     "after_window_sec": float, "arithmetic_sec_per_iteration": float,
     "model": [{"ranks", "received_mb_per_chunk", "held_records", "transfer_sec_per_chunk",
                "arithmetic_sec_per_iteration"}]}
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = f"{REPO}/examples/flow_policy.py:make_policy"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--bandwidth-gb", type=float, default=10.0, help="link bandwidth of the model, GB/s")
    args = parser.parse_args()

    from scopebench.policy.run.train import PolicyTrainRun
    from scopebench.policy.settings import TrainSettings
    from scopebench.policy.tools import StepCounter
    from scopebench.profiler import ProfilerConfig, base, exchange
    from scopebench.profiler import ledger as ledger_module

    gathers: list[dict] = []
    plain = exchange.gather_objects

    def gather_objects(obj):
        if run.profiler.loop_ended_at is not None:  # the exchange's (not the run id's, before the loop)
            records = bool(obj) and isinstance(obj, list) and isinstance(obj[0], ledger_module.RankRecord)
            gathers.append({"what": "records" if records else "metrics", "bytes": len(pickle.dumps(obj))})
        return plain(obj)

    arithmetic = [0.0]
    plain_metrics = ledger_module.ledger_metrics

    def ledger_metrics(records, rank):
        start = time.perf_counter()
        try:
            return plain_metrics(records, rank)
        finally:
            arithmetic[0] += time.perf_counter() - start

    launched = "LOCAL_RANK" in os.environ
    settings = TrainSettings(
        policy=EXAMPLE, nproc_per_node=1 if launched else args.nproc, backend="ddp", find_unused_params=False
    )
    run = PolicyTrainRun(
        settings,
        dataset_root="",
        chunk_size=8,
        profiler=ProfilerConfig(mode="custom", warmup=2, active=args.steps),
        name="exchange_bytes",
        keep_rows=True,
        defer_exchange=True,
    )
    with run:
        exchange.gather_objects = gather_objects
        ledger_module.ledger_metrics = ledger_metrics
        try:
            run.loop(StepCounter(2 + args.steps))
        finally:
            exchange.gather_objects = plain
            ledger_module.ledger_metrics = plain_metrics
        world, after = run.world_size, run.profiler.after_window_sec
        rank = run.rank
    if rank != 0:
        return
    chunk = base.EXCHANGE_CHUNK
    per = {what: sum(g["bytes"] for g in gathers if g["what"] == what) / args.steps for what in ("records", "metrics")}
    per["total"] = per["records"] + per["metrics"]
    per_rank_arith = arithmetic[0] / args.steps  # this rank's columns of each iteration, every rank's records read
    model = []
    for ranks in (2, 8, 64, 256, 1024):
        received = (ranks - 1) * chunk * per["total"]
        model.append(
            {
                "ranks": ranks,
                "received_mb_per_chunk": received / 1e6,
                "held_records": ranks * chunk,
                "transfer_sec_per_chunk": received / (args.bandwidth_gb * 1e9),
                "arithmetic_sec_per_iteration": per_rank_arith * ranks / world,
            }
        )
    print(f"{world} ranks, {args.steps} recorded iterations, chunk {chunk}: {len(gathers)} gathers after the loop")
    print(
        f"bytes a rank sends per recorded iteration: records {per['records']:.0f}, metrics {per['metrics']:.0f}, "
        f"total {per['total']:.0f}"
    )
    print(f"exchange after the window: {after * 1e3:.1f} ms; ledger arithmetic {per_rank_arith * 1e6:.0f} µs/iteration")
    for m in model:
        print(
            f"  {m['ranks']:5d} ranks: each rank receives {m['received_mb_per_chunk']:.1f} MB per chunk "
            f"({m['transfer_sec_per_chunk'] * 1e3:.1f} ms at {args.bandwidth_gb:g} GB/s), holds {m['held_records']} "
            f"records, arithmetic {m['arithmetic_sec_per_iteration'] * 1e3:.2f} ms per iteration"
        )
    out = {
        "nproc": world,
        "steps": args.steps,
        "chunk": chunk,
        "gathers": gathers,
        "bytes_per_iteration": per,
        "after_window_sec": after,
        "arithmetic_sec_per_iteration": per_rank_arith,
        "model": model,
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
