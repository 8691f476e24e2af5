"""Reading Kineto traces (``torch.profiler``'s Chrome JSON) one rank at a time, in bounded memory:
the events the device-side ledger needs (:mod:`scopebench.profiler.gpu_ledger`), nothing else.

A file is parsed as a stream (:func:`read_trace`): the top-level object's keys one by one, and
the ``traceEvents`` array one event at a time (the standard library's ``JSONDecoder.raw_decode``
over 1 MiB chunks of the file, gzipped or not), so the parsed JSON never exists whole. Each event
is classified as it is read (:class:`Collector`) and kept, compacted, only when the ledger needs it:

- **GPU work**: events of categories ``kernel``, ``gpu_memcpy``, ``gpu_memset`` (any case) with a
  ``stream`` and a ``correlation`` in their args (the events HTA counts as GPU kernels). Each is
  communication (:func:`is_comm_kernel`: NCCL's names of every era, ``ncclKernel_*`` up to 2.18 and
  ``ncclDevKernel_*`` from 2.19, and RCCL's, which keeps NCCL's), memory (a memcpy or memset
  category, or a ``Memcpy`` / ``Memset`` / ``dma`` name) or compute (the rest). A communication
  kernel carries its collective (:class:`Collective`): the op (``Collective name`` in its args,
  else read off the kernel's name), process group (``Process Group Name``, else
  ``Process Group Ranks``), sequence number (``Seq``, where torch records it), bytes
  (``max(In msg nelems, Out msg nelems)`` times the ``dtype``'s size: NCCL-tests' size, an
  all-gather's gathered output, a reduce-scatter's full input) and group size;
- **launches**: each ``cuda_runtime`` / ``cuda_driver`` event's start by its ``correlation``
  (``cudaLaunchKernel``, ``cudaMemcpyAsync``, HIP's): when the host launched the work;
- **steps**: the host's ``ProfilerStep#N`` ranges (not their ``gpu_user_annotation`` copies);
- **annotations**: the other host ``user_annotation`` ranges (``record_function``: regions);
- **the host side**: the CPU operators' count and the host events' first and last times.

The rank comes from ``distributedInfo`` (torch writes it), else from the file's name
(``rank3``, ``rank-3``, ``rank_3``), else the caller decides (:func:`rank_of`). Times stay in the
file's microseconds. A file that is not a trace, or that ends early, raises :class:`TraceError`
naming the file.
"""

from __future__ import annotations

import gzip
import json
import re
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

__all__ = [
    "COMM",
    "COMPUTE",
    "MEMORY",
    "Collective",
    "Collector",
    "GpuOp",
    "RankEvents",
    "TraceError",
    "dtype_size",
    "from_profiler",
    "is_comm_kernel",
    "rank_of",
    "read_trace",
]

#: Kinds of GPU work.
COMPUTE, COMM, MEMORY = 0, 1, 2
#: Read size of the streamed file; and the longest single value (an event) waited for before
#: the file is called malformed rather than read further.
CHUNK = 1 << 20
MAX_VALUE = 64 << 20

#: NCCL kernels of every naming era (``ncclKernel_AllReduce_RING_LL_Sum_float``,
#: ``ncclDevKernel_Generic``, ``ncclDevKernel_AllGather_RING_LL``), RCCL's (the same names), and a
#: kernel whose name holds ``ncclKernel`` (HTA's rule, for wrapped names).
_COMM_PREFIXES = ("nccl", "rccl", "NCCL", "RCCL", "Nccl", "Rccl")
_COMM_WORDS = ("ncclKernel", "ncclDevKernel")
_MEMORY_NAME = re.compile(r"^(hip)?(Memcpy|Memset)|^dma")
_GPU_CATS = {"kernel": COMPUTE, "gpu_memcpy": MEMORY, "gpu_memset": MEMORY, "memcpy": MEMORY, "memset": MEMORY}
_LAUNCH_CATS = frozenset(("cuda_runtime", "cuda_driver"))
_HOST_CATS = frozenset(("cpu_op", "user_annotation", "python_function", "cuda_runtime", "cuda_driver"))
_STEP = re.compile(r"^ProfilerStep\s*#\s*(\d+)")
_RANK_IN_NAME = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)
#: Host annotations that are not regions: the process group's own ranges.
_NOT_REGIONS = ("nccl:", "gloo:", "c10d::", "record_param_comms")
#: ``Collective name`` values (torch's) and kernel-name words (NCCL's) -> the ledger's op names.
_OPS = {
    "allreduce": "all_reduce",
    "all_reduce": "all_reduce",
    "allreduce_coalesced": "all_reduce",
    "allgather": "all_gather",
    "all_gather": "all_gather",
    "_allgather_base": "all_gather",
    "allgather_into_tensor_coalesced": "all_gather",
    "all_gather_into_tensor": "all_gather",
    "reducescatter": "reduce_scatter",
    "reduce_scatter": "reduce_scatter",
    "_reduce_scatter_base": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "reduce_scatter_tensor": "reduce_scatter",
    "broadcast": "broadcast",
    "reduce": "reduce",
    "alltoall": "all_to_all",
    "all_to_all": "all_to_all",
    "alltoall_base": "all_to_all",
    "all_to_allv": "all_to_all",
    "sendrecv": "send_recv",
    "send": "send",
    "recv": "recv",
    "barrier": "barrier",
}
#: Bytes per element of torch's dtype names as ``record_param_comms`` writes them (``Float``,
#: ``BFloat16``...) and of their Python spellings.
_DTYPE_BYTES = {
    "float": 4, "float32": 4, "double": 8, "float64": 8, "half": 2, "float16": 2, "bfloat16": 2,
    "int": 4, "int32": 4, "long": 8, "int64": 8, "short": 2, "int16": 2, "char": 1, "int8": 1,
    "byte": 1, "uint8": 1, "bool": 1, "complexfloat": 8, "complexdouble": 16, "complexhalf": 4,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1, "uint16": 2,
    "uint32": 4, "uint64": 8,
}  # fmt: skip


class TraceError(ValueError):
    """A file that is not a Kineto trace, or not a whole one; the message names the file."""


class Collective(NamedTuple):
    """What a communication kernel's args say of its collective (``None``: not recorded)."""

    op: str
    group: str
    seq: int | None
    nbytes: int | None
    group_size: int | None


class GpuOp(NamedTuple):
    """One piece of GPU work, times in the file's microseconds."""

    start: float
    end: float
    kind: int
    stream: int
    correlation: int
    collective: Collective | None


@dataclass
class RankEvents:
    """What the ledger keeps of one rank's trace (one file)."""

    path: str
    #: The top-level keys other than ``traceEvents`` (``distributedInfo``, ``baseTimeNanoseconds``...).
    meta: dict[str, Any] = field(default_factory=dict)
    gpu: list[GpuOp] = field(default_factory=list)
    #: Correlation id -> when the host's launch call began (µs).
    launches: dict[int, float] = field(default_factory=dict)
    #: ``ProfilerStep#N`` -> its host range ``(start, end)`` (the first one seen per ``N``).
    steps: dict[int, tuple[float, float]] = field(default_factory=dict)
    #: Other host ``user_annotation`` ranges: ``(name, start, end)``.
    annotations: list[tuple[str, float, float]] = field(default_factory=list)
    #: CPU operators seen, and the first and last host event times (µs).
    cpu_ops: int = 0
    host_first: float | None = None
    host_last: float | None = None
    #: The rank, once known (:func:`rank_of`).
    rank: int | None = None

    @property
    def distributed(self) -> dict[str, Any]:
        info = self.meta.get("distributedInfo")
        return info if isinstance(info, dict) else {}

    @property
    def base_us(self) -> float:
        """What, added to a ``ts``, gives µs since the Unix epoch: kineto writes ``ts`` after its
        ``baseTimeNanoseconds`` (0 without one: older traces wrote epoch time)."""
        base = self.meta.get("baseTimeNanoseconds")
        return base / 1e3 if isinstance(base, (int, float)) else 0.0

    def epoch_us(self, ts: float) -> float | None:
        """``ts`` as µs since the Unix epoch, where the trace says so: a ``ts`` under a day after its
        ``baseTimeNanoseconds`` (torch's recent traces), or a ``ts`` that is itself epoch time
        (after 2001: older ones); ``None`` otherwise (a torch 2.2 trace's ``ts`` on another
        clock, its base beside it: the A100 trace of tests/data/hta).

        :Examples:
            >>> RankEvents("t", {"baseTimeNanoseconds": 10**18}).epoch_us(5e6)
            1000000005000000.0
            >>> RankEvents("t", {"baseTimeNanoseconds": 10**18}).epoch_us(4.4e12) is None
            True
        """
        if 0 <= ts < 86_400e6 and self.meta.get("baseTimeNanoseconds"):
            return self.base_us + ts
        return ts if ts > 1e15 else None


def is_comm_kernel(name: str) -> bool:
    """Whether a GPU kernel is NCCL's or RCCL's, of any naming era.

    :Examples:
        >>> is_comm_kernel("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)")
        True
        >>> is_comm_kernel("ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)"), is_comm_kernel("void gemm()")
        (True, False)
    """
    return name.startswith(_COMM_PREFIXES) or any(word in name for word in _COMM_WORDS)


def dtype_size(dtype: Any) -> int | None:
    """Bytes per element of a dtype as traces name it (``None``: unknown).

    :Examples:
        >>> dtype_size("Float"), dtype_size("BFloat16"), dtype_size("c10::Float8_e4m3fn"), dtype_size("x")
        (4, 2, 1, None)
    """
    if not isinstance(dtype, str):
        return None
    return _DTYPE_BYTES.get(dtype.rsplit(".", 1)[-1].rsplit("::", 1)[-1].lower())


def _op_from_name(name: str) -> str:
    """The op a NCCL kernel's name says (``ncclKernel_AllReduce_...`` -> ``all_reduce``); ``nccl`` when
    it says none (``ncclDevKernel_Generic``: NCCL >= 2.19 runs most collectives in one kernel)."""
    head = re.sub(r"^(nccl|rccl)(Dev)?Kernel_?", "", name.split("(", 1)[0], flags=re.IGNORECASE)
    word = head.split("_", 1)[0].lower()
    return _OPS.get(word, "nccl")


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _collective(name: str, args: dict[str, Any]) -> Collective:
    raw = args.get("Collective name")
    op = _OPS.get(str(raw).lower(), str(raw).lower()) if raw else _op_from_name(name)
    group = args.get("Process Group Name", args.get("pg_name"))
    if group is None:
        group = args.get("Process Group Ranks")
    counts = [n for key in ("In msg nelems", "Out msg nelems") if (n := _int(args.get(key))) is not None]
    size = dtype_size(args.get("dtype"))
    nbytes = max(counts) * size if counts and size else None
    seq = args.get("Seq", args.get("seq"))
    return Collective(op, "?" if group is None else str(group), _int(seq), nbytes, _int(args.get("Group size")))


class Collector:
    """Classifies events one at a time into a :class:`RankEvents` (module docstring)."""

    def __init__(self, path: str) -> None:
        self.rank = RankEvents(path)

    def add(self, event: Any) -> None:
        if not isinstance(event, dict) or event.get("ph") != "X":
            return
        cat = event.get("cat")
        if not isinstance(cat, str):
            return
        try:
            ts = float(event["ts"])
            end = ts + float(event.get("dur", 0.0))
        except (KeyError, TypeError, ValueError):
            return
        rank = self.rank
        args = event.get("args")
        args = args if isinstance(args, dict) else {}
        name = event.get("name", "")
        name = name if isinstance(name, str) else str(name)
        kind = _GPU_CATS.get(cat.lower())
        if kind is not None:
            stream, corr = _int(args.get("stream")), _int(args.get("correlation"))
            if stream is None or stream < 0 or corr is None or corr < 0:
                return
            coll = None
            if is_comm_kernel(name):
                kind, coll = COMM, _collective(name, args)
            elif _MEMORY_NAME.match(name):
                kind = MEMORY
            rank.gpu.append(GpuOp(ts, end, kind, stream, corr, coll))
            return
        if cat not in _HOST_CATS:
            return
        if rank.host_first is None or ts < rank.host_first:
            rank.host_first = ts
        if rank.host_last is None or end > rank.host_last:
            rank.host_last = end
        if cat in _LAUNCH_CATS:
            corr = _int(args.get("correlation"))
            if corr is not None and corr >= 0 and corr not in rank.launches:
                rank.launches[corr] = ts
        elif cat == "cpu_op":
            rank.cpu_ops += 1
        if cat in ("user_annotation", "cpu_op") and name.startswith("ProfilerStep"):
            step = _STEP.match(name)
            if step is not None:
                rank.steps.setdefault(int(step.group(1)), (ts, end))
        elif cat == "user_annotation" and not name.startswith(_NOT_REGIONS):
            rank.annotations.append((name, ts, end))


# -- the streamed JSON -----------------------------------------------------------------------------
_WS = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder()


class _Stream:
    """A JSON text read in chunks; values decoded one at a time (module docstring)."""

    def __init__(self, path: Path, chunks: Iterator[str]) -> None:
        self.path, self.chunks = path, chunks
        self.buf, self.pos, self.eof = "", 0, False

    def fail(self, what: str) -> TraceError:
        return TraceError(f"{self.path}: {what}")

    def more(self) -> bool:
        if self.eof:
            return False
        chunk = next(self.chunks, None)
        if chunk is None:
            self.eof = True
            return False
        self.buf, self.pos = self.buf[self.pos :] + chunk, 0
        return True

    def peek(self) -> str | None:
        while True:
            self.pos = _WS.match(self.buf, self.pos).end()
            if self.pos < len(self.buf):
                return self.buf[self.pos]
            if not self.more():
                return None

    def expect(self, chars: str, where: str) -> str:
        char = self.peek()
        if char is None:
            raise self.fail(f"ends before the JSON does ({where}): a truncated file")
        if char not in chars:
            raise self.fail(f"not a Kineto trace: expected {' or '.join(map(repr, chars))} {where}, got {char!r}")
        self.pos += 1
        return char

    def value(self, where: str) -> Any:
        if self.peek() is None:
            raise self.fail(f"ends before the JSON does ({where}): a truncated file")
        while True:
            try:
                value, end = _DECODER.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError as err:
                if len(self.buf) - self.pos > MAX_VALUE or not self.more():
                    if self.eof:
                        raise self.fail(f"ends before the JSON does ({where}): a truncated file") from None
                    raise self.fail(f"not JSON ({err.msg} {where})") from None
                continue
            # A number that ends where the chunk ends may go on in the next one.
            if end == len(self.buf) and self.more():
                continue
            self.pos = end
            return value


def _chunks(path: Path, size: int = CHUNK) -> Iterator[str]:
    with open(path, "rb") as raw:
        gzipped = raw.read(2) == b"\x1f\x8b"
    opener = gzip.open if gzipped else open
    try:
        with opener(path, "rt", encoding="utf-8") as fh:
            while chunk := fh.read(size):
                yield chunk
    except EOFError as err:
        raise TraceError(f"{path}: truncated: the gzip stream ends early ({err})") from None
    except (gzip.BadGzipFile, zlib.error) as err:
        raise TraceError(f"{path}: not a readable gzip file ({err})") from None
    except UnicodeDecodeError as err:
        raise TraceError(f"{path}: not a Kineto trace: not UTF-8 text ({err.reason} at byte {err.start})") from None


def read_trace(path: str | Path, collector: Collector | None = None, chunk: int = CHUNK) -> RankEvents:
    """One trace file, streamed (module docstring): its :class:`RankEvents`, rank not yet set.
    ``chunk``: characters read at a time.

    Raises:
        TraceError: not JSON, not an object with a ``traceEvents`` array, or truncated (a
            ``.json.gz`` whose gzip stream ends early, a JSON text that stops mid-way).
        OSError: the file cannot be read.
    """
    path = Path(path)
    collector = collector or Collector(str(path))
    stream = _Stream(path, _chunks(path, chunk))
    meta = collector.rank.meta
    seen = False
    stream.expect("{", "at the start")
    if stream.peek() == "}":
        stream.pos += 1
    else:
        while True:
            key = stream.value("a key")
            if not isinstance(key, str):
                raise stream.fail("not JSON (a key that is not a string)")
            stream.expect(":", f"after {key!r}")
            if key == "traceEvents":
                seen = True
                _events(stream, collector)
            else:
                meta[key] = stream.value(f"in {key!r}")
            if stream.expect(",}", f"after {key!r}") == "}":
                break
    if stream.peek() is not None:
        raise stream.fail("not JSON (text after the top-level object)")
    if not seen:
        raise stream.fail("not a Kineto trace (no traceEvents array)")
    return collector.rank


def _events(stream: _Stream, collector: Collector) -> None:
    """The ``traceEvents`` array, each event to ``collector`` as it is decoded. The loop reads
    from the buffer directly while it holds whole events; :class:`_Stream`'s methods take over at
    a chunk's end (and for the errors)."""
    stream.expect("[", "for traceEvents")
    if stream.peek() == "]":
        stream.pos += 1
        return
    add, decode, blank = collector.add, _DECODER.raw_decode, _WS.match
    while True:
        buf, pos = stream.buf, stream.pos  # pos: an event's first character
        try:
            value, end = decode(buf, pos)
        except json.JSONDecodeError:
            end = len(buf)
        if end < len(buf):
            stream.pos = end
        else:
            value = stream.value("in traceEvents")
            buf = stream.buf
        add(value)
        pos = blank(buf, stream.pos).end()
        if pos < len(buf) and buf[pos] == ",":
            stream.pos = blank(buf, pos + 1).end()
            if stream.pos == len(buf) and stream.peek() is None:
                raise stream.fail("ends before the JSON does (in traceEvents): a truncated file")
            continue
        if stream.expect(",]", "between events") == "]":
            return
        stream.peek()


def rank_of(events: RankEvents) -> int | None:
    """The rank a trace claims: ``distributedInfo``'s ``rank``, else a ``rank<N>`` in its file
    name (``rank-3``, ``rank_3``), else ``None``.

    :Examples:
        >>> rank_of(RankEvents("x/sampled_rank-1.json.gz"))
        1
        >>> rank_of(RankEvents("t.json", meta={"distributedInfo": {"rank": 3}})), rank_of(RankEvents("t.json"))
        (3, None)
    """
    rank = _int(events.distributed.get("rank"))
    if rank is not None and rank >= 0:
        return rank
    found = _RANK_IN_NAME.findall(Path(events.path).name)
    return int(found[-1]) if found else None


def from_profiler(events: Iterable[Any], path: str = "<profiler>") -> RankEvents:
    """A stopped ``torch.profiler`` cycle's kineto events (``kineto_results.events()``) as the
    :class:`RankEvents` a trace file of them would give, through the same :class:`Collector`:
    GPU work by its activity type, stream (``device_resource_id``) and correlation id, its
    collective's args from the event's metadata; launches, steps and annotations from the host's.
    Times: ns -> µs, kineto's clock."""
    collector = Collector(path)
    for event in events:
        cat = event.activity_type()
        if cat not in _GPU_CATS and cat not in _LAUNCH_CATS and cat != "user_annotation":
            continue
        args: dict[str, Any] = {}
        if cat in _GPU_CATS:
            args = _metadata(event)
            args["stream"] = event.device_resource_id()
        args["correlation"] = event.correlation_id()
        start = event.start_ns() / 1e3
        collector.add(
            {
                "ph": "X",
                "cat": cat,
                "name": event.name(),
                "ts": start,
                "dur": event.end_ns() / 1e3 - start,
                "args": args,
            }
        )
    return collector.rank


def _metadata(event: Any) -> dict[str, Any]:
    """A kineto event's metadata (its trace args: ``Collective name``...) as a dict; ``{}`` when
    torch gives none or it is not a JSON object's inside."""
    try:
        text = event.metadata_json()
    except (AttributeError, RuntimeError):
        return {}
    if not text:
        return {}
    try:
        value = json.loads(text if text.lstrip().startswith("{") else "{" + text + "}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
