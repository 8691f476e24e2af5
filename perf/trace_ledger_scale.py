"""``scopebench trace-ledger`` on a large generated folder: its speed and peak memory per rank count.

What it measures: a data-parallel job of ``--ranks`` ranks is written as gzipped Kineto traces
(``tests/profiler/kineto_synth.py``'s generator: per step and rank ``--kernels`` compute kernels,
the gradients' all-reduce, a memcpy; ``--steps`` steps plus the last one the window drops), then
``scopebench trace-ledger`` reads the folder in a child process under ``/usr/bin/time -v``, once
with the first rank only, once with every rank, and once more with the first rank and ``--json``
(whose path check imports torch): wall time, events per second and peak RSS (``Maximum resident
set size``). Why: the command streams one rank at a time and keeps only
summaries and per-collective records, so its memory should stay that of one rank however many
ranks the folder holds (issue 45, "in bounded memory").

How to run::

    python perf/trace_ledger_scale.py --ranks 64 --kernels 5000 --steps 5 [--folder /tmp/ledger64]

Output: one line per run, then one JSON object on the last line::

    {"ranks", "events_per_rank", "bytes_per_rank", "json_bytes_per_rank", "runs": [{"ranks", "json",
     "wall_sec", "events_per_sec", "peak_rss_mb"}], "load_average"}
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from profiler.kineto_synth import JobSpec, ddp_job  # noqa: E402


def _run(files: list[Path], out: Path | None) -> dict:
    command = ["/usr/bin/time", "-v", sys.executable, "-m", "scopebench.cli", "trace-ledger", *map(str, files)]
    command += ["--json", str(out)] if out is not None else []
    start = time.perf_counter()
    proc = subprocess.run(command, capture_output=True, text=True, check=True)
    wall = time.perf_counter() - start
    rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", proc.stderr).group(1))
    return {"ranks": len(files), "json": out is not None, "wall_sec": wall, "peak_rss_mb": rss / 1024}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--kernels", type=int, default=5000, help="compute kernels per step and rank")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--folder", default=None, help="where the traces go (default: a temporary folder)")
    args = parser.parse_args(argv)
    folder = Path(args.folder or tempfile.mkdtemp(prefix="trace_ledger_scale_"))
    files = ddp_job(JobSpec(world=args.ranks, steps=args.steps, extra=args.kernels, late=1, delay=3000.0), folder)
    text = gzip.decompress(files[0].read_bytes())
    events = len(json.loads(text)["traceEvents"])
    result = {
        "ranks": args.ranks,
        "events_per_rank": events,
        "bytes_per_rank": files[0].stat().st_size,
        "json_bytes_per_rank": len(text),
        "runs": [],
    }
    for some, out in ((files[:1], None), (files, None), (files[:1], folder / "ledger.json")):
        run = _run(some, out)
        run["events_per_sec"] = events * len(some) / run["wall_sec"]
        result["runs"].append(run)
        print(
            f"{run['ranks']:>4} rank(s){' --json' if run['json'] else ''}: {run['wall_sec']:.1f} s, "
            f"{run['events_per_sec'] / 1e3:.0f} k events/s, peak RSS {run['peak_rss_mb']:.0f} MB",
            flush=True,
        )
    result["load_average"] = os.getloadavg()
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
