"""Video files of LeRobot datasets through PyAV: encoding many episodes into one mp4, decoding one episode's
frames by their timestamps.

Shape letters: T frames of an episode, H height, W width.

Encoding follows what ``lerobot-dataset`` 0.4.4 does (``encode_video_frames``): AV1 through ``libsvtav1`` with
``g=2``, ``crf=30``, ``preset=12``, pixel format ``yuv420p``, frame rate = the dataset's fps; ``libaom-av1`` when
SVT-AV1 is missing; else H.264 through ``libx264`` with the same ``g`` and ``crf`` and no B-frames (the codec is
recorded in ``meta/info.json`` under ``features[key]["info"]["video.codec"]``). LeRobot encodes each episode to its own
file and then joins the files by remuxing their packets; so does ``VideoFileWriter``, appending each episode
to the open file (episode frames at ``from_timestamp + t / fps``, every episode starting on a key frame).

SVT-AV1 3.0 (the one in PyAV 15's wheels) crashes on frames narrower than 32 pixels; SVT-AV1 4 (PyAV 18) does
not. Decoding uses whatever decoder FFmpeg picks (``libdav1d`` for AV1 in PyAV's wheels).

Knows no path of the dataset's layout: the reader and the writer pass it files, frame rates and shapes. In the
``lerobot`` sub-package's order (layout < video < reader, writer) it may import only ``layout``, and needs nothing
from it.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ctrl_rl.errors import UserInputError

if TYPE_CHECKING:
    from av.container import OutputContainer
    from av.video.stream import VideoStream

ENCODERS = ("libsvtav1", "libaom-av1", "libx264")
"""Encoders in order of preference when none is asked for."""
_NAMES = {"av1": "libsvtav1", "h264": "libx264"}  # LeRobot's vcodec names -> FFmpeg encoders


def import_av():
    try:
        import av
    except ImportError:
        raise UserInputError("reading or writing the videos of LeRobot datasets needs the av (PyAV) package: "
                             "expected `pip install pyarrow av`") from None
    return av


def pick_encoder(requested: str | None = None) -> str:
    """The FFmpeg encoder to use: ``requested`` (an encoder name, or LeRobot's "av1"/"h264"), else the first of
    ``ENCODERS`` this PyAV build has."""
    av = import_av()
    available = av.codecs_available
    if requested is not None:
        name = _NAMES.get(requested, requested)
        if name not in available:
            raise UserInputError(f"video codec {requested!r} is not in this PyAV build ({av.__version__}): expected "
                                 f"one of {', '.join(c for c in ENCODERS if c in available) or 'none found'}")
        return name
    for name in ENCODERS:
        if name in available:
            return name
    raise UserInputError(f"this PyAV build ({av.__version__}) has none of the encoders {', '.join(ENCODERS)}: "
                         f"expected PyAV's wheels from PyPI, which ship libsvtav1 and libx264")


@contextlib.contextmanager
def _quiet_svt():
    """SVT-AV1 prints its configuration to stderr when an encoder opens unless ``SVT_LOG`` says otherwise; the
    variable is set only while encoding and restored after."""
    old = os.environ.get("SVT_LOG")
    os.environ["SVT_LOG"] = old if old is not None else "1"  # 1: errors only
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("SVT_LOG", None)


class VideoFileWriter:
    """One mp4 file of a video key that episodes are appended to; ``add_episode`` returns where the episode is.

    Each episode is encoded on its own into a temporary mp4 beside the file (so it starts on a key frame and
    its encoded size is known at once), then its packets are appended to the file with their timestamps
    shifted to follow the previous episode: what LeRobot's ``concatenate_video_files`` does, without reading
    the whole file again for every episode.
    """

    def __init__(self, path: Path, fps: int, height: int, width: int, encoder: str, crf: int = 30, gop: int = 2,
                 preset: int = 12):
        self._av = import_av()
        self.path = path
        self.fps = fps
        self.height, self.width = height, width
        self.frames = 0  # frames written so far
        self.bytes = 0  # encoded bytes so far (the file's size, up to the container overhead)
        self._options = {"g": str(gop), "crf": str(crf)}
        if encoder == "libsvtav1":
            self._options["preset"] = str(preset)
        elif encoder == "libaom-av1":
            self._options.update({"cpu-used": "8", "row-mt": "1"})
        elif encoder == "libx264":
            self._options["bf"] = "0"  # no B-frames: decode order = display order, so appended episodes keep
            # increasing decode timestamps (an episode of one frame has no reorder delay, the next would)
        self._encoder = encoder
        # the file and its stream: opened with the first episode, whose stream is the template
        self._out: tuple[OutputContainer, VideoStream] | None = None
        path.parent.mkdir(parents=True, exist_ok=True)

    def add_episode(self, frames: np.ndarray) -> tuple[float, float]:
        """Append ``frames`` uint8 ``[T,H,W,3]``; returns the episode's ``(from_timestamp, to_timestamp)`` in
        seconds from the file's start."""
        assert frames.ndim == 4 and frames.shape[1:] == (self.height, self.width, 3) and frames.dtype == np.uint8
        av = self._av
        part = self.path.with_name(f"{self.path.stem}.episode.mp4")
        try:
            self._encode(part, frames)
            with av.open(str(part)) as source:
                stream = source.streams.video[0]
                time_base = stream.time_base
                assert time_base is not None  # the mp4 _encode has just written: its stream has a time base
                if self._out is None:
                    container = av.open(str(self.path), "w")
                    template = container.add_stream_from_template(stream, opaque=True)
                    template.time_base = time_base
                    self._out = (container, template)
                container, out_stream = self._out
                shift = round(self.frames / (self.fps * time_base))  # start of the episode, stream units
                for packet in source.demux(stream):
                    if packet.dts is None:  # the demuxer's end-of-stream packet
                        continue
                    assert packet.pts is not None  # an mp4 packet with a decode time has a presentation time
                    packet.pts += shift
                    packet.dts += shift
                    packet.stream = out_stream
                    self.bytes += packet.size
                    container.mux(packet)
        finally:
            part.unlink(missing_ok=True)
        start = self.frames
        self.frames += len(frames)
        return start / self.fps, self.frames / self.fps

    def _encode(self, path: Path, frames: np.ndarray) -> None:
        av = self._av
        with _quiet_svt(), av.open(str(path), "w") as out:
            stream = out.add_stream(self._encoder, rate=self.fps, options=self._options)
            if not isinstance(stream, av.VideoStream):
                raise UserInputError(f"encoder {self._encoder!r} is not a video encoder: expected one such as "
                                     f"{', '.join(ENCODERS)}")
            stream.width, stream.height, stream.pix_fmt = self.width, self.height, "yuv420p"
            for image in frames:  # [H,W,3]
                out.mux(stream.encode(av.VideoFrame.from_ndarray(np.ascontiguousarray(image), format="rgb24")))
            out.mux(stream.encode(None))

    def close(self) -> None:
        if self._out is not None:
            self._out[0].close()

    def abort(self) -> None:
        with contextlib.suppress(Exception):
            self.close()


def video_info(path: Path) -> dict[str, Any]:
    """The ``info`` entry LeRobot records for a video feature in ``meta/info.json``, read from the file."""
    av = import_av()
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        pix_fmt = stream.codec_context.pix_fmt or "yuv420p"
        rate = stream.average_rate or stream.base_rate
        assert rate is not None  # a file VideoFileWriter wrote: FFmpeg reads its frame rate back
        return {"video.height": stream.height, "video.width": stream.width,
                "video.codec": stream.codec_context.codec.canonical_name,  # "av1", "h264"
                "video.pix_fmt": pix_fmt, "video.is_depth_map": False,
                "video.fps": int(round(float(rate))), "video.channels": 3,
                "has_audio": len(container.streams.audio) > 0}


def decode_frames(path: Path, times: np.ndarray, fps: float, shape: tuple[int, int, int],
                  tolerance: float | None = None) -> np.ndarray:
    """The frames of ``path`` shown at ``times`` (seconds, ``[T]`` increasing) as uint8 ``[T,H,W,3]``.

    Seeks to the key frame at or before ``times[0]`` and decodes up to ``times[-1]``; every time must have a
    decoded frame within ``tolerance`` (default a fifth of a frame period) and the frames must have ``shape``
    ``(H, W, 3)``, else a one-sentence ``UserInputError`` names the file.
    """
    av = import_av()
    from av.error import FFmpegError  # after import_av, which says how to install PyAV when it is missing

    if not path.is_file():
        raise UserInputError(f"video file {path} does not exist: expected the mp4 file that meta/info.json's "
                             f"video_path names for this episode")
    tol = 0.2 / fps if tolerance is None else tolerance
    T = len(times)
    if T == 0:
        return np.zeros((0, *shape), np.uint8)
    first, last = float(times[0]), float(times[-1])
    got_t, got = [], []
    try:
        with av.open(str(path)) as container:
            stream = container.streams.video[0]
            stream.thread_type = "AUTO"
            time_base = stream.time_base
            if time_base is None:
                raise UserInputError(f"video file {path} has a video stream without a time base: expected an mp4 "
                                     f"file readable by FFmpeg")
            if first > tol:
                container.seek(max(int((first - tol) / time_base), 0), stream=stream, backward=True)
            for frame in container.decode(stream):
                if frame.pts is None:
                    continue
                assert frame.time_base is not None  # a decoded frame has its stream's time base
                t = float(frame.pts * frame.time_base)
                if t > last + tol:
                    break
                if t >= first - tol:
                    got_t.append(t)
                    got.append(frame.to_ndarray(format="rgb24"))  # [H,W,3]
    except FFmpegError as e:
        raise UserInputError(f"video file {path} cannot be decoded ({type(e).__name__}: {e}): expected an mp4 file "
                             f"readable by FFmpeg") from None
    if not got:
        raise UserInputError(f"video file {path} has no frame between {first:.4f} s and {last:.4f} s: expected the "
                             f"episode's {T} frames there (from/to timestamps in the episodes table)")
    got_t = np.asarray(got_t)  # [T'] decoded times
    nearest = np.abs(got_t[None, :] - np.asarray(times, np.float64)[:, None]).argmin(1)  # [T]
    miss = np.abs(got_t[nearest] - times) > tol
    if miss.any():
        i = int(np.flatnonzero(miss)[0])
        raise UserInputError(f"video file {path} has no frame within {tol:.4f} s of {float(times[i]):.4f} s "
                             f"(frame {i} of {T}; decoded {len(got_t)} frames from {got_t[0]:.4f} s to "
                             f"{got_t[-1]:.4f} s): expected one frame per row of the episode")
    out = np.stack([got[j] for j in nearest])  # [T,H,W,3]
    if out.shape[1:] != tuple(shape):
        raise UserInputError(f"video file {path} has frames of shape {list(out.shape[1:])}: expected "
                             f"{list(shape)} (feature shape in meta/info.json)")
    return out
