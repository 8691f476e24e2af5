"""Dataloader ceiling on the LeRobot v3.0 synthetic dataset: video (H.264, AV1) vs PNG.

What it measures, on the synthetic dataset written in LeRobot v3.0 layout at 224 x 224 with
2 cameras (``--episodes`` x ``--length`` frames, written once under ``--data-dir``), once
per storage: ``h264`` and ``av1`` MP4 (``g=2``, :mod:`scopebench.policy.data.video`) and ``png``
(PNG bytes in the parquet files, ``video: false``):

1. **Decode per frame.** ``RobotDataset.camera_frame`` on ``--frames`` random frames (seek +
   decode + RGB conversion for MP4, PIL decode for PNG), in this process, one intra-op
   thread: the median microseconds per camera frame.
2. **Samples/s** of ``make_dataloader`` (the training sampler, ``--batch-size`` samples per
   batch, collate) with 0, 1 and 2 workers (persistent, prefetch 2): ``--batches`` batches
   timed after 2 warm-up batches, no model and no host preprocessing (``profile-dataloader``
   adds the latter), so this is the input pipeline's ceiling.

Every (storage, workers) pair and every decode measurement runs once per round, in rounds
(A, B, C, A, B, C...), so that drift on the shared machine hits all of them alike; the
median over rounds and the spread (min-max) are printed. Why: with video, decoding is where
a robot-learning input pipeline spends its time, and it decides how many workers a step needs.

Run: ``.venv/bin/python perf/dataloader_speed.py [--rounds 5 --batches 20 --batch-size 8]``.

Output: human-readable lines, then one JSON object on the last line::

    {"image_size": int, "cameras": int, "frames": int, "rounds": int, "batch_size": int,
     "load_before": [float, float, float], "load_after": [...],
     "decode_us_per_frame": {storage: {"median": float, "min": float, "max": float}},
     "samples_per_sec": {storage: {workers: {"median": float, "min": float, "max": float}}},
     "conditions": {...}}   # each round's other-process CPU and steal (perf/round_conditions.py)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from pathlib import Path

import torch
from round_conditions import RoundConditions  # perf/ is the script's folder

from scopebench.policy.data.dataset import RobotDataset, make_dataloader
from scopebench.policy.data.synthetic import SyntheticRobotConfig, cached_synthetic_dataset
from scopebench.stats import median

STORAGES = {"h264": dict(video=True, codec="h264"), "av1": dict(video=True, codec="av1"), "png": dict(video=False)}
WORKERS = (0, 1, 2)


def decode_us(dataset: RobotDataset, frames: int, seed: int) -> float:
    """Median microseconds to decode one camera frame, over ``frames`` random (frame, camera) pairs."""
    rng = random.Random(seed)
    times = []
    for _ in range(frames):
        i, camera = rng.randrange(len(dataset)), rng.choice(dataset.cameras)
        start = time.perf_counter()
        dataset.camera_frame(camera, i)
        times.append(time.perf_counter() - start)
    return median(times) * 1e6


def samples_per_sec(dataset: RobotDataset, workers: int, batch_size: int, batches: int, seed: int) -> float:
    """Samples/s of ``batches`` batches after 2 warm-up batches (workers already started)."""
    loader = make_dataloader(
        dataset,
        batch_size,
        num_samples=(batches + 2) * batch_size,  # the sampler cycles through a small dataset
        seed=seed,
        num_workers=workers,
        persistent_workers=workers > 0,
        pin_memory=False,
    )
    stream = iter(loader)
    for _ in range(2):
        next(stream)
    start = time.perf_counter()
    for _ in range(batches):
        next(stream)
    elapsed = time.perf_counter() - start
    del stream, loader  # stops the workers before the next measurement
    return batches * batch_size / elapsed


def spread(values: list[float]) -> dict[str, float]:
    return {"median": median(values), "min": min(values), "max": max(values)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--frames", type=int, default=200, help="random frames per decode measurement")
    parser.add_argument("--episodes", type=int, default=8)
    parser.add_argument("--length", type=int, default=40, help="frames per episode")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--data-dir", default="outputs/datasets/perf")
    args = parser.parse_args()
    torch.set_num_threads(1)  # as in DataLoader workers; the 0-worker loop is then comparable
    load_before = list(os.getloadavg())
    datasets = {}
    for name, storage in STORAGES.items():
        cfg = SyntheticRobotConfig(
            num_episodes=args.episodes, episode_length=args.length, image_size=args.image_size, **storage
        )
        start = time.perf_counter()
        root = cached_synthetic_dataset(Path(args.data_dir), cfg)
        datasets[name] = RobotDataset(root, chunk_size=8)
        size_mb = sum(p.stat().st_size for p in root.rglob("*") if p.is_file()) / 2**20
        print(f"{name}: {root} ({size_mb:.1f} MiB, ready in {time.perf_counter() - start:.1f} s)", flush=True)
    decode = {name: [] for name in STORAGES}
    rates = {name: {w: [] for w in WORKERS} for name in STORAGES}
    conditions = RoundConditions()
    for r in range(args.rounds):
        with conditions.round():
            for name, ds in datasets.items():
                decode[name].append(decode_us(ds, args.frames, seed=r))
            for w in WORKERS:
                for name, ds in datasets.items():
                    rates[name][w].append(samples_per_sec(ds, w, args.batch_size, args.batches, seed=r))
        print(f"round {r + 1}/{args.rounds} done (load {os.getloadavg()[0]:.2f}) {conditions.tag(r)}", flush=True)
    result = {
        "image_size": args.image_size,
        "cameras": 2,
        "frames": args.episodes * args.length,
        "rounds": args.rounds,
        "batch_size": args.batch_size,
        "load_before": load_before,
        "load_after": list(os.getloadavg()),
        "decode_us_per_frame": {name: spread(v) for name, v in decode.items()},
        "samples_per_sec": {name: {w: spread(v) for w, v in by.items()} for name, by in rates.items()},
        "conditions": conditions.as_dict(),
    }
    print(f"\ndecode per camera frame ({args.image_size} x {args.image_size}), median [min-max] over rounds:")
    for name, s in result["decode_us_per_frame"].items():
        print(f"  {name:5s} {s['median']:8.0f} us  [{s['min']:.0f}-{s['max']:.0f}]")
    print(f"samples/s (batch {args.batch_size}, 2 cameras), median [min-max] over rounds:")
    for name, by in result["samples_per_sec"].items():
        cells = "  ".join(f"{w} workers {s['median']:7.1f} [{s['min']:.0f}-{s['max']:.0f}]" for w, s in by.items())
        print(f"  {name:5s} {cells}")
    png = result["samples_per_sec"]["png"]
    for name in ("h264", "av1"):
        ratios = ", ".join(
            f"{w}w {result['samples_per_sec'][name][w]['median'] / png[w]['median']:.2f}" for w in WORKERS
        )
        print(f"  {name} / png samples/s: {ratios}")
    print(conditions.summary_line())
    print(json.dumps(result))


if __name__ == "__main__":
    main()
