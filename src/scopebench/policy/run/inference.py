"""One inference benchmark: model, observation, compilation, warm-up, profiler.

:class:`InferenceRun` is the one lifecycle of ``Pi05Inference``, used alike by the
benchopt solver, ``scopebench bench-inference``, ``scopebench decompose-latency`` and
``perf/policy_speed.py``, for pi05 and any :class:`~scopebench.policy.user.UserPolicy` with
``sample`` and ``observation``. One iteration is one call at batch 1, in four regions
(``preprocess`` on the host, ``prefill`` (a policy without one has no such region),
``denoise`` (the policy's ``sample``), ``postprocess``). With a ``compile_mode``,
``torch.compile`` wraps the policy's prefill and sample (never the host preprocessing); the ``n_warmup`` calls of ``start``, for each ``num_steps`` of the run's
``schedule`` (compilation happens per ``num_steps``), pay for compilation outside the
measured iterations, and the first call's excess over a steady call is reported as
``compile_time_sec``, with ``first_call_ratio`` = first call / median later warm-up call
(below 5, a warning says compilation may not have happened).

**Cold start** (:attr:`InferenceRun.cold_start`, :meth:`InferenceRun.cold_start_report`): from
the process's start (``/proc``, to 10 ms) to the build's start (imports, configuration, data),
the build (policy made, moved to the device, compile wrappers), the first call (the first
action: with compilation, its compile time is ``compile_time_sec`` within it), and their sum,
process start to first action; with a ``compile_mode``, the graphs ``torch.compile``
compiled and the graph breaks it took during the warm-up (``torch._dynamo``'s counters), so
a compile that silently fell back to eager is reported in the note, not hidden.

**Checked calls**: every callable of the policy names the policy and itself when it raises
(:func:`scopebench.policy.calls.attributed`), and each call's output is checked after its clock
(:class:`~scopebench.policy.run.chunks.ChunkCheck`: its shape, the actions of its chunk against
``n_action_steps``, NaN or inf).

The observation is the policy's ``observation(1)``. pi05 builds it from the dataset's first
frame (the objective scores against that frame's recorded actions):
:func:`scopebench.policy.pi05.policy.make_observation`.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from scopebench.distributed.device import resolve_device
from scopebench.harness.run import RankRun
from scopebench.policy.run.chunks import ChunkCheck
from scopebench.policy.run.steps import InferenceStep
from scopebench.policy.settings import InferenceSettings

__all__ = ["COMPILE_RATIO_WARNING", "FIT_MIN_Z", "FREE_PCT", "InferenceRun", "fit_latency", "fit_verdict"]

#: Chunks per call are free while their median latency stays within this share of one chunk's (%).
FREE_PCT = 20.0
#: Below this first-call / steady-call ratio, compilation probably did not happen.
COMPILE_RATIO_WARNING = 5.0
#: Page's trend z the calls must reach for ``L(N) = F + N * s`` to apply (:func:`fit_verdict`):
#: one-sided p < 1e-4, so latencies that do not grow give a false fit less than once in 10^4 runs.
FIT_MIN_Z = 3.719
_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def fit_latency(num_steps: Sequence[float], latency: Sequence[float]) -> dict[str, float]:
    """Least-squares fit of ``L(N) = F + N * s``.

    Returns:
        ``fixed_sec`` (F), ``per_step_sec`` (s) and ``r2`` (``1 - SS_res / SS_tot``).

    :Examples:

    >>> fit = fit_latency([1, 2, 4], [3.0, 5.0, 9.0])
    >>> round(fit["fixed_sec"], 6), round(fit["per_step_sec"], 6), round(fit["r2"], 6)
    (1.0, 2.0, 1.0)
    """
    n = len(num_steps)
    if n != len(latency) or n < 2 or len(set(num_steps)) < 2:
        raise ValueError(f"need latencies at two or more distinct num_steps, got {list(num_steps)}")
    mx, my = sum(num_steps) / n, sum(latency) / n
    sxx = sum((x - mx) ** 2 for x in num_steps)
    sxy = sum((x - mx) * (y - my) for x, y in zip(num_steps, latency))
    slope = sxy / sxx
    fixed = my - slope * mx
    ss_res = sum((y - fixed - slope * x) ** 2 for x, y in zip(num_steps, latency))
    ss_tot = sum((y - my) ** 2 for y in latency)
    return {"fixed_sec": fixed, "per_step_sec": slope, "r2": 1.0 - ss_res / ss_tot if ss_tot > 0 else 1.0}


def fit_verdict(calls: dict[int, Sequence[float]], per_step_sec: float) -> dict[str, Any]:
    """Whether the fit ``L(N) = F + N * s`` applies: whether the latency grows with ``N`` at all.

    A latency that does not grow with ``N`` (a policy whose ``sample`` ignores the steps, or
    one dominated by a fixed cost) fits a line too, with a slope of noise, often negative, an
    R² of 1 on two points, and a "share of the call" that means nothing (``-632 %``).

    The rule: the fitted per-step time ``s`` is above 0 **and** the calls grow with ``N``
    within the interleaved rounds, by Page's trend test: in each round (one call per ``N``) the
    calls are ranked, ``L = sum over rounds and N of (the N's place in ascending order) x (its
    call's rank)``, and ``z = (L - b k (k + 1)^2 / 4) / sqrt(b k^2 (k + 1) (k^2 - 1) / 144)`` for
    ``b`` rounds of ``k`` values of ``N`` (two values: the sign test of the rounds); the fit
    applies when ``z`` >= :data:`FIT_MIN_Z` (one-sided p below 1e-4). Why ranks within rounds:
    a latency that does not grow gives every order of a round's calls the same chance whatever
    the noise (slow calls, skewed or bursty timings, load that changes between rounds), so a
    false fit happens less than once in 10^4 runs for any noise, where a test on the medians'
    spread is fooled by skewed timings; and a per-step time of a fifth of a call's noise is
    found at the default 20 rounds of N = 1, 2, 5, 10. With too few rounds (fewer than 14 for
    two values of ``N``, 5 for four) even a perfect order cannot pass: the fit is not claimed.

    Args:
        calls: ``N -> every call's latency`` (seconds), in round order (call ``r`` of each ``N``
            ran in round ``r``), as many for every ``N``.
        per_step_sec: The fitted ``s`` (:func:`fit_latency` of the medians).

    Returns:
        ``fit_applies`` (bool), ``fit_reason`` (why not, else None), ``trend_z`` (Page's ``z``)
        and ``trend_p`` (its one-sided p-value, normal approximation).

    :Examples:

    >>> flat = {1: [1.0, 1.1, 0.9, 1.2] * 5, 8: [1.1, 1.0, 1.0, 1.1] * 5}  # 20 rounds, no growth
    >>> fit_verdict(flat, 0.002)["fit_applies"]
    False
    >>> grows = {1: [1.0, 1.1, 0.9, 1.2] * 5, 8: [8.0, 8.1, 7.9, 8.2] * 5}
    >>> verdict = fit_verdict(grows, 1.0)
    >>> verdict["fit_applies"], verdict["fit_reason"], round(verdict["trend_z"], 2)
    (True, None, 4.47)
    >>> fit_verdict(grows, -0.1)["fit_reason"]
    'the fitted per-step time s = -0.1 s is not above 0: the latency does not grow with num_steps'
    """
    import math

    steps = sorted(calls)
    rounds, k = len(calls[steps[0]]), len(steps)
    if any(len(calls[n]) != rounds for n in steps):
        raise ValueError(f"need as many calls at every num_steps, got {[len(calls[n]) for n in steps]}")
    page = 0.0
    for r in range(rounds):
        order = sorted(calls[n][r] for n in steps)
        for place, n in enumerate(steps, start=1):  # rank of this N's call in its round (ties: the mean)
            value = calls[n][r]
            below, equal = sum(v < value for v in order), order.count(value)
            page += place * (below + (equal + 1) / 2)
    mean = rounds * k * (k + 1) ** 2 / 4
    sd = math.sqrt(rounds * k**2 * (k + 1) * (k**2 - 1) / 144)
    z = (page - mean) / sd
    p = 0.5 * math.erfc(z / math.sqrt(2))
    if per_step_sec <= 0:
        reason = f"the fitted per-step time s = {_seconds(per_step_sec)} is not above 0: the latency does not grow with num_steps"
    elif z < FIT_MIN_Z:
        reason = (
            f"s = {_seconds(per_step_sec)}, but the calls do not grow with num_steps within the {rounds} rounds "
            f"(Page's trend test z = {z:.2f}, p = {p:.2g}; the fit needs z >= {FIT_MIN_Z:g}, p < 1e-4): "
            "the per-step time is within the noise"
        )
    else:
        reason = None
    return {"fit_applies": reason is None, "fit_reason": reason, "trend_z": z, "trend_p": p}


def _seconds(value: float) -> str:
    """``0.1 s`` or ``-0.064 ms``: a time in the unit that reads best."""
    return f"{value:.3g} s" if abs(value) >= 0.1 else f"{value * 1e3:.3g} ms"


def _compile_counters() -> tuple[int, int]:
    """Graphs ``torch.compile`` compiled and graph breaks it took so far in this process."""
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"], sum(counters["graph_break"].values())


def inference_memory_check(settings: InferenceSettings) -> None:
    """Refuse a preset whose weights exceed the free memory (``check_memory: false`` skips)."""
    from scopebench.policy import make_policy
    from scopebench.train.memory import check_memory_fits

    if not settings.check_memory:
        return
    with torch.device("meta"):
        params = make_policy(settings.preset).num_params()
    per_param = 2 if settings.precision == "bf16" else 4
    check_memory_fits(
        "preset",
        settings.preset,
        needed_bytes=params * per_param,
        what=f"{params / 1e9:.2f} B parameters x {per_param} bytes of {settings.precision} weights",
        device=resolve_device(settings.device),
        override_key="check_memory",
    )


class InferenceRun(RankRun):
    """Set-up, loop and teardown of one inference benchmark (a single process).

    Args:
        settings: Validated settings (``device`` is the :class:`~scopebench.harness.run.RankRun`'s).
        dataset_root: Folder of the robot dataset (pi05: its first frame is the observation).
        chunk_size: The dataset's chunk size, used when ``settings.chunk_size`` is None.
        tool: How errors name the caller (a policy without ``sample`` is refused naming it).
        episode_length: A stateful policy's calls per episode (:attr:`UserPolicy.reset` is called
            before each episode's first call, at the top of an iteration: callback time, not the
            call's); None: one episode (reset once before the warm-up and once before the first
            measured call). Refused for a stateless policy.
        schedule: The ``num_steps`` of the calls: iteration ``i`` uses
            ``schedule[i % len(schedule)]``, and every value is warmed up (``n_warmup``
            calls each) before the first measured call. Default: ``[settings.num_steps]``.
        chunks_per_call: The sizes :meth:`chunks_per_call` will time, so that a size whose inputs
            cannot fit in memory is refused at :meth:`build`, before the warm-up (None: not known).
        keys: How errors name a setting, by its name (``{"n_action_steps": "--n-action-steps"}``).
        **run: ``profiler``, ``output_dir``, ``name``, ``keep_rows`` of
            :class:`~scopebench.harness.run.RankRun`.
    """

    def __init__(
        self,
        settings: InferenceSettings,
        *,
        dataset_root: str | Path,
        chunk_size: int,
        schedule: Sequence[int] | None = None,
        tool: str = "Pi05Inference",
        episode_length: int | None = None,
        chunks_per_call: Sequence[int] | None = None,
        keys: Mapping[str, str] | None = None,
        **run: Any,
    ) -> None:
        from scopebench.validate import integer

        run.setdefault("name", "pi05_inference")
        super().__init__(nproc=1, device=settings.device, **run)
        self.settings = settings
        self.dataset_root = str(dataset_root)
        self.chunk_size = settings.chunk_size or chunk_size
        self.keys = dict(keys or {})
        # the chunk size is pi05's; a policy of your own is checked against its first chunk (ChunkCheck)
        if settings.policy == "pi05" and (settings.n_action_steps or 0) > self.chunk_size:
            raise ValueError(
                f"n_action_steps must be at most chunk_size={self.chunk_size}, got {settings.n_action_steps}"
            )
        if schedule is not None and (isinstance(schedule, (str, bytes)) or not list(schedule)):
            raise ValueError(f"schedule must be a non-empty list of num_steps, got {schedule!r}")
        self.schedule = [integer("schedule", n, low=1) for n in (schedule or [settings.num_steps])]
        if settings.policy == "pi05":
            inference_memory_check(settings)
        else:
            from scopebench.policy.user import resolve_factory

            resolve_factory(settings.policy)
        self.tool = tool
        self.episode_length = None if episode_length is None else integer("episode_length", episode_length, low=1)
        self.chunk_sizes = (
            None if chunks_per_call is None else [integer("chunks_per_call", b, low=1) for b in chunks_per_call]
        )
        #: Checks each call's output outside its clock (:mod:`~scopebench.policy.run.chunks`), after build.
        self.check: ChunkCheck | None = None
        self._unchecked: str | None = None  # the loop's last call, until its output is checked
        self._last_steps = self.schedule[0]
        #: Each measured call's place in its episode (0: the first call after a reset).
        self.positions: list[int] = []
        #: Seconds of each reset before a measured episode (stateful policies).
        self.reset_sec: list[float] = []
        self.policy = None
        self.model = None
        #: The call of each iteration (after start).
        self.work: InferenceStep | None = None
        #: Seconds of each warm-up call, by ``num_steps``.
        self.warmup_sec: dict[int, list[float]] = {}
        #: The last call's output (pi05: the action chunk).
        self.actions: Any = None
        self._untimed = None
        self._calls = 0
        #: Seconds from the process's start to the first action (:meth:`cold_start_report`), after build.
        self.cold_start: dict[str, Any] = {}
        #: Timed calls' latency (``step_time_sec``) gathered by :meth:`control_metrics`.
        self.control_latencies: list[float] = []
        self._control_seen = -1

    def build(self) -> None:
        """Policy, observation, compilation; then ``n_warmup`` calls for each ``num_steps``."""
        import functools

        from scopebench.host_load import process_age_sec
        from scopebench.policy.calls import attributed, prepare_batch, to_device
        from scopebench.policy.run.chunks import check_chunks_memory
        from scopebench.policy.run.train import run_policy

        s = self.settings
        before_build, begin = process_age_sec(), time.perf_counter()
        graphs_before = _compile_counters()
        self.warmup_sec, self._calls, self._untimed = {}, 0, None
        self.policy = policy = run_policy(
            s, dataset_root=self.dataset_root, chunk_size=self.chunk_size, task="inference"
        )
        policy.require("sample", "observation", tool=self.tool)
        self._check_state(policy)
        self.model = model = policy.model.to(self.device, _DTYPES[s.precision]).eval()

        def sample(state: Any, num_steps: int, *carried: Any) -> Any:  # closures, which torch.compile traces through
            return policy.sample(model, state, num_steps, *carried)

        def prefill(observation: Any) -> Any:
            return policy.prefill(model, observation)

        prefill = None if policy.prefill is None else prefill
        if s.compile_mode != "none":
            mode = None if s.compile_mode == "default" else s.compile_mode
            sample = torch.compile(sample, mode=mode)
            prefill = None if prefill is None else torch.compile(prefill, mode=mode)
        # every callable of the policy's own code names the policy and itself when it raises
        observation = attributed(policy, "observation", policy.observation)(1)
        if self.chunk_sizes is not None:  # before any call of that many chunks is built
            check_chunks_memory(self._key("chunks_per_call"), self.chunk_sizes, observation, self.device)
        self.check = ChunkCheck(f"policy {s.policy}: ", s.n_action_steps, self._key("n_action_steps"))
        self.work = InferenceStep(
            observation,
            prepare=attributed(policy, "preprocess", functools.partial(prepare_batch, policy, device=self.device)),
            sample=attributed(policy, "sample", sample, pair=policy.stateful),
            num_steps=s.num_steps,
            prefill=None if prefill is None else attributed(policy, "prefill", prefill),
            postprocess=attributed(
                policy, "postprocess", policy.postprocess or functools.partial(to_device, device=torch.device("cpu"))
            ),
            model=model,
            compiled=s.compile_mode != "none",
            reset=attributed(policy, "reset", lambda: policy.reset(model)) if policy.stateful else None,
        )
        self.work.reset()
        built = time.perf_counter() - begin
        for n in dict.fromkeys(self.schedule):
            self.warmup_sec[n] = [
                self.timed_call(n, call=f"warm-up call {i + 1} of {s.n_warmup}") for i in range(s.n_warmup)
            ]
        first = next(iter(self.warmup_sec.values()))[0] if s.n_warmup else None
        self.cold_start = {
            "process_to_build_sec": before_build,
            "build_sec": built,
            "first_action_sec": first,
            "process_to_first_action_sec": (
                None if before_build is None or first is None else before_build + built + first
            ),
        }
        if s.compile_mode != "none":
            graphs, breaks = (after - was for after, was in zip(_compile_counters(), graphs_before))
            self.cold_start.update(compiled_graphs=graphs, graph_breaks=breaks)
        self._check_compilation()
        self.positions, self.reset_sec = [], []
        if policy.stateful:  # the measured calls begin an episode
            self._reset()

    def _check_state(self, policy: Any) -> None:
        """Refuse what a stateful policy and these settings cannot do together, in one line."""
        s, who = self.settings, f"policy {self.settings.policy}"
        if self.episode_length is not None and not policy.stateful:
            raise ValueError(
                f"episode_length={self.episode_length} needs a stateful policy, and {who} has no "
                "UserPolicy.reset: its calls carry nothing from one to the next"
            )
        if policy.stateful and s.compile_mode != "none":
            raise ValueError(
                f"compile_mode={s.compile_mode!r} is refused for {who}: it is stateful (UserPolicy.reset), "
                "and a state that changes from call to call (its shapes, its Python objects) makes torch.compile "
                "recompile or fall back to eager mid-episode, which would be timed as the policy's latency; "
                "use compile_mode: none (--no-compile)"
            )

    def _reset(self) -> None:
        begin = time.perf_counter()
        self.work.reset()
        self.reset_sec.append(time.perf_counter() - begin)

    def _key(self, name: str) -> str:
        """How errors name the setting ``name`` (``keys``, else the name itself)."""
        return self.keys.get(name, name)

    def loop(self, callback: Any = None, before_callback: Any = None) -> None:
        """:meth:`RankRun.loop`; at the top of each iteration (callback time, not the call's) the
        last call's output is checked (:attr:`check`) and a stateful policy's episode is reset
        after its ``episode_length``-th call."""

        def before() -> None:
            if self._unchecked is not None:
                call, self._unchecked = self._unchecked, None
                self.check(self.actions, call=call, num_steps=self._last_steps)
            if self.episode_length is not None and self.work.position >= self.episode_length:
                self._reset()
            if before_callback is not None:
                before_callback()

        return super().loop(callback, before)

    def step(self, profiler: Any) -> None:
        """One call, with the schedule's next ``num_steps`` (its output is checked by :meth:`loop`)."""
        self._last_steps = n = self.schedule[self._calls % len(self.schedule)]
        self._calls += 1
        self.positions.append(self.work.position)
        self._unchecked = f"timed call {self._calls}"
        self.actions = self.work(profiler, n)

    def timed_call(self, num_steps: int | None = None, *, call: str | None = "call", chunks: int = 1) -> float:
        """Seconds of one unprofiled call (synchronised on CUDA), as the warm-up times it; then,
        off the clock, its output is checked (:attr:`check`) naming it ``call`` (None: not checked)."""
        from scopebench.profiler import create_profiler
        from scopebench.profiler.device import DeviceOps

        if self._untimed is None:
            self._untimed = (create_profiler(None), DeviceOps(self.device))
        null, ops = self._untimed
        ops.synchronize()
        start = time.perf_counter()
        self.actions = self.work(null, num_steps)
        ops.synchronize()
        seconds = time.perf_counter() - start
        if call is not None:
            self.check(self.actions, call=call, num_steps=num_steps or self.work.num_steps, chunks=chunks)
        return seconds

    def compile_metrics(self) -> dict[str, float]:
        """``compile_time_sec`` and ``first_call_ratio`` of the first warm-up series (compile only)."""
        from scopebench.stats import median

        if self.settings.compile_mode == "none" or not self.warmup_sec:
            return {}
        first = next(iter(self.warmup_sec.values()))
        steady = median(first[1:])
        return {"compile_time_sec": max(0.0, first[0] - steady), "first_call_ratio": first[0] / steady}

    def episode_report(self, latencies: Sequence[float]) -> dict[str, Any] | None:
        """A stateful policy's measured calls by their place in the episode (None: stateless).

        ``episode_length`` (None: one episode), ``episodes`` (begun in the measured calls),
        ``reset_sec`` (each reset before a measured episode), ``by_position`` (one entry per
        place, from 1: ``position``, ``calls``, ``median_sec``, ``mean_sec``) and
        ``last_over_first`` (the last place's median over the first's: a state that grows
        makes the later calls slower).
        """
        from scopebench.stats import median

        if self.policy is None or not self.policy.stateful:
            return None
        places: dict[int, list[float]] = {}
        for place, latency in zip(self.positions, latencies):
            places.setdefault(place, []).append(latency)
        by_position = [
            {"position": p + 1, "calls": len(v), "median_sec": median(v), "mean_sec": sum(v) / len(v)}
            for p, v in sorted(places.items())
        ]
        first, last = by_position[0]["median_sec"], by_position[-1]["median_sec"]
        episodes = self.positions.count(0)
        return {
            "episode_length": self.episode_length,
            "episodes": episodes,
            "reset_sec": list(self.reset_sec[:episodes]),  # not a reset after the last call
            "by_position": by_position,
            "last_over_first": last / first if first > 0 else None,
        }

    def chunks_per_call(self, sizes: Sequence[int], rounds: int) -> dict[str, Any]:
        """Latency and throughput against the chunks sampled per call (best-of-N: ``B``
        observations in one call), after :meth:`build`.

        Each size gets ``max(1, n_warmup)`` untimed calls first (a compiled policy compiles
        for the new shape there), then ``rounds`` interleaved rounds of one unprofiled call
        per size (:meth:`timed_call`), so a change of the machine's load touches every size
        alike. ``B`` is free while its median stays within :data:`FREE_PCT` % of the smallest
        size's. A size whose inputs exceed the memory available is refused before any call
        (:func:`~scopebench.policy.run.chunks.check_chunks_memory`), one that runs out of memory
        in its call is named; a call of ``B`` chunks must return ``B`` chunks (:attr:`check`).

        Returns:
            ``sizes``, ``rounds``, ``by_size`` (``size``, ``median_sec``, ``p95_sec``,
            ``chunks_per_sec`` = size / median, ``over_smallest`` = median / the smallest
            size's) and ``free_up_to`` (the largest size before the first that is not free)
            and ``knee`` (that first size, None when every size is free).
        """
        from scopebench.policy.calls import attributed
        from scopebench.policy.run.chunks import check_chunks_memory
        from scopebench.stats import median, percentile

        if self.policy.stateful:
            raise ValueError(
                f"chunks per call are refused for policy {self.settings.policy}: it is stateful "
                "(UserPolicy.reset), and its state is one episode's, not a batch's"
            )
        key = self._key("chunks_per_call")
        work, original = self.work, self.work.observation
        check_chunks_memory(key, sizes, original, self.device)
        observations = {b: attributed(self.policy, "observation", self.policy.observation)(b) for b in sizes}
        latency: dict[int, list[float]] = {b: [] for b in sizes}
        b = sizes[0]
        try:
            for b in sizes:
                work.observation = observations[b]
                for i in range(max(1, self.settings.n_warmup)):
                    self.timed_call(call=f"warm-up call {i + 1} of {b} chunks", chunks=b)
            for r in range(rounds):
                for b in sizes:
                    work.observation = observations[b]
                    latency[b].append(self.timed_call(call=f"call of {b} chunks in round {r + 1}", chunks=b))
        except (torch.OutOfMemoryError, MemoryError) as err:
            detail = str(err).strip().partition("\n")[0]
            detail = f" ({detail})" if detail else ""
            raise ValueError(f"{key} {b}: a call of {b} chunks ran out of memory on {self.device}{detail}") from err
        finally:
            work.observation = original
        base = median(latency[sizes[0]])
        by_size = []
        for b in sizes:
            med = median(latency[b])
            by_size.append(
                {
                    "size": b,
                    "median_sec": med,
                    "p95_sec": percentile(latency[b], 95),
                    "chunks_per_sec": b / med if med > 0 else None,
                    "over_smallest": med / base if base > 0 else None,
                }
            )
        knee = next((r["size"] for r in by_size if (r["over_smallest"] or 0) > 1 + FREE_PCT / 100), None)
        free = [r["size"] for r in by_size if knee is None or r["size"] < knee]
        return {
            "sizes": list(sizes),
            "rounds": rounds,
            "by_size": by_size,
            "free_up_to": free[-1],
            "knee": knee,
            "latency_sec": {str(b): v for b, v in latency.items()},
        }

    def compile_note(self) -> str | None:
        """Why compilation may not have happened (None: it did, or no ``compile_mode``): the
        first call under :data:`COMPILE_RATIO_WARNING` times a steady one, or no graph compiled."""
        ratio = self.compile_metrics().get("first_call_ratio")
        graphs = self.cold_start.get("compiled_graphs")
        reasons = []
        if ratio is not None and ratio < COMPILE_RATIO_WARNING:
            reasons.append(
                f"the first call took only {ratio:.1f}x a steady call (expected >= {COMPILE_RATIO_WARNING:.0f}x)"
            )
        if graphs == 0:
            reasons.append("torch.compile compiled no graph (the calls ran eagerly)")
        if not reasons:
            return None
        return (
            f"compile_mode={self.settings.compile_mode!r}: "
            + " and ".join(reasons)
            + ": compilation may not have happened"
        )

    def _check_compilation(self) -> None:
        note = self.compile_note()
        if note is not None:
            warnings.warn(note, stacklevel=3)

    def cold_start_report(self) -> dict[str, Any]:
        """:attr:`cold_start` with ``compile_time_sec`` (within the first action), the warm-up
        series (``warmup_sec``: the first ``num_steps``'s calls) and ``compile_note``."""
        return {
            **self.cold_start,
            "compile_time_sec": self.compile_metrics().get("compile_time_sec"),
            "warmup_sec": list(next(iter(self.warmup_sec.values()), [])),
            "compile_note": self.compile_note(),
        }

    def executed_actions(self, num_steps: int | None = None) -> int:
        """Actions executed per chunk: ``n_action_steps``, else the whole chunk: the actions of the
        chunks the policy returned at ``num_steps`` (None: the settings'), read as ``(batch, actions,
        action dims...)`` (:attr:`check`), else the run's ``chunk_size``."""
        s, seen = self.settings, self.check.actions if self.check is not None else {}
        return s.n_action_steps or seen.get(num_steps or s.num_steps) or self.chunk_size

    def control_rate(self, num_steps: int | None = None):
        """The run's :class:`~scopebench.policy.control.figures.ControlRate`: ``control_hz`` and
        :meth:`executed_actions` at ``num_steps``, built once per value; None without a ``control_hz``."""
        from scopebench.policy.control.figures import ControlRate

        keys, hz = (self._key("control_hz"), self._key("n_action_steps")), self.settings.control_hz
        return None if hz is None else ControlRate.cached(hz, self.executed_actions(num_steps), keys)

    def control(self, latencies: Sequence[float], num_steps: int | None = None):
        """The :class:`~scopebench.policy.control.figures.ControlFigures` of ``latencies`` (calls at
        ``num_steps``, None: the settings') at :meth:`control_rate`; None without a rate or a latency."""
        from scopebench.policy.control.figures import control_figures

        rate = self.control_rate(num_steps)
        return control_figures(latencies, rate) if rate is not None and latencies else None

    def control_metrics(self) -> dict[str, Any]:
        """The ``control_*`` metrics over the timed calls so far (the solver's rows): the last
        call's ``step_time_sec`` is gathered once per call, however often this is asked."""
        if self.settings.control_hz is None:
            return {}
        step = self.profiler.get_current_metrics().get("step_time_sec") if self.profiler is not None else None
        if step is not None and self._control_seen != self._calls:
            self._control_seen = self._calls
            self.control_latencies.append(step)
        figures = self.control(self.control_latencies)
        return figures.metrics() if figures is not None else {}

    def metrics(self) -> dict[str, Any]:
        """The metrics now: the last call's profiler metrics and ``setup_time_sec``
        (:meth:`RankRun.metrics`), plus the constant compile columns."""
        return {**super().metrics(), **self.compile_metrics()}
