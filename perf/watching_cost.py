"""What watching costs a small distributed step: ``profile-step``'s own figures on a ~10 ms DDP step.

What it measures: ``scopebench profile-step`` (defaults: the custom profiler with the ledger, the
host sampler, the losses gathered every 64 steps) on the example user policy (``--hidden``,
``--batch-size``: a 5-15 ms step on this machine), DDP, on 2 local ranks (a spawn) and on 4 ranks through
``torchrun`` (a local spawn is capped at the core count), and with ``--worlds 2,4,2n`` on two nodes
(``2n``: one rank in each network namespace of the two-node test cluster, ``tests/slurm/netns.py``,
each its own ``torchrun``, the ranks' traffic over a bridge; root with CAP_NET_ADMIN), ``--rounds``
runs each, each run its own processes. Per run, from its JSON:

* the loop's wall clock per step (``wall_clock_sec`` over warm-up + measured steps: the loop's
  iterations, not the exchange after it) against the mean measured step (``phases.total``, the
  ranks' mean step: no barrier between the steps), as a ratio;
* the profiler's reported cost per step as a share of the step (``profiler_cost.share_pct``) and
  its exchange after the window (``after_window_sec``, once);
* ``sync_gather``'s share of the step (``phases.sync_gather.share``).

Then per world size the median and spread (min-max) over the runs. Issue 47's bar: the wall clock
within 5 % of the mean measured step, the profiler's cost and ``sync_gather`` each under 1 %.

Why: a profiler users leave on must cost about nothing on a small step at any world size.

Run: ``.venv/bin/python perf/watching_cost.py [--rounds 3 --steps 200 --warmup 20 --hidden 1024
--batch-size 64]`` on a quiet machine (``uptime`` under 1.5).

Output: readable lines, then one JSON object on the last line::

    {"policy_args": {...}, "batch_size": int, "steps": int, "warmup": int, "load_average": [...],
     "worlds": {"2"|"4"|"2n": {"runs": [{"wall_over_step", "profiler_pct", "sync_gather_pct",
                                    "step_ms", "after_window_ms", "contended"}],
                           "<figure>": {"median", "min", "max"}}}}
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from scopebench.stats import median

REPO = Path(__file__).resolve().parents[1]
FIGURES = ("wall_over_step", "profiler_pct", "sync_gather_pct", "step_ms", "after_window_ms")


#: The world of ``--worlds`` that runs one rank on each of two nodes: the namespaces of the
#: two-node test cluster (``tests/slurm/netns.py``), linked by a bridge, one torchrun each.
TWO_NODES = "2n"
#: The rendezvous port of the two-node runs (on node 1's address: nothing else listens there).
TWO_NODE_PORT = 29611


def one_run(world: str, args, network=None) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "step.json"
        tool = ["profile-step", "--config", str(REPO / "configs/policy/tiny.yml")]
        tool += ["--policy", f"{REPO}/examples/flow_policy.py:make_policy", "--policy-arg", f"hidden={args.hidden}"]
        tool += ["--batch_size", str(args.batch_size), "--steps", str(args.steps), "--warmup", str(args.warmup)]
        tool += ["--json", str(out)]
        torchrun = str(Path(sys.executable).with_name("torchrun"))
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        if world == TWO_NODES:
            _two_node_run(network, [torchrun, "-m", "scopebench.cli", *tool], env)
        else:
            if world == "2":
                cmd = [sys.executable, "-m", "scopebench.cli", *tool, "--nproc-per-node", "2"]
            else:
                cmd = [torchrun, "--standalone", f"--nproc-per-node={world}", "-m", "scopebench.cli", *tool]
            done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO, timeout=1800)
            if done.returncode != 0:
                raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stderr[-3000:]}")
        report = json.loads(out.read_text())
    step = report["phases"]["total"]["mean_sec"]
    wall_per_step = report["wall_clock_sec"] / (args.warmup + args.steps)
    cost = report["profiler_cost"]
    return {
        "wall_over_step": wall_per_step / step,
        "profiler_pct": cost["share_pct"],
        "sync_gather_pct": report["phases"]["sync_gather"]["share"] * 100,
        "step_ms": step * 1e3,
        "after_window_ms": (cost.get("after_window_sec") or 0.0) * 1e3,
        "contended": bool((report.get("contention") or {}).get("contended")),
    }


def _two_node_run(network, command: list[str], env: dict) -> None:
    """``command`` (torchrun, then the tool) as one rank on each node of ``network``: node 1 holds
    the rendezvous, node 2 reaches it over the bridge; both must end well."""
    torchrun, tool = command[0], command[1:]
    master = network.nodes[0].addr
    procs = []
    for rank, node in enumerate(network.nodes):
        launch = [torchrun, "--nnodes=2", f"--node-rank={rank}", "--nproc-per-node=1"]
        launch += [f"--master-addr={master}", f"--master-port={TWO_NODE_PORT}"]
        cmd = [*network.exec_prefix(node.name), *launch, *tool]
        procs.append(
            (cmd, subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO))
        )
    failed = []
    for cmd, proc in procs:
        try:
            _, err = proc.communicate(timeout=1800)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
        if proc.returncode != 0:
            failed.append(f"{' '.join(cmd)} failed ({proc.returncode}):\n{err[-3000:]}")
    if failed:
        raise RuntimeError("\n".join(failed))


def _network():
    """The two nodes' namespaces (root with CAP_NET_ADMIN, as the SLURM tests need)."""
    sys.path.insert(0, str(REPO / "tests" / "slurm"))
    import netns

    missing = netns.missing_network_prerequisites()
    if missing:
        raise SystemExit(f"--worlds {TWO_NODES}: this machine lacks {', '.join(missing)}")
    netns.remove_stale()
    return netns.Network.create([f"{netns.PREFIX}{i}" for i in (1, 2)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--worlds", default="2,4")
    args = parser.parse_args()
    worlds = args.worlds.split(",")
    bad = [w for w in worlds if w not in ("2", "4", TWO_NODES)]
    if bad:
        raise SystemExit(f"--worlds: {bad} not among 2, 4 and {TWO_NODES} (one rank on each of two nodes)")
    network = _network() if TWO_NODES in worlds else None
    out: dict = {"policy_args": {"hidden": args.hidden}, "batch_size": args.batch_size, "steps": args.steps}
    out.update(warmup=args.warmup, load_average=[os.getloadavg()[0]], worlds={})
    for world in worlds:
        out["worlds"][world] = {"runs": []}
    try:
        for r in range(args.rounds):
            for world in worlds if r % 2 == 0 else worlds[::-1]:
                run = one_run(world, args, network)
                out["worlds"][world]["runs"].append(run)
                shown = ", ".join(f"{k} {run[k]:.3f}" for k in FIGURES)
                print(f"round {r + 1} world {world}: {shown}{' CONTENDED' if run['contended'] else ''}", flush=True)
    finally:
        if network is not None:
            network.remove()
    out["load_average"].append(os.getloadavg()[0])
    for world, entry in out["worlds"].items():
        for key in FIGURES:
            values = [run[key] for run in entry["runs"]]
            entry[key] = {"median": median(values), "min": min(values), "max": max(values)}
        print(
            f"{world if world != TWO_NODES else '2 nodes x 1'} ranks: wall / step {entry['wall_over_step']['median']:.3f} "
            f"[{entry['wall_over_step']['min']:.3f}-{entry['wall_over_step']['max']:.3f}], profiler "
            f"{entry['profiler_pct']['median']:.2f}% [{entry['profiler_pct']['min']:.2f}-"
            f"{entry['profiler_pct']['max']:.2f}], sync_gather {entry['sync_gather_pct']['median']:.2f}% "
            f"[{entry['sync_gather_pct']['min']:.2f}-{entry['sync_gather_pct']['max']:.2f}], step "
            f"{entry['step_ms']['median']:.2f} ms, exchange after the window {entry['after_window_ms']['median']:.0f} ms"
        )
    print(json.dumps(out))


if __name__ == "__main__":
    main()
