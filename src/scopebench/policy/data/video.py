"""MP4 camera videos: encoding the synthetic dataset's, probing and decoding a LeRobot dataset's.

Everything goes through PyAV (``av`` on PyPI), which bundles its own FFmpeg, so nothing
outside the Python environment is needed. torchcodec, LeRobot's preferred decoder, loads
the system's FFmpeg shared libraries (``libavutil.so.56`` to ``.60``); where they are absent
(this project's machines) it cannot run, so the reader decodes with PyAV and says so
(:data:`DECODER`).

Two codecs are written (:data:`CODECS`), both ``yuv420p`` with a keyframe every second
frame (``g=2``, LeRobot's default: a random frame costs a seek and at most two decoded
frames):

* ``h264`` (libx264, CRF 18), the default: every FFmpeg build, torchcodec and browser
  decodes it, and its frames come back at >= 40 dB PSNR at 224 x 224;
* ``av1`` (libsvtav1 preset 8, CRF 16; LeRobot's own encoder, at CRF 30 there): what
  recent LeRobot datasets hold, decoded by libdav1d. Preset 8, not the fastest 12: at 12 the
  worst frame moves with the encoder's build (40.3 dB at CRF 20 with the SVT-AV1 4.1 of PyAV
  18.1.0; 35.2-38.9 dB at CRF 10-20 with the 4.3 of 18.1.1); at 8 it is 41.5-42.0 dB with both.

Decoding (:class:`VideoFrames`) follows LeRobot's PyAV path: seek to the keyframe at or
before the timestamp, decode forward, keep the frame whose timestamp is within
:data:`TOLERANCE_SEC` of the one asked for; a frame of an open GOP (x265's HEVC presents
B-frames before the keyframe they decode after) is found by seeking one, two, then four frame
intervals earlier; anything else is an error naming the file.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import numpy as np

#: The decoder the reader uses (torchcodec cannot load without a system FFmpeg: module docstring).
DECODER = "pyav"
#: A decoded frame must lie this close to the timestamp asked for (LeRobot's default ``tolerance_s``).
TOLERANCE_SEC = 1e-4
#: Codec setting -> (FFmpeg encoder, encoder options).
CODECS = {
    "h264": ("libx264", {"crf": "18", "g": "2"}),
    "av1": ("libsvtav1", {"crf": "16", "g": "2", "preset": "8"}),
}
#: Frame intervals a missed frame's seek goes back, one try each (open GOPs: :meth:`VideoFrames.frame_at`).
_SEEK_BACK = (0, 1, 2, 4)
#: Open videos kept per process (two cameras of a few files each; each holds a demuxer and decoder).
OPEN_FILES = 32


def encode_video(path: str | Path, frames, fps: int, codec: str) -> None:
    """Write ``frames`` ((H, W, 3) uint8 each, H and W even) as an MP4 of ``codec`` at ``fps``.

    Frame ``k`` is presented at ``k / fps`` seconds exactly (pts ``k`` in a ``1/fps`` time base).
    """
    import av

    encoder, options = CODECS[codec]
    if encoder == "libsvtav1":
        os.environ.setdefault("SVT_LOG", "1")  # SVT-AV1 prints its whole configuration otherwise
    with thread_scheduling_kept(), av.open(str(path), "w") as out:
        stream = None
        for k, frame in enumerate(frames):
            if stream is None:
                stream = out.add_stream(encoder, rate=fps, options=options)
                stream.height, stream.width = frame.shape[:2]
                stream.pix_fmt = "yuv420p"
                stream.codec_context.time_base = Fraction(1, fps)
            picture = av.VideoFrame.from_ndarray(np.ascontiguousarray(frame), format="rgb24")
            picture.pts, picture.time_base = k, Fraction(1, fps)
            out.mux(stream.encode(picture))
        if stream is not None:
            out.mux(stream.encode())


@contextmanager
def thread_scheduling_kept():
    """Restore the calling thread's scheduling policy and priority when the block ends.

    SVT-AV1 (``libsvtav1``), run as root, switches the thread that drives the encoder to
    ``SCHED_FIFO`` priority 99 and leaves it there. A benchmark process (or a test session)
    that encoded the synthetic dataset's AV1 videos would then run real-time: every process it
    starts inherits that, and a busy loop beside it is never preempted. Every encoder call
    goes through this block.
    """
    if not hasattr(os, "sched_getscheduler"):  # not Linux: nothing to keep
        yield
        return
    policy, param = os.sched_getscheduler(0), os.sched_getparam(0)
    try:
        yield
    finally:
        if (os.sched_getscheduler(0), os.sched_getparam(0)) != (policy, param):
            os.sched_setscheduler(0, policy, param)


@dataclass(frozen=True)
class VideoInfo:
    """What the container of one MP4 says, read without decoding."""

    path: str
    codec: str
    frames: int
    duration_sec: float
    height: int
    width: int


def probe_video(path: str | Path) -> VideoInfo:
    """The codec, frame count and duration of the first video stream of ``path``.

    Raises:
        FileNotFoundError: the file is missing (named).
        ValueError: the file is no readable video, has no video stream, or its codec is one
            this FFmpeg cannot decode (named, with the codec tag).
    """
    import av

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"video file not found: {path}")
    try:
        with av.open(str(path)) as container:
            if not container.streams.video:
                raise ValueError(f"{path} holds no video stream")
            stream = container.streams.video[0]
            context = stream.codec_context
            if context is None:
                tag = _codec_tag(path)
                raise ValueError(
                    f"{path}: unknown video codec{f' {tag!r}' if tag else ''}: PyAV {av.__version__}'s FFmpeg has "
                    "no decoder for it; LeRobot datasets hold av1, h264 or hevc (re-encode the video to one of them)"
                )
            seconds = stream.duration * stream.time_base if stream.duration else container.duration / av.time_base
            return VideoInfo(
                path=str(path),
                codec=context.name,
                frames=int(stream.frames),
                duration_sec=float(seconds or 0.0),
                height=context.height,
                width=context.width,
            )
    except av.error.FFmpegError as err:
        raise ValueError(f"{path} is not a readable video: {err}") from err


def _codec_tag(path: Path) -> str | None:
    """The four-character sample entry after ``stsd`` in an MP4 (what names an unknown codec)."""
    head = path.read_bytes()[: 1 << 20]
    at = head.find(b"stsd")
    if at < 0 or len(head) < at + 20:
        return None
    return head[at + 16 : at + 20].decode("latin-1")


class VideoFrames:
    """Frames of MP4 files at given timestamps, each file opened once per process.

    The open files are per process (a DataLoader worker forked after some were opened here
    opens its own) and at most :data:`OPEN_FILES`, least recently used closed first.
    """

    def __init__(self, max_open: int = OPEN_FILES) -> None:
        self.max_open = max_open
        self._open: OrderedDict[str, object] = OrderedDict()
        self._reformatter = None  # this process's YUV -> RGB converter (:meth:`_rgb`)
        self._pid = os.getpid()

    def __getstate__(self) -> dict:  # sent to spawned workers without open files
        return {"max_open": self.max_open}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["max_open"])

    def _container(self, path: str):
        import av

        if self._pid != os.getpid():  # a forked worker: the parent's handles are not ours
            self._open, self._reformatter, self._pid = OrderedDict(), None, os.getpid()
        container = self._open.pop(path, None)
        if container is None:
            try:
                container = av.open(path)
            except av.error.FFmpegError as err:
                raise ValueError(f"{path} is not a readable video: {err}") from err
            stream = container.streams.video[0]
            stream.thread_count = 1  # DataLoader workers are the parallelism; threads cost more on small frames
            while len(self._open) >= self.max_open:
                self._open.popitem(last=False)[1].close()
        self._open[path] = container
        return container

    def frame_at(self, path: str | Path, timestamp: float) -> np.ndarray:
        """The (H, W, 3) uint8 RGB frame of ``path`` presented at ``timestamp`` seconds.

        Raises:
            ValueError: no frame within :data:`TOLERANCE_SEC` of ``timestamp`` (a timestamp
                beyond the video, or timestamps out of sync with it), or a decoding error;
                the message names the file.
        """
        import av

        path = str(path)
        container = self._container(path)
        stream = container.streams.video[0]
        base = stream.time_base
        target = round(timestamp / base)
        rate = stream.average_rate or stream.guessed_rate
        interval = max(1, round(1 / (rate * base))) if rate else 1
        best, best_gap, last = None, None, None
        # An open GOP (x265's HEVC, B-frames) presents frames before the keyframe they are decoded
        # after: a seek to that keyframe skips them, as they reference the frame before it. When
        # the frame asked for is missed, the seek is repeated one, two, then four frame intervals
        # earlier, which lands on the keyframe before and decodes them (LeRobot's reader does the
        # same through FFmpeg's own seek).
        for back in _SEEK_BACK:
            seek = max(target - back * interval, 0)
            try:
                best, best_gap, last = _decode_near(container, stream, target, timestamp, seek)
            except av.error.FFmpegError as err:
                self._open.pop(path, None)
                container.close()
                raise ValueError(f"{path}: decoding the frame at {timestamp:.4f} s failed: {err}") from err
            if best is not None and best_gap <= TOLERANCE_SEC or seek == 0:
                break
        if best is None or best_gap > TOLERANCE_SEC:
            found = "no frame" if last is None else f"the nearest frame at {float(best.pts * base):.4f} s"
            raise ValueError(
                f"{path}: no frame at timestamp {timestamp:.4f} s (within {TOLERANCE_SEC} s): {found}, the last "
                f"decoded at {last} s; the video is shorter than its episodes' timestamps or out of sync with them"
            )
        return self._rgb(best)

    def _rgb(self, frame) -> np.ndarray:
        """``frame`` as (H, W, 3) uint8 RGB, converted by this process's own converter, one thread.

        Not ``frame.to_ndarray(format="rgb24")``: from PyAV 18.1.1 that converts every frame of a
        thread through one thread-local swscale context with automatic slice threads. A
        DataLoader worker forked after the parent converted a frame (a sample read before the
        loop) inherits that context but not its threads, and its first conversion waits for them
        forever. One thread: the DataLoader workers are the parallelism (as for the decoder).
        """
        if self._reformatter is None:
            from av.video.reformatter import VideoReformatter

            self._reformatter = VideoReformatter()
        return self._reformatter.reformat(frame, format="rgb24", threads=1).to_ndarray()

    def close(self) -> None:
        """Close every open file of this process."""
        if self._pid == os.getpid():
            for container in self._open.values():
                container.close()
        self._open.clear()
        self._reformatter = None


def _decode_near(container, stream, target: int, timestamp: float, seek: int):
    """Seek to the keyframe at or before pts ``seek`` and decode up to pts ``target``:
    ``(best frame, its distance to timestamp in s, the last decoded time)``."""
    base = stream.time_base
    best, best_gap, last = None, None, None
    container.seek(seek, stream=stream, backward=True, any_frame=False)
    for frame in container.decode(stream):
        if frame.pts is None:
            continue
        last = float(frame.pts * base)
        gap = abs(last - timestamp)
        if best_gap is None or gap < best_gap:
            best, best_gap = frame, gap
        if frame.pts >= target:
            break
    return best, best_gap, last
