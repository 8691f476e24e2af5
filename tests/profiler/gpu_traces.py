"""The vendored real GPU traces (tests/data/hta, README there) and what the tests derive from them:
HTA's own numbers on a file, and a pair of ranks in which one rank reaches each step's first
all-reduce late."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path
from typing import Any

from scopebench.profiler.kineto import RankEvents

HTA_DATA = Path(__file__).resolve().parents[1] / "data" / "hta"
#: file -> what HTA's test data calls it (README).
TRACES = {
    "nccl_data.json.gz": "A100 rank 0 of 2, NCCL 2.17",
    "sampled_rank-0.json.gz": "rank 0 of a 128-rank job",
    "sampled_rank-1.json.gz": "rank 1 of a 128-rank job",
    "v100_rank1.json.gz": "V100 rank 1 of 2",
    "mi250_minitoy_train_ROCm6_2_kineto.json.gz": "AMD MI250, ROCm 6.2, no communication",
}
NEW_NCCL_NAME = "ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)"


def hta_numbers(path: Path, tmp: Path, ns_rounding: bool = False) -> dict[str, float]:
    """HTA's figures for the one rank in ``path`` (µs, ``overlap_pct``), its ns rounding on or off
    (off: the same event times as the ledger's; HTA's default rounds them to whole µs)."""
    import logging
    import warnings

    from hta.configs.env_options import HTAEnvOptions
    from hta.trace_analysis import TraceAnalysis

    folder = tmp / path.name.split(".")[0]
    folder.mkdir()
    (folder / path.name).symlink_to(path)
    options = HTAEnvOptions.instance()
    before = options.disable_ns_rounding()
    options.set_disable_ns_rounding(not ns_rounding)
    logging.disable(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # HTA's pandas deprecations, and its 0 / 0 without communication
            analyzer = TraceAnalysis(trace_dir=str(folder))
            (temporal,) = analyzer.get_temporal_breakdown(visualize=False).to_dict("records")
            kinds, _ = analyzer.get_gpu_kernel_breakdown(visualize=False, include_memory_kernels=True)
            (overlap,) = analyzer.get_comm_comp_overlap(visualize=False).to_dict("records")
    finally:
        options.set_disable_ns_rounding(before)
        logging.disable(logging.NOTSET)
    sums = dict(zip(kinds["kernel_type"], kinds["sum"]))
    return {
        "span": temporal["kernel_time(us)"],
        "idle": temporal["idle_time(us)"],
        "compute": temporal["compute_time(us)"],
        "comm": sum(v for k, v in sums.items() if "COMMUNICATION" in k),
        "memory": sum(v for k, v in sums.items() if "MEMORY" in k),
        "overlap_pct": overlap["comp_comm_overlap_pctg"],
    }


def rounded_as_hta(events: RankEvents) -> RankEvents:
    """``events`` with HTA's default rounding of a trace of sub-µs times (its ``round_down_time_stamps``:
    each event's start up to the next µs, its end down), launches included."""
    gpu = [op._replace(start=math.ceil(op.start), end=math.floor(op.end)) for op in events.gpu]
    launches = {k: math.ceil(v) for k, v in events.launches.items()}
    steps = {n: (math.ceil(s), math.floor(e)) for n, (s, e) in events.steps.items()}
    return RankEvents(events.path, events.meta, [op for op in gpu if op.end >= op.start], launches, steps)


def first_all_reduce_starts(trace: dict[str, Any]) -> list[float]:
    """Per ``ProfilerStep#N`` but the last, the GPU start of the first all-reduce launched in it."""
    events = trace["traceEvents"]
    steps = sorted(
        (e["ts"], e["ts"] + e["dur"])
        for e in events
        if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#")
    )
    launches = {
        e["args"]["correlation"]: e["ts"]
        for e in events
        if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})
    }
    reduces = sorted(
        (e["ts"], launches[e["args"]["correlation"]])
        for e in events
        if e.get("cat") == "kernel" and e.get("args", {}).get("Collective name") == "allreduce"
    )
    out = []
    for lo, hi in steps[:-1]:
        out.append(next(start for start, launch in reduces if lo <= launch < hi))
    return out


def derive_pair(source: Path, folder: Path, delay_us: float, new_names: bool = False) -> list[Path]:
    """Two ranks from one real rank's trace: rank 1's GPU reaches each step's first all-reduce
    ``delay_us`` late (everything it does from there on, host and GPU, ``delay_us`` later per such
    step), rank 0 waits inside that all-reduce (its kernel ``delay_us`` longer, everything after it
    later as well). ``new_names``: NCCL >= 2.19's kernel name on both."""
    trace = json.loads(gzip.decompress(source.read_bytes()))
    cuts = first_all_reduce_starts(trace)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for rank in (0, 1):
        out = json.loads(json.dumps(trace))
        out["distributedInfo"] = {**trace["distributedInfo"], "rank": rank}
        for e in out["traceEvents"]:
            if e.get("ph") != "X":
                continue
            ts, end = e["ts"], e["ts"] + e.get("dur", 0)
            shift = 0.0
            stretch = 0.0
            for cut in cuts:
                if rank == 0 and ts == cut and e.get("cat") == "kernel" and "nccl" in e["name"]:
                    stretch += delay_us  # it waits inside its all-reduce
                elif ts >= cut:
                    shift += delay_us
                elif end > cut and e.get("cat") in ("user_annotation", "cpu_op", "python_function"):
                    stretch += delay_us  # a host range around the cut (its step) holds what moved
            e["ts"] = ts + shift
            e["dur"] = e.get("dur", 0) + stretch
            if new_names and e.get("cat") == "kernel" and e["name"].startswith("ncclKernel_"):
                e["name"] = NEW_NCCL_NAME
        path = folder / f"derived_rank{rank}.json.gz"
        path.write_bytes(gzip.compress(json.dumps(out).encode(), compresslevel=1))
        paths.append(path)
    return paths
