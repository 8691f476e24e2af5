"""Start the test suite's local SLURM by hand: one node, or two nodes in their own network namespaces.

Run as root from the repository root::

    .venv/bin/python scripts/local_slurm.py --nodes 2

It prints the ``SLURM_CONF`` and ``PATH`` to export in another shell (then ``sinfo``,
``sbatch``, ``benchopt run ... --parallel-config`` use this cluster), and stops everything
(daemons, namespaces, links, host names) on Ctrl-C or SIGTERM. It is the tests' own cluster
(``tests/slurm/cluster.py``): it waits while a test session holds one, and a test session
waits for it.
"""

from __future__ import annotations

import argparse
import shlex
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    from tests.slurm.cluster import local_slurm

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, choices=(1, 2), default=2)
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        with local_slurm(args.nodes) as cluster:
            nodes = ", ".join(f"{node.name} ({node.addr})" for node in cluster.nodes)
            print(
                f"{len(cluster.nodes)}-node SLURM up in {cluster.start_sec:.1f} s: {nodes}; logs in {cluster.root}/log"
            )
            print("in another shell:")
            for key, value in cluster.env.items():
                print(f"  export {key}={shlex.quote(value)}")
            print("Ctrl-C stops it", flush=True)
            signal.pause()
    except KeyboardInterrupt:
        pass
    except RuntimeError as err:
        print(f"local_slurm: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
