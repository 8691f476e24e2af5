"""Rank 0 of a 2-rank PnP run (32 px) that a test kills: ``python rank0_driver.py OUTPUT_DIR``.

Prints one JSON line ``{"workers": [pid], "run_dir": str}`` once three iterations are done,
then iterates until killed (at most ten minutes), with per-rank CSV files enabled so that a
leftover file would show.
"""

from __future__ import annotations

import json
import sys
import time

from scopebench.imaging.inference.run import PnPRun

FRAMES = {"kind": "multiframe_superres", "image_size": 32, "num_operators": 4, "scale": 2, "noise_level": 0.02}


def main(output_dir: str) -> None:
    run = PnPRun(
        FRAMES,
        {"denoiser": "tv", "denoiser_sigma": 0.01, "distribute_physics": True, "device": "cpu"},
        nproc=2,
        profiler={"profiler_save_file": True},
        output_dir=output_dir,
        name="killed",
    )
    deadline = time.monotonic() + 600

    def callback() -> bool:
        if run.profiler.iteration == 3:
            print(json.dumps({"workers": run.session.worker_pids, "run_dir": str(run.session.run_dir)}), flush=True)
        time.sleep(0.02)
        return time.monotonic() < deadline

    with run:
        run.loop(callback)


if __name__ == "__main__":
    main(sys.argv[1])
