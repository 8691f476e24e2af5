"""One rank of a probe job: joins the launcher's group through DistSession, prints what it saw.

``srun python rank_probe.py``: each task creates the process group exactly as a solver's
ranks do (:class:`scopebench.distributed.DistSession`: rendezvous from the SLURM variables,
the interface towards it), then every rank all-gathers ``(rank, world size, node, the
rendezvous host, GLOO_SOCKET_IFNAME)`` and a tensor sum, and rank 0 prints them as one
JSON line ``probe: {...}``.
"""

from __future__ import annotations

import json
import os


def main() -> None:
    import torch
    import torch.distributed as dist

    from scopebench.distributed import DistSession

    with DistSession(1, timeout_sec=float(os.environ.get("PROBE_TIMEOUT_SEC", "30"))) as info:
        mine = {
            "rank": info.rank,
            "world_size": dist.get_world_size(),
            "node": os.environ.get("SLURMD_NODENAME"),
            "master_addr": info.master_addr,
            "ifname": os.environ.get("GLOO_SOCKET_IFNAME"),
        }
        everyone = [None] * info.world_size
        dist.all_gather_object(everyone, mine)
        total = torch.tensor([float(info.rank + 1)])
        dist.all_reduce(total)
        if info.rank == 0:
            print("probe: " + json.dumps({"ranks": everyone, "sum": total.item()}), flush=True)


if __name__ == "__main__":
    main()
