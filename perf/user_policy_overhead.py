"""What the suite costs on a user policy: the ``profile-step`` loop against a bare PyTorch loop.

What it measures, for one policy factory (default: Hugging Face's PaliGemma,
``scopebench.policy.paligemma:make_paligemma_policy``) on one CPU process, interleaved step
by step (A, B, A, B...: the suite's callback runs one bare step, whose time is taken out of
the suite's period, so a burst of background load hits both sides alike), in rounds:

* **A, the suite**: the period of one iteration of the ``PolicyTrainRun`` loop that
  ``scopebench profile-step`` runs (accelerate, the custom profiler's seven regions, the
  loss gather started every ``GATHER_EVERY`` steps and the profiler's exchange deferred to the
  loop's end, as ``profile-step`` does); with ``--exchange step`` the loop of ``Pi05Train`` under
  benchopt instead (the gather every step, the exchange after every iteration, and a callback
  that collects ``run.metrics()`` every step, as benchopt's does);
* **B, bare**: the loop a user would write for the same step, on the same model object (two
  separately allocated copies of a model differ by a few percent in speed on their own, from
  where their memory lies), with its own AdamW and its own ``DataLoader`` of the same data:
  the next batch, moved to the device, ``loss(model, batch)``, ``backward``, gradient
  clipping at 1.0, AdamW, ``zero_grad``.

* **C, control**: a second bare loop (its own AdamW and loader, the same model), run beside B
  in the same callback: C / B is what the method reads when both sides are the same (the
  noise floor on this machine).

Reported: the median step of each side over all rounds, their ratio (goal <= 1.02) and each
round's ratio of medians (the spread), the median of the step-paired ratios (each A step over
the B step beside it: what a shared machine disturbs least), the ratio of the 10th
percentiles (each side's least disturbed steps), the control's ratios and the suite's fixed
cost per step (median A − median B, in ms). Weights are random; the cost depends on shapes only.

How to run (a single process, no launcher)::

    python perf/user_policy_overhead.py                       # PaliGemma, 2 threads
    python perf/user_policy_overhead.py --policy examples/flow_policy.py:make_policy --policy-arg hidden=256
    python perf/user_policy_overhead.py --policy examples/flow_policy.py:make_policy --policy-arg hidden=256 \
        --batch-size 32 --threads 1 --clock thread    # CPU time: on a shared machine

``--clock thread`` times each side by the main thread's CPU time (``time.thread_time``): with one
thread and no loader workers (the default) that is all of a step's work, and what other processes
change least (wall clock on a loaded machine is mostly their time slices).

Output: readable lines, then one JSON object on the last line::

    {"policy", "policy_args", "torch_version", "num_threads", "clock", "exchange", "batch_size", "load_average_start",
     "load_average_end", "suite_step_sec": [...], "bare_step_sec": [...], "ratio": float,
     "ratio_per_round": [...], "paired_ratio", "p10_ratio", "control_step_sec": [...], "control_paired_ratio",
     "control_ratio", "control_ratio_per_round": [...],
     "suite_fixed_cost_sec", "goal": 1.02, "met": bool,
     "conditions": {...}}   # each round's other-process CPU and steal (perf/round_conditions.py)
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
from round_conditions import RoundConditions  # perf/ is the script's folder

from scopebench.commands.profile_step import GATHER_EVERY
from scopebench.policy.calls import make_policy_loader, to_device
from scopebench.policy.run.steps import BatchStream
from scopebench.policy.run.train import PolicyTrainRun
from scopebench.policy.settings import TrainSettings
from scopebench.policy.tools import policy_flags
from scopebench.policy.user import build_policy
from scopebench.profiler import ProfilerConfig
from scopebench.stats import median, percentile
from scopebench.train import build_adamw

GOAL = 1.02
#: What a step's time is read from (``--clock``).
CLOCKS = {"wall": time.perf_counter, "thread": time.thread_time}
PALIGEMMA = "scopebench.policy.paligemma:make_paligemma_policy"


def bare_loop(settings: TrainSettings, model: torch.nn.Module):
    """A step function of the loop a user writes by hand for ``model`` (the suite's own)."""
    policy = build_policy(settings.policy, settings.policy_args, seed=settings.seed)  # its loss and data
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = build_adamw(params, lr=settings.learning_rate, weight_decay=settings.weight_decay)
    batches = BatchStream(make_policy_loader(policy, settings.batch_size, seed=settings.seed))
    device = torch.device("cpu")

    def step() -> None:
        # The user's own call, as written by hand: policy_loss's checks watch the policy's own
        # model object (this loop trains the suite's, so they would never see it called).
        loss = policy.loss(model, to_device(next(batches), device))
        if isinstance(loss, tuple):  # (loss, {name: term})
            loss = loss[0]
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, settings.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--policy", default=PALIGEMMA)
    parser.add_argument("--policy-arg", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=20, help="steps of each side per round")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--clock",
        choices=sorted(CLOCKS),
        default="wall",
        help="what a step's time is: wall clock, or the process's main thread's CPU time (with --threads 1 "
        "and no loader workers all of the step's work: what other processes on a shared machine change least)",
    )
    parser.add_argument(
        "--exchange",
        choices=("window", "step"),
        default="window",
        help="window: profile-step's loop (the profiler's exchange at the loop's end); step: benchopt's "
        "(the exchange after every iteration, run.metrics() collected every step)",
    )
    parser.add_argument("--json-out", default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    clock = CLOCKS[args.clock]
    policy_args = {key.split(".", 1)[1]: value for key, value in policy_flags(None, args.policy_arg)}
    per_step = args.exchange == "step"
    settings = TrainSettings(
        policy=args.policy,
        policy_args=policy_args,
        batch_size=args.batch_size,
        learning_rate=1e-4,
        device="cpu",
        # profile-step gathers the losses every GATHER_EVERY steps; benchopt's loop every step
        gather_every=1 if per_step else GATHER_EVERY,
    )
    load_start = os.getloadavg()
    run = PolicyTrainRun(
        settings,
        dataset_root="",
        chunk_size=8,
        profiler=ProfilerConfig(mode="custom"),
        name="user_policy_overhead",
        keep_rows=not per_step,
        defer_exchange=not per_step,  # profile-step's: its rows are read after the loop
    )
    suite, plain, ratios, same, same_ratios = [], [], [], [], []
    with run:
        bare, control = bare_loop(settings, run.model), bare_loop(settings, run.model)
        for _ in range(args.warmup):
            bare()
        run.loop(lambda: run.work.steps < args.warmup)
        conditions = RoundConditions()
        for r in range(args.rounds):
            ticks: list[float] = []
            bare_sec: list[float] = []
            control_sec: list[float] = []

            def callback() -> bool:
                ticks.append(clock())
                if len(ticks) > 1 and per_step:
                    run.metrics()  # what benchopt's callback collects every step (get_result)
                if len(ticks) <= args.steps:  # B and C between two A steps; their time is taken out of A's period
                    first, second = (bare, control) if len(ticks) % 2 else (control, bare)
                    start = clock()
                    first()
                    middle = clock()
                    second()
                    end = clock()
                    b, c = (middle - start, end - middle) if first is bare else (end - middle, middle - start)
                    bare_sec.append(b)
                    control_sec.append(c)
                return len(ticks) <= args.steps

            with conditions.round():
                run.loop(callback)
            a = [t1 - t0 - b - c for t0, t1, b, c in zip(ticks, ticks[1:], bare_sec, control_sec)]
            suite += a
            plain += bare_sec
            same += control_sec
            ratios.append(median(a) / median(bare_sec))
            same_ratios.append(median(control_sec) / median(bare_sec))
            print(
                f"round {r}: suite {median(a) * 1e3:.2f} ms, bare {median(bare_sec) * 1e3:.2f} ms, "
                f"ratio {ratios[-1]:.4f} {conditions.tag(r)}"
            )
    ratio = median(suite) / median(plain)
    paired = median([a / b for a, b in zip(suite, plain)])  # each A step over the B step beside it
    low = percentile(suite, 10) / percentile(plain, 10)  # the least disturbed steps of each side
    result = {
        "policy": args.policy,
        "policy_args": policy_args,
        "torch_version": torch.__version__,
        "num_threads": args.threads,
        "clock": args.clock,
        "exchange": args.exchange,
        "batch_size": args.batch_size,
        "load_average_start": list(load_start),
        "load_average_end": list(os.getloadavg()),
        "suite_step_sec": suite,
        "bare_step_sec": plain,
        "ratio": ratio,
        "ratio_per_round": ratios,
        "paired_ratio": paired,
        "p10_ratio": low,
        "control_step_sec": same,
        "control_paired_ratio": median([c / b for c, b in zip(same, plain)]),
        "control_ratio": median(same) / median(plain),
        "control_ratio_per_round": same_ratios,
        "suite_fixed_cost_sec": median(suite) - median(plain),
        "goal": GOAL,
        "met": ratio <= GOAL,
        "conditions": conditions.as_dict(),
    }
    print(
        f"profile-step loop / bare loop: {ratio:.4f} (rounds {min(ratios):.3f}..{max(ratios):.3f}; median step "
        f"{median(plain) * 1e3:.1f} ms bare; goal <= {GOAL}); control (bare / bare) {result['control_ratio']:.4f} "
        f"(rounds {min(same_ratios):.3f}..{max(same_ratios):.3f}); load {load_start[0]:.1f} -> {os.getloadavg()[0]:.1f}"
    )
    print(
        f"step-paired median ratio {paired:.4f} (control {result['control_paired_ratio']:.4f}); "
        f"10th-percentile ratio {low:.4f}; suite's fixed cost {result['suite_fixed_cost_sec'] * 1e3:.2f} ms a step"
    )
    print(conditions.summary_line())
    if args.json_out:
        with open(args.json_out, "w") as fh:
            json.dump(result, fh)
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
