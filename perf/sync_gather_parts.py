"""What ``sync_gather`` spends per step on two gloo ranks: building the values, starting the
asynchronous gather, polling the gathers in flight (docs/performance.md, "What watching costs").

What it measures: two spawned gloo ranks (one thread each), 300 steps 5 ms apart; per step the
values ``TrainStep._start_gather`` builds (a loss and one term as tensors, the NaN filler, the RSS
peak from ``getrusage``, stacked and concatenated: ``build``), one
:class:`scopebench.policy.run.steps._Gather` started (``launch``: gloo's asynchronous
``all_gather``), then the gathers done taken (``ready``). Rank 0's means per step.

Why: issue 47's bar is ``sync_gather`` under 1 % of a ~10 ms step; this says which part of it is
the suite's Python and which the collective's launch.

Run: ``OMP_NUM_THREADS=1 .venv/bin/python perf/sync_gather_parts.py`` on a quiet machine.

Output: one line, a dict of the three means (``us``).
"""

import os
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from scopebench.policy.run.steps import _Gather


def work(rank):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29533")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    import resource

    t = {k: 0.0 for k in ("build", "launch", "ready")}
    inflight = []
    N = 300
    for i in range(N):
        loss = torch.randn(())
        terms = {"a": torch.randn(())}
        a = time.perf_counter()
        nan = torch.tensor(float("nan"))
        values = [loss.float(), terms.get("a", nan).to(loss.device).float()]
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        peaks = torch.tensor([rss, 0.0])
        mine = torch.cat([torch.stack(values), peaks])
        b = time.perf_counter()
        g = _Gather(mine, 2, [i])
        c = time.perf_counter()
        inflight.append(g)
        while inflight and inflight[0].ready():
            inflight.pop(0).rows()
        d = time.perf_counter()
        t["build"] += b - a
        t["launch"] += c - b
        t["ready"] += d - c
        time.sleep(0.005)
    if rank == 0:
        print({k: f"{v / N * 1e6:.1f} us" for k, v in t.items()})
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(work, nprocs=2)
