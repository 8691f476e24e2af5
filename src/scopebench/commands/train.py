"""Train the policy with checkpoints and exact resume, on any training backend (``--backend``).

What it does: ``training.steps`` optimizer steps of the training step of ``Pi05Train``
(:mod:`scopebench.policy.run.trainer`, the same :class:`~scopebench.policy.run.train.PolicyTrainRun`),
logging loss, global samples/s and the phase means every ``--log_freq`` steps (a progress bar
on a terminal), saving ``<output_dir>/checkpoints/<step:06d>/`` every ``--save_freq`` steps
and at the end, with a ``checkpoints/last`` link. Why: to train for real and trust the
checkpoints — a resumed run takes the steps the uninterrupted one would have taken.

How to run::

    scopebench train --config configs/policy/tiny.yml --output_dir outputs/train/tiny \\
        --steps 40 --log_freq 5 --save_freq 20
    scopebench train --config configs/policy/tiny.yml \\
        --accelerate-config configs/accelerate/deepspeed_zero2.yaml --output_dir outputs/train/z2 --steps 40
    scopebench train --config outputs/train/tiny/checkpoints/000020/train_config.yaml --resume true --steps 100
    scopebench convert-checkpoint outputs/train/z3/checkpoints/last      # ZeRO shards -> model.safetensors

With one process the run happens in this process. With several (``--nproc-per-node``, or
the accelerate file's ``num_processes``) and no launcher around it, this command starts N
copies of itself, ranks 0 to N-1 of a group whose rendezvous is a file store in a private
0700 folder (:class:`scopebench.distributed.spawn.LocalSpawn`, launcher mode): nothing
listens on the network, the ranks' gloo / NCCL sockets are bound to the loopback interface,
and this process waits for them. ``torchrun``, ``accelerate launch`` or SLURM may start the
ranks instead (docs/distributed.md says how to do it without exposing their TCP store).
``--backend`` names the training backend, ``--accelerate-config`` the accelerate file that selects
one (``configs/accelerate/``, one file per backend; default: the file of the config's
``backend``); a ``--backend`` the file does not select is refused in one line naming both, before
any work (exit 2). The backend and its file are resolved once here and handed to the run. Where
the file and the training config both set precision, gradient accumulation or clipping, the
training config wins and the values in force are printed. Any config key is overridable
(``--batch_size=8``, ``--training.save_freq=10``). A new run refuses an ``--output_dir``
that already holds checkpoints (``checkpoints/last`` or any finished one); ``--resume true``
continues from the checkpoint whose ``train_config.yaml`` is given, else from
``<output_dir>/checkpoints/last``. Resuming needs the same backend and number of ranks (both
are in the saved config). One run at a time owns its ``--output_dir`` and the folder its
``checkpoints/`` resolves to (a link to a scratch disk): a second one into either
exits 2 naming the first (pid, host, start; its output folder), before any work
(:mod:`scopebench.train.run_folder`: the process the user started holds the lock, also while
its ranks run). So is ``--json``: a second run writing the same file exits 2 naming the
first (it holds the file for its ranks too). An unwritable ``--output_dir`` and an
``--nproc-per-node`` below 1 or above the CPU cores (on the CPU) are refused at set-up too.

A loss or loss term that is NaN or infinite stops the run on every rank: no checkpoint is
written of that step or a later one (each save first checks the losses not yet checked, so
also with ``gather_every > 1``), ``checkpoints/last`` stays on the last checkpoint whose
losses were all finite, and rank 0 prints one line on stderr naming the step, the term and
the checkpoint kept, e.g. ``scopebench train: step 3: loss term 'mse_loss' is nan (train_loss
nan): stopped; the last checkpoint, step 2, is kept as out/checkpoints/last``; exit status 1.
With ``gather_every > 1`` the losses are checked when gathered: the line names the step whose
loss was not finite and the later step where it was found.

Output: the log on rank 0's stdout, ending with how busy the machine was over the steps
trained: ``CONTENDED: ...`` or ``host load: ...``, as ``scopebench summary`` prints it (none with
the sampler off), and what the profiler cost them: ``profiler cost: ...``. JSON (``--json``), keys: ``tool`` ("train"),
``config``, ``start_step``, ``steps``, ``checkpoints`` (folders written), ``world_size``,
``accelerate_num_processes``, ``backend``, ``log`` (list of ``step``, ``train_loss``, ``samples_per_sec``,
``phases_mean_sec``), ``nonfinite_loss`` (null, or ``step``, ``term``, ``value``, ``train_loss``,
``rank``, ``world_size``, ``checked_at``, ``gather_every``, ``message``), ``host_other_cpu_pct``
and ``host_steal_pct`` (rank 0's record per trained step: the busiest rank's values), ``contention``
(as ``profile-step``'s, its steps numbered as the log's; null with the sampler off),
``profiler_cost`` (as ``profile-step``'s, over the steps trained).

A checkpoint that cannot be written for want of space says so in one line, naming the
folder and the checkpoint kept (its partial folder is removed, ``checkpoints/last`` is
untouched), exit status 1: ``scopebench train: checkpoint 000004 could not be written: no
space left on the device of out/checkpoints (0.0 KB left; RuntimeError: ... unexpected pos
...); its partial folder was removed and the last checkpoint, step 2, is kept as
out/checkpoints/last``.

Exit status: 0; 2 with one line for a refused input (before any work); 1 when the run
failed (a rank died, stopped or hung: named; the disk filled up: named) or stopped at a
non-finite loss.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
from pathlib import Path

from scopebench.commands._common import refuses
from scopebench.train.backends import backend_names

HELP = f"train the policy (pi05 or yours) with checkpoints and resume (backend {', '.join(backend_names())})"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from scopebench.commands._policy_options import add_backend_arguments, add_config_arguments

    add_config_arguments(parser)
    add_backend_arguments(parser)
    parser.add_argument("--output_dir", "--output-dir", dest="output_dir", default=None, help="training.output_dir")
    parser.add_argument("--steps", type=int, default=None, help="optimizer steps in all (training.steps)")
    parser.add_argument("--log_freq", "--log-freq", dest="log_freq", type=int, default=None, help="training.log_freq")
    parser.add_argument(
        "--save_freq", "--save-freq", dest="save_freq", type=int, default=None, help="training.save_freq"
    )
    parser.add_argument("--resume", choices=["true", "false"], default="false", help="continue from a checkpoint")
    parser.add_argument("--nproc-per-node", "--nproc_per_node", type=int, default=None, dest="nproc_per_node")


@refuses("train")  # its own refusals are below; this releases the --json it claims
def run(args: argparse.Namespace) -> int:
    from scopebench.atomic import claimed_outputs_env
    from scopebench.commands._policy_options import backend_flags
    from scopebench.distributed import RankFailure, check_local_nproc, get_dist_info, writes_reports
    from scopebench.distributed.device import resolve_device
    from scopebench.policy.run.trainer import check_output_dir, train_policy
    from scopebench.policy.tools import check_json_path, load_config, write_json
    from scopebench.profiler.config import check_writable_dir
    from scopebench.train.accelerate_file import resolve_accelerate_file
    from scopebench.train.checkpoint import CheckpointSpaceError
    from scopebench.train.run_folder import own_run_folder

    try:
        # the backend and its accelerate file, resolved once here and handed to the run
        backend, file = backend_flags(args)
        flags = {
            **backend,
            "nproc_per_node": _given(args.nproc_per_node, file.num_processes if file else None),
            "training.output_dir": args.output_dir,
            "training.steps": args.steps,
            "training.log_freq": args.log_freq,
            "training.save_freq": args.save_freq,
        }
        config = load_config(args, flags=flags)
        file = file or resolve_accelerate_file(config.train.backend, config.train.accelerate_config)
        check_json_path("--json", args.json)  # before any step: the JSON is written after the whole run
        resume = args.resume == "true"
        resume_from = _resume_point(args.config, config.training.output_dir, config) if resume else None
        # Before any step or process: an unwritable folder found at the first save costs the
        # whole run, and too many ranks start (a gigabyte each) before anything fails.
        output_dir = config.training.output_dir
        check_writable_dir("training.output_dir", output_dir)
        check_local_nproc("nproc_per_node", config.train.nproc_per_node, resolve_device(config.train.device).type)
        launcher = get_dist_info()
        relaunch = not launcher.is_distributed and config.train.nproc_per_node > 1
        if relaunch:  # the ranks this command would start: refused before they start (else the run checks)
            from scopebench.policy.run.checks import check_backend

            check_backend(config.train, config.train.nproc_per_node, file=file)
        with own_run_folder(output_dir, info=launcher) as handed:
            # under the lock: a run that ended just before it was taken left its checkpoints
            check_output_dir(output_dir, resume)
            if relaunch:
                return _relaunch(args, config, file, env={**handed, **claimed_outputs_env()})
            with _exit_on_sigterm():
                try:
                    result = train_policy(config, resume_from=resume_from, accelerate_file=file)
                except RankFailure as err:  # rank 0 names the rank that died, stopped or hung
                    print(f"scopebench train: the run failed:\n{err}", file=sys.stderr, flush=True)
                    return 1
                except CheckpointSpaceError as err:  # a full disk, said so (torch: "unexpected pos ...")
                    print(f"scopebench train: {err}", file=sys.stderr, flush=True)
                    return 1
    except (ValueError, FileNotFoundError) as err:
        print(f"scopebench train: {err}", file=sys.stderr)
        return 2
    from scopebench.report.contention import measured_steps
    from scopebench.report.cost import measured_cost

    samples = result.pop("host_samples")
    host = measured_steps(samples, first=result["start_step"] + 1)
    cost = measured_cost(samples)
    result.update(host)
    result.update(cost)
    if host["contention"] is not None and launcher.rank == 0:  # how busy the machine was over the steps trained
        print(host["contention"]["line"], flush=True)
    if cost["profiler_cost"] is not None and launcher.rank == 0:  # what the profiler cost those steps
        print(cost["profiler_cost"]["line"], flush=True)
    if args.json and writes_reports():
        write_json(args.json, {"tool": "train", "config": config.source, **result})
        print(f"wrote {args.json}")
    if result.get("nonfinite_loss") is not None and launcher.rank == 0:
        # rank 0 speaks for the run; the other ranks stopped as told and end with 0, so a launcher
        # names no rank as the culprit of what rank 0 has said
        print(f"scopebench train: {result['nonfinite_loss']['message']}", file=sys.stderr, flush=True)
        return 1
    return 0  # a launched or spawned rank then leaves through os._exit (scopebench.cli._leave_if_launched)


def _given(flag, fallback):
    """``flag`` when it was given (0 included: a value to refuse, not "not given"), else ``fallback``."""
    return fallback if flag is None else flag


@contextlib.contextmanager
def _exit_on_sigterm():
    """SIGTERM (a launcher stopping the ranks after one died, SLURM at its time limit)
    becomes ``SystemExit``, so the run is torn down and its failure report names the rank
    that died, instead of the process vanishing mid-step. Once rank 0 has begun that report
    (:func:`scopebench.distributed.launch.reporting_failure`), SIGTERM waits for it: the launcher
    sends it within 0.1 s of seeing a rank die, often before the report is printed, and
    only kills after 30 s."""
    from scopebench.distributed.launch import reporting_failure

    def stop(signum, frame):
        if not reporting_failure():
            raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _resume_point(config_path: str, output_dir: str, config=None):
    """The checkpoint to resume: the one holding ``config_path``, else the output folder's
    ``last`` (validated: a missing file, a dangling or looping link is named); with ``config``,
    also verified against it (:func:`scopebench.policy.run.trainer.check_resume`), before
    any rank or model is built."""
    import os

    from scopebench.distributed import get_dist_info
    from scopebench.policy.run.trainer import check_resume
    from scopebench.train.checkpoint import CHECKPOINTS, resolve_checkpoint
    from scopebench.train.run_folder import OWNER_ENV

    folder = Path(config_path).resolve().parent
    checkpoint = resolve_checkpoint(folder if folder.parent.name == CHECKPOINTS else output_dir)
    # the ranks this command relaunched (they carry its owner record) skip the check: their
    # parent verified this checkpoint, and hashing it again on every rank reads it N more times
    if config is not None and not os.environ.get(OWNER_ENV):
        launcher = get_dist_info()  # the ranks a launcher started, else the ones this command will start
        check_resume(
            config, checkpoint, launcher.world_size if launcher.is_distributed else config.train.nproc_per_node
        )
    return checkpoint


def _relaunch(args: argparse.Namespace, config, file, env: dict[str, str]) -> int:
    """Run this command on ``nproc_per_node`` local ranks, this process their launcher; their exit code.

    The ranks are spawned ranks (:class:`scopebench.distributed.spawn.LocalSpawn` in launcher
    mode): their rendezvous is a ``FileStore`` in a private 0700 temporary folder, their
    gloo / NCCL sockets are bound to the loopback interface, so nothing of the run listens on
    the network (``accelerate launch`` and torchrun listen on every interface, unauthenticated).
    The backend's knobs come from the accelerate file, which each rank reads itself
    (``--backend`` and ``--accelerate-config`` are passed on). The group timeout is ``group_timeout_sec``, else
    :data:`~scopebench.distributed.launch.LAUNCHER_TIMEOUT_SEC` (a checkpoint save of a large
    model may keep the other ranks waiting for minutes).

    ``env`` is added to their environment: it names this process as the output folder's
    owner, so their rank 0 does not refuse the lock held for it
    (:func:`scopebench.train.run_folder.own_run_folder`).

    The ranks do not outlive this process (:mod:`scopebench.distributed.orphans`): SIGTERM
    and SIGINT are forwarded to them; when this process dies (SIGKILL, the OOM killer)
    every rank ends within 5 s (its lifeline pipe reads end-of-file) and removes the folder. When one rank fails, the others get SIGTERM (rank 0
    still names the culprit), SIGKILL after 30 s, and this process names the ranks that
    failed with their exit code or signal. The private folder is removed at the end.

    Returns:
        0, else the first failed rank's exit code (128 + N when a signal N ended it), or
        128 + N after a forwarded signal N.
    """
    from scopebench.distributed.device import resolve_device
    from scopebench.distributed.launch import LAUNCHER_TIMEOUT_SEC, default_backend
    from scopebench.distributed.orphans import forwarding_signals
    from scopebench.distributed.spawn import LocalSpawn

    command = [
        sys.executable, "-m", "scopebench.cli", "train", "--config", args.config, "--resume", args.resume,
    ]  # fmt: skip
    for flag, value in (
        ("--backend", args.backend),
        ("--accelerate-config", args.accelerate_config),
        ("--output_dir", args.output_dir),
        ("--steps", args.steps),
        ("--log_freq", args.log_freq),
        ("--save_freq", args.save_freq),
        ("--json", args.json),
    ):
        if value is not None:
            command += [flag, str(value)]
    if args.policy is not None:
        command += ["--policy", args.policy]
    for arg in args.policy_arg or []:
        command += ["--policy-arg", arg]
    command += list(args.overrides or [])
    nproc = config.train.nproc_per_node
    timeout = config.train.group_timeout_sec or LAUNCHER_TIMEOUT_SEC
    backend = default_backend(resolve_device(config.train.device).type)
    ranks = LocalSpawn(
        nproc, None, {}, backend, timeout, command=command, env=env, prefix="scopebench-train-"
    )  # fmt: skip
    print(
        f"scopebench train: {nproc} local ranks started by this process ({file.path}; rendezvous: a file store "
        "in a private folder, sockets on loopback only)",
        flush=True,
    )
    try:
        with forwarding_signals(ranks):
            ranks.start()
            code, failures = ranks.supervise()
    finally:
        ranks.close()
    for line in failures:
        print(f"scopebench train: {line}", file=sys.stderr, flush=True)
    return code
