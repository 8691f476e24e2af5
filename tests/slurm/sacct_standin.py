"""``sacct`` for a cluster without slurmdbd: job states from ``scontrol show job``.

Submitit asks ``sacct -o JobID,State,NodeList --parsable2 -j <id> ...`` for the states of
its jobs; without accounting the real ``sacct`` fails and every state stays UNKNOWN, so a
job that died without writing its result is never seen to finish. This stand-in answers
the same question from the controller's memory (finished jobs stay there ``MinJobAge``
seconds). Only ``-j/--jobs``, ``-o/--format`` and ``--parsable2`` are understood; fields
other than JobID, State and NodeList are left empty.
"""

from __future__ import annotations

import argparse
import subprocess
import sys


def _records(job_id: str) -> list[dict[str, str]]:
    proc = subprocess.run(["scontrol", "show", "job", "--oneliner", job_id], capture_output=True, text=True)
    if proc.returncode != 0:
        return []  # unknown (yet, or purged): sacct prints no line either
    records = []
    for line in proc.stdout.splitlines():
        fields = dict(token.split("=", 1) for token in line.split() if "=" in token)
        if "JobId" in fields:
            records.append(fields)
    return records


def _job_id(record: dict[str, str]) -> str:
    array_id, task = record.get("ArrayJobId"), record.get("ArrayTaskId")
    if array_id and task:
        # A pending range ("1-3%2") is written the way sacct writes it: 7_[1-3%2].
        return f"{array_id}_[{task}]" if any(c in task for c in "-,%") else f"{array_id}_{task}"
    return record["JobId"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sacct", description=__doc__)
    parser.add_argument("-j", "--jobs", action="append", default=[])
    parser.add_argument("-o", "--format", default="JobID,State,NodeList")
    parser.add_argument("--parsable2", "-P", action="store_true")
    args, _ = parser.parse_known_args(argv)
    names = args.format.split(",")
    values = {"JobID": _job_id, "State": lambda r: r.get("JobState", ""), "NodeList": lambda r: r.get("NodeList", "")}
    print("|".join(names))
    for job in (j for group in args.jobs for j in group.split(",") if j):
        for record in _records(job):
            print("|".join(values[name](record) if name in values else "" for name in names))
    return 0


if __name__ == "__main__":
    sys.exit(main())
