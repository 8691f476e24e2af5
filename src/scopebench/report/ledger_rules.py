"""Diagnosis rules over the per-rank ledger: ``late-rank``, ``communication-bound``,
``host-overhead``, ``hidden-communication`` (docs/diagnosis.md), part of
:data:`scopebench.report.diagnosis.RULES`.

They read what :mod:`scopebench.report.ledger` reads: where each region's time went on a
run of several ranks (work, waiting for a peer, the collectives' own transfer, communication
hidden behind work; in torch mode the work's operators and host overhead) and the rank the
others wait for. Waiting for a peer is not communication-bound: it is the late rank's
work, named by ``late-rank``. ``communication-bound`` also reads the torch backend's older
``<region>_comm_sec`` (which includes the waits) when a file has no ledger.

Advice depends on the benchmark (:func:`workload`): a policy training step, imaging PnP
(tiles and physics operators over ranks) or UnrolledPnP training; never one benchmark's
parameters on another's run. Shares are of the region's mean time; statistics come from
:mod:`scopebench.stats`.
"""

from __future__ import annotations

from scopebench import stats
from scopebench.report.backend_comparison import config_backend
from scopebench.report.findings import SYNC_REGION, Finding, step_share_pct
from scopebench.report.ledger import (
    LATE_RANK_CONSISTENT_PCT,
    LATE_RANK_MIN_PCT,
    LATE_RANK_MIN_SEC,
    LateRank,
    config_late_rank,
)
from scopebench.report.results import Configuration, is_on
from scopebench.report.tables import config_kind

__all__ = [
    "COMM_PCT",
    "HOST_OVERHEAD_PCT",
    "communication_bound",
    "hidden_communication",
    "host_overhead",
    "late_rank",
    "tracks_memory",
    "workload",
]

#: communication-bound: a region's ``<region>_comm_transfer_sec`` (the collectives' own cost,
#: without the waits for a peer) above this share of the region's time (%); in a file without
#: the ledger, its ``<region>_comm_sec`` (waits included).
COMM_PCT = 30.0
#: ... and that transfer at least this share of the step (%): a collective that is most of a
#: region but a few % of the step is not what bounds it. In the validation benchmark's 80 runs
#: without a fault the largest transfer of a region was 13 % of the step (FSDP2's bwd, under
#: 30 % of it) and ZeRO-3's parameter all-gather, most of its ``optim_step``, 2-9 % of the step
#: (at a floor of 5 %: 5 false findings in 20 runs); its ``comm_heavy`` runs (16 M parameters more
#: to reduce) are at 20-27 %, docs/validation.md. The loss gather of ``sync_gather``
#: (:data:`~scopebench.report.findings.SYNC_REGION`) is never judged here: host-sync-bound does
#: (waiting there for a late peer made it 7 % of a loaded machine's step, docs/validation.md).
COMM_STEP_MIN_PCT = 10.0
#: host-overhead: a training-step region's ``<region>_host_overhead_sec`` (torch mode: its
#: work minus its operators) above this share of the region's time (%): past a third, the
#: device waits on the host's Python and framework hooks rather than on its own kernels. The
#: finding names the part the framework's marked hooks took (``<region>_host_hooks_sec``).
HOST_OVERHEAD_PCT = 30.0
#: ... and that overhead at least this share of the step (%): the Python of a region of a few
#: hundred µs (``zero_grad_sched``, ``optim_step`` of a small model) is most of it and nothing
#: of the step (the validation benchmark's runs without a fault, docs/validation.md: ZeRO-3's
#: ``optim_step`` overhead was 4 % of the step). Not judged with ``profiler_memory`` on: its
#: tracker runs Python for every operator (30-70 % of a CPU step, docs/performance.md), host
#: overhead of the suite's own that no backend setting removes.
HOST_OVERHEAD_STEP_MIN_PCT = 5.0

_IMAGING_INFERENCE = ("PnP", "Denoiser")
_UNROLLED = "UnrolledPnP"


def workload(config: Configuration) -> str:
    """``pnp`` (imaging inference: ``PnP``, ``Denoiser``), ``unrolled`` (``UnrolledPnP``),
    ``policy`` (another training step: the policy's, :func:`~scopebench.report.tables.config_kind`)
    or ``other``: which benchmark's parameters an advice may name."""
    if config.solver_base in _IMAGING_INFERENCE:
        return "pnp"
    if config.solver_base == _UNROLLED:
        return "unrolled"
    if config_kind(config) == "training_step":
        return "policy"
    return "other"


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"


def _share_pct(config: Configuration, region: str, metric: str) -> float | None:
    """``100 * mean(<region>_<metric>) / mean(region time)``; ``None`` without either."""
    part, time = config.values(f"{region}_{metric}"), config.region_values(region)
    if not part or not time or stats.mean(time) <= 0:
        return None
    return stats.mean(part) / stats.mean(time) * 100.0


def _below_step_share(region_pct: float | None, part_pct: float, floor: float) -> bool:
    """Whether a part of a region (``part_pct`` % of it) is under ``floor`` % of the step, the
    region being ``region_pct`` % of the step (``None``: unknown, never below).

    :Examples:

    >>> _below_step_share(8.0, 50.0, 5.0), _below_step_share(20.0, 50.0, 5.0), _below_step_share(None, 50.0, 5.0)
    (True, False, False)
    """
    return region_pct is not None and region_pct * part_pct / 100.0 < floor


def tracks_memory(config: Configuration) -> bool:
    """Whether the configuration ran with ``profiler_memory`` on (its parameter, as benchopt
    stored it: a bool, or its text): its tracker runs Python for every operator, host overhead
    and per-region jitter of the suite's own (``host-overhead`` and ``rank-imbalance``'s regions
    are not judged then)."""
    return is_on(config.param("profiler_memory"))


def _backend(config: Configuration):
    """The training backend object of a policy configuration (:mod:`scopebench.train.backends`), else ``None``."""
    name = config_backend(config)
    if name is None:
        return None
    from scopebench.train.backends import find_backend

    return find_backend(name)


def _late_advice(config: Configuration, found: LateRank) -> str:
    rank, kind = found.rank, workload(config)
    if kind == "policy":
        advice = (
            f"look at rank {rank}: its data shard and dataloader workers (num_workers, slow samples in its shard; "
            "its dataload_wait in its per-rank file), the load on its host and its CPU affinity (scopebench info "
            "--host; taskset / numactl), and whether its device is slower (clocks, temperature, another job on it)"
        )
    elif kind == "pnp":
        advice = (
            f"rank {rank}'s share of the reconstruction is heavier or slower: its tiles (distribute_denoiser deals "
            "the tiles over the ranks: a count that does not divide evenly, or larger edge tiles, loads one rank "
            "more; patch_size) or its physics operators (distribute_physics: the operators each rank holds); "
            "then the load on its host and its device"
        )
    elif kind == "unrolled":
        advice = (
            f"look at rank {rank}: its share of the batch, the load on its host, its CPU affinity, and whether its "
            "device is slower"
        )
    else:
        advice = f"look at rank {rank}: its share of the work, the load on its host, its CPU affinity, its device"
    excess = found.work_excess_sec
    if excess is not None and excess < found.delay_sec / 2:
        advice += (
            f"; its own work in {found.region or 'the region'} does not explain the delay, so it enters late: "
            "look at what it does before"
        )
    elif found.cause == "compute":
        advice += "; the excess is its operators (compute): a slower or throttled device, or more data on it"
    elif found.cause == "host_overhead":
        advice += "; the excess is its host side (Python, framework hooks): host load, CPU affinity"
    return advice


def late_rank(config: Configuration, others: list[Configuration]) -> list[Finding]:
    """The rank the others consistently wait for (:func:`~scopebench.report.ledger.late_rank_summary`)."""
    found = config_late_rank(config)
    if found is None:
        return []
    return [
        Finding(
            "late-rank",
            config.label,
            f"{found.line.removeprefix('late rank: ')}: in {found.iterations} of {found.counted} iterations with a "
            f"late rank ({found.share_pct:.0f}%, >= {LATE_RANK_CONSISTENT_PCT:g}%), {found.delay_pct:.1f}% of the "
            f"median step (>= {LATE_RANK_MIN_PCT:g}% and >= {LATE_RANK_MIN_SEC * 1e3:g} ms)",
            _late_advice(config, found),
        )
    ]


def _comm_advice(config: Configuration) -> str:
    kind = workload(config)
    if kind == "pnp":
        return (
            "fewer, larger messages: distribute less (distribute_physics / distribute_denoiser), bigger tiles "
            "(patch_size), or fewer ranks for this problem size"
        )
    if kind == "policy":
        return (
            "the collectives themselves cost this region: fewer ranks for this model size, a bigger batch per rank "
            "or gradient_accumulation_steps (fewer reductions per sample), larger buckets (DDP's bucket_cap_mb, "
            "DeepSpeed's reduce_bucket_size), or a backend that shards less (zero3 / fsdp2 move more bytes per "
            "step than zero2 / ddp)"
        )
    if kind == "unrolled":
        return (
            "a bigger batch per rank (batch_size) or fewer ranks (nproc_per_node): every step all-reduces the same "
            "gradients, whatever the batch"
        )
    return "fewer, larger messages, or fewer ranks for this problem size"


def communication_bound(config: Configuration, others: list[Configuration]) -> list[Finding]:
    """A region whose collectives' own cost (transfer, not waiting for a peer) is above
    :data:`COMM_PCT` of it and at least :data:`COMM_STEP_MIN_PCT` of the step."""
    out = []
    for region in config.regions:
        if region == SYNC_REGION:
            continue  # the loss gather: host-sync-bound's (waiting for a late peer can make it 5 %)
        share = step_share_pct(config, region)
        transfer = _share_pct(config, region, "comm_transfer_sec")
        if transfer is not None:
            if transfer <= COMM_PCT or _below_step_share(share, transfer, COMM_STEP_MIN_PCT):
                continue
            wait = _share_pct(config, region, "comm_wait_peer_sec")
            message = f"transfer (the collectives' own cost) is {transfer:.1f}% of {region} (> {COMM_PCT:g}%)" + (
                f"; waiting for peers, {wait:.1f}% more, is not counted (late-rank)" if wait else ""
            )
        else:
            comm = _share_pct(config, region, "comm_sec")
            if comm is None or comm <= COMM_PCT or _below_step_share(share, comm, COMM_STEP_MIN_PCT):
                continue
            message = (
                f"communication is {comm:.1f}% of {region} (> {COMM_PCT:g}%); this share includes waiting for "
                f"peers (a slow rank reads as communication here; the ledger's {region}_comm_transfer_sec leaves "
                "the waits out)"
            )
        out.append(Finding("communication-bound", config.label, message, _comm_advice(config)))
    return out


def host_overhead(config: Configuration, others: list[Configuration]) -> list[Finding]:
    """A training-step region whose host overhead is above :data:`HOST_OVERHEAD_PCT` of it and at
    least :data:`HOST_OVERHEAD_STEP_MIN_PCT` of the step; not judged under ``profiler_memory``
    (its tracker's Python per operator is host overhead of the suite's own)."""
    if workload(config) not in ("policy", "unrolled") or tracks_memory(config):
        return []
    backend = _backend(config)
    if backend is not None and (config.ranks() > 1 or backend.fully_shards):  # one-rank DDP: no wrapper
        advice = f"under {backend.title} every step runs {backend.host_hooks}: try {backend.host_hooks_advice}"
    else:
        advice = (
            "the host side (Python, autograd and distributed hooks) keeps up less than the operators: more work per "
            "call (a bigger batch per rank), fewer small parameters, torch.compile"
        )
    out = []
    for region in config.regions:
        share = step_share_pct(config, region)
        pct = _share_pct(config, region, "host_overhead_sec")
        if (
            pct is not None
            and pct > HOST_OVERHEAD_PCT
            and not _below_step_share(share, pct, HOST_OVERHEAD_STEP_MIN_PCT)
        ):
            message = (
                f"host overhead (its work minus its operators: Python, framework hooks) is {pct:.1f}% of {region} "
                f"(> {HOST_OVERHEAD_PCT:g}%)"
            )
            hooks = _share_pct(config, region, "host_hooks_sec")
            if hooks is not None:  # the part the framework's own marks time
                who = f"{backend.title}'s hooks" if backend is not None else "the framework's marked hooks"
                message += f"; {who} (the ranges it marks) are {hooks:.1f}% of {region}"
            out.append(Finding("host-overhead", config.label, message, advice))
    return out


def hidden_communication(config: Configuration, others: list[Configuration]) -> list[Finding]:
    """Informational: the communication the run overlapped with work, against what stayed exposed."""

    def means(metric: str) -> dict[str, float]:
        return {r: stats.mean(v) for r in config.regions if (v := config.values(f"{r}_{metric}"))}

    hidden = means("comm_hidden_sec")
    total = sum(hidden.values())
    if total <= 0:
        return []
    wait, transfer = sum(means("comm_wait_peer_sec").values()), sum(means("comm_transfer_sec").values())
    backend = _backend(config)
    who = backend.title if backend is not None else "the run"
    where = ", ".join(f"{r} {_ms(v)}" for r, v in hidden.items() if v > 0)
    exposed = wait + transfer
    return [
        Finding(
            "hidden-communication",
            config.label,
            f"{who} hid {_ms(total)} of communication per step behind work ({where}); {_ms(exposed)} stayed "
            f"exposed (waiting for peers {_ms(wait)}, transfer {_ms(transfer)}): "
            f"{total / (total + exposed) * 100:.0f}% hidden",
            "informational: hidden communication costs no step time while the work it overlaps lasts longer; the "
            "exposed part is what communication costs (communication-bound, late-rank), and hidden communication "
            "becomes exposed when the work gets faster (a faster device, less work per rank)",
        )
    ]
