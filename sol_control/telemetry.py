"""Telemetry: the snapshot a decision is made on, and the latest-value slot (depth 1) it waits in.

The host (the ROS node, the soak, replay) builds a `Telemetry` per camera frame and offers it to a
task's runner, whose slot never queues: a new value replaces the old one (counted as `superseded`),
so a slow decision makes the node skip frames instead of falling behind. Times: `stamp_ns` is the sensor's header stamp (ROS
clock); `start_mono_ns` is that same instant on time.monotonic_ns(), which budgets use.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Generic, TypeVar

import numpy as np

from sol_control.budget import MONOTONIC, NS_PER_MS, Clock

T = TypeVar("T")


@dataclass(frozen=True)
class Frame:
    image_rgb: np.ndarray | None  # [H, W, 3] uint8; None while still compressed
    stamp_ns: int  # header stamp (ROS time)
    start_mono_ns: int  # the header stamp on the monotonic clock (budget start)
    frame_id: str
    compressed: bytes | None = None  # jpeg/png bytes, decoded on the worker thread
    compressed_format: str = ""


@dataclass(frozen=True)
class Joints:
    names: tuple[str, ...]
    position_rad: np.ndarray  # [n]
    velocity: np.ndarray  # [n] or [0]
    stamp_ns: int


@dataclass(frozen=True)
class Wrench:
    force_n: np.ndarray  # [3]
    torque_nm: np.ndarray  # [3]
    stamp_ns: int


@dataclass(frozen=True)
class Conveyor:
    position_m: float
    velocity_mps: float
    stamp_ns: int


@dataclass(frozen=True)
class Telemetry:
    """What one decision sees: the frame plus the newest fresh side streams (None if absent/stale)."""

    frame: Frame
    joints: Joints | None = None
    wrench: Wrench | None = None
    conveyor: Conveyor | None = None

    @property
    def stamp_ns(self) -> int:
        return self.frame.stamp_ns


class LatestSlot(Generic[T]):
    """Depth-1 mailbox: `put` replaces, `take` empties, `peek` reads without emptying."""

    def __init__(self, clock: Clock = MONOTONIC) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._ready = threading.Condition(self._lock)
        self._value: T | None = None
        self._put_mono_ns = 0
        self.puts = 0
        self.superseded = 0

    def put(self, value: T, arrived_mono_ns: int = 0) -> None:
        """`arrived_mono_ns`: when the value arrived, if earlier than now (a polled sample)."""
        with self._lock:
            if self._value is not None:
                self.superseded += 1
            self._value = value
            self._put_mono_ns = arrived_mono_ns or self._clock.now_ns()
            self.puts += 1
            self._ready.notify()

    def take(self, timeout_s: float | None = None) -> T | None:
        with self._lock:
            if self._value is None and timeout_s:
                self._ready.wait(timeout_s)
            value, self._value = self._value, None
            return value

    def peek(self, max_age_ms: float | None = None) -> T | None:
        """The newest value, or None if empty or older (by arrival) than `max_age_ms`."""
        with self._lock:
            if self._value is None:
                return None
            if max_age_ms is not None and (self._clock.now_ns() - self._put_mono_ns) > max_age_ms * NS_PER_MS:
                return None
            return self._value

    def clear(self) -> None:
        with self._lock:
            self._value = None

    def wake(self) -> None:
        with self._lock:
            self._ready.notify_all()


class InputRejected(ValueError):
    """A message the node will not decide on. `reason` is a short, countable key."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


COMPRESSED_FORMATS = ("jpeg", "jpg", "png")


def compressed_kind(fmt: str) -> str:
    """'jpeg', 'png' or '' from a CompressedImage.format such as 'rgb8; jpeg compressed bgr8'."""
    f = fmt.lower()
    if "png" in f:
        return "png"
    if "jpeg" in f or "jpg" in f:
        return "jpeg"
    return ""


def decode_compressed(data: bytes, fmt: str, max_pixels: int = 1 << 24) -> np.ndarray:
    """JPEG/PNG bytes -> [H, W, 3] uint8 RGB. InputRejected when unreadable or too large."""
    import cv2

    kind = compressed_kind(fmt)
    if not kind:
        raise InputRejected("format_unsupported", f"compressed format {fmt!r}")
    if not data:
        raise InputRejected("empty_image", "no compressed bytes")
    buf = np.frombuffer(data, np.uint8)
    head = bytes(data[:8])
    if kind == "png" and head != b"\x89PNG\r\n\x1a\n" or kind == "jpeg" and head[:2] != b"\xff\xd8":
        raise InputRejected("corrupt_compressed", f"{kind} signature missing")
    dims = _compressed_dims(bytes(data[:65536]), kind)
    if dims is not None and dims[0] * dims[1] > max_pixels:  # checked before decoding (no bombs)
        raise InputRejected("too_many_pixels", f"{dims[0]}x{dims[1]} {kind}")
    bgr = cv2.imdecode(buf, cv2.IMREAD_COLOR)
    if bgr is None or bgr.ndim != 3 or bgr.size == 0:
        raise InputRejected("corrupt_compressed", f"{kind} does not decode")
    if bgr.shape[0] * bgr.shape[1] > max_pixels:
        raise InputRejected("too_many_pixels", f"{bgr.shape[1]}x{bgr.shape[0]}")
    return cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)


def _compressed_dims(head: bytes, kind: str) -> tuple[int, int] | None:
    """(width, height) from a PNG IHDR or a JPEG SOFn header, None if not found in `head`."""
    if kind == "png":
        if len(head) >= 24 and head[12:16] == b"IHDR":
            return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")
        return None
    i = 2
    while i + 9 <= len(head):
        if head[i] != 0xFF:
            return None
        marker = head[i + 1]
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:
            i += 2
            continue
        seg_len = int.from_bytes(head[i + 2:i + 4], "big")
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            return int.from_bytes(head[i + 7:i + 9], "big"), int.from_bytes(head[i + 5:i + 7], "big")
        i += 2 + seg_len
    return None
