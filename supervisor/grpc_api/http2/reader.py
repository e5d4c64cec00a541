"""Splitting a connection's byte stream into HTTP/2 frames: the client preface first, then frames
that may arrive cut anywhere across reads. Whole frames inside a read are handed on as memoryviews
of that read (no copy); only a frame cut by a read boundary is joined."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import frames as f

FrameSink = Callable[[int, int, int, memoryview], None]  # (type, flags, stream id, payload)


class FrameReader:
    def __init__(self, on_frame: FrameSink, max_frame: int) -> None:
        self.on_frame = on_frame
        self.max_frame = max_frame
        self._preface = b""
        self.preface_seen = False
        self._hold: list[Any] = []  # bytes of an incomplete frame
        self._hold_len = 0
        self._need = 9

    def feed(self, data: bytes) -> bool:
        """False when the bytes are not HTTP/2 (the preface does not match): close the connection.
        Raises frames.ConnectionError_ for a frame above the size limit."""
        view = memoryview(data)
        if not self.preface_seen:
            need = len(f.PREFACE) - len(self._preface)
            self._preface += bytes(view[:need])
            if not f.PREFACE.startswith(self._preface):
                return False
            if len(self._preface) < len(f.PREFACE):
                return True
            self.preface_seen = True
            view = view[need:]
        if self._hold_len:
            view = self._complete_held(view)
        if view:
            self._parse(view)
        return True

    def _complete_held(self, view: memoryview) -> memoryview:
        """Adds to the held partial frame; parses it once whole and returns the rest of `view`."""
        take = self._need - self._hold_len
        self._hold.append(view[:take])
        self._hold_len += min(take, len(view))
        view = view[take:]
        if self._hold_len < self._need:
            return view
        if self._need == 9:  # the header is complete: now we know the frame's length
            head = b"".join(self._hold)
            self._hold = [head]
            length = f.parse_header(head, 0)[0]
            self._check_length(length)
            self._need = 9 + length
            if length:
                return self._complete_held(view) if view else view
        frame = b"".join(self._hold)
        self._hold = []
        self._hold_len = 0
        self._need = 9
        self._parse(memoryview(frame))
        return view

    def _check_length(self, length: int) -> None:
        if length > self.max_frame:
            raise f.ConnectionError_(f.FRAME_SIZE_ERROR, f"frame of {length} bytes exceeds {self.max_frame}")

    def _parse(self, view: memoryview) -> None:
        pos = 0
        end = len(view)
        on_frame = self.on_frame
        unpack = f.HEAD.unpack_from  # frames.parse_header, inline
        while end - pos >= 9:
            hi, lo, ftype, flags, sid = unpack(view, pos)
            length = (hi << 8) | lo
            if length > self.max_frame:
                self._check_length(length)
            if end - pos - 9 < length:
                break
            start = pos + 9
            pos = start + length
            on_frame(ftype, flags, sid & 0x7FFFFFFF, view[start:pos])
        if pos < end:
            self._hold = [bytes(view[pos:])]
            self._hold_len = end - pos
            self._need = 9
            if self._hold_len >= 9:
                length = f.parse_header(self._hold[0], 0)[0]
                self._check_length(length)
                self._need = 9 + length
