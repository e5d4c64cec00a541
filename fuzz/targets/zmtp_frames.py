"""ZMTP 3.0 framing on both ends of the worker link, against a reference reader written from RFC 23.

- The supervisor's end: a real `instances.channel._Peer` (ROUTER semantics) fed the bytes a worker's socket
  sends, cut into reads as the bytes choose; the messages it routes to the worker's handler, the PONGs it
  writes and whether it drops the connection must be what the reference reads.
- The worker's end: a real `zmtp_socket.DealerSocket` (connected once, in `setup`, to a listener here), its
  reader state fresh for each input, fed reads the way `recv_one` feeds them (whole messages split by
  `_whole_messages` while the reader is idle, the frame reader otherwise); the messages it queues and
  whether it raises LinkClosed (its only error) must be what the reference reads.
- `zmtp.encode` (both ends' writer): what it writes the reference reads as the frames given.

The reference: greeting (0xFF, 8 bytes, bit 0 of byte 9, version >= 3, mechanism "NULL"), then frames
(flags MORE/LONG/COMMAND; a size over the bound is a violation once its header is complete), commands
(READY once, with a Socket-Type this end talks to, before any message; PING answered with a PONG of the
ping's context; ERROR is a violation; others ignored), messages of one or more frames ending with one
without MORE (a command between two frames of a message does not end it).

Data: one mode byte, then
- mode 0: the stream a peer sends (seeds: what real libzmq DEALERs and inferd's own DealerSocket send,
  fuzz/seeds/wire_seeds.py), read in pieces whose sizes come from the mode byte;
- mode 1: a stream built from the bytes (greeting, READY, messages, PINGs, frames up to 200 KiB, long
  headers for short frames) through inferd's writer, then a few bytes changed.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import socket
import struct
import tempfile
import threading
from typing import Any

from _fdp import FDP, provider
from inferd.supervisor.instances import channel as channel_mod
from inferd.worker import zmtp_socket
from inferd.worker.wire import zmtp

SUPERVISOR_PEERS = frozenset((b"DEALER", b"REQ", b"ROUTER"))
WORKER_PEERS = frozenset((b"ROUTER", b"DEALER"))
WORKER_MAX_FRAME = 70_000  # small enough to be crossed, above the 64 KiB frame the reader fills by itself
SUPERVISOR_MAX_FRAME = channel_mod._MAX_FRAME


class Finding(AssertionError):
    pass


# ---- the reference reader -------------------------------------------------------------------------------

class Reading:
    def __init__(self) -> None:
        self.messages: list[list[bytes]] = []
        self.pongs: list[bytes] = []  # the PONG frames this end must write, in order
        self.identity: bytes | None = None  # from READY
        self.ready = False
        self.violation = ""  # why the connection must be dropped ("" none)


def reference(stream: bytes, peers: frozenset[bytes], max_frame: int) -> Reading:
    out = Reading()
    if len(stream) < 64:
        return out
    g = stream[:64]
    if g[0] != 0xFF or not g[9] & 1:
        out.violation = "signature"
        return out
    if g[10] < 3:
        out.violation = "version"
        return out
    if g[12:32] != b"NULL" + bytes(16):
        out.violation = "mechanism"
        return out
    pos, parts = 64, []
    while True:
        if len(stream) - pos < 2:
            return out
        flags = stream[pos]
        if flags & 2:
            if len(stream) - pos < 9:
                return out
            (size,) = struct.unpack_from(">Q", stream, pos + 1)
            body_at = pos + 9
        else:
            size, body_at = stream[pos + 1], pos + 2
        if size > max_frame:
            out.violation = "frame size"
            return out
        if len(stream) - body_at < size:
            return out
        body = stream[body_at:body_at + size]
        pos = body_at + size
        if flags & 4:
            why = _command(out, body, peers)
            if why:
                out.violation = why
                return out
            continue
        if not out.ready:
            out.violation = "message before READY"
            return out
        parts.append(body)
        if not flags & 1:
            out.messages.append(parts)
            parts = []


def _command(out: Reading, body: bytes, peers: frozenset[bytes]) -> str:
    if not body or len(body) < 1 + body[0]:
        return "malformed command"
    name, rest = body[1:1 + body[0]], body[1 + body[0]:]
    if name == b"READY":
        if out.ready:
            return "second READY"
        props: dict[bytes, bytes] = {}
        i = 0
        while i < len(rest):
            n = rest[i]
            if i + 1 + n + 4 > len(rest):
                return "malformed property"
            key = rest[i + 1:i + 1 + n].lower()
            (vlen,) = struct.unpack_from(">I", rest, i + 1 + n)
            i += 1 + n + 4
            if i + vlen > len(rest):
                return "malformed property"
            props[key] = rest[i:i + vlen]
            i += vlen
        if props.get(b"socket-type") not in peers:
            return "incompatible socket type"
        out.ready = True
        out.identity = props.get(b"identity", b"")
    elif name == b"PING":
        out.pongs.append(zmtp.command(b"PONG", rest[2:18]))
    elif name == b"ERROR":
        return "ERROR command"
    return ""


# ---- how the bytes are cut into reads ---------------------------------------------------------------------

def cuts(stream: bytes, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    style = seed % 4
    small = 3 if len(stream) < 4096 else 3000  # (a large stream in tiny reads costs much and finds little more)
    out, pos = [], 0
    while pos < len(stream):
        if style == 0:
            n = len(stream)
        elif style == 1:
            n = rng.randint(1, small)
        elif style == 2:
            n = rng.randint(1, 100 * small)
        else:
            n = rng.choice((1, 7, 64, 65, 4096, 65536, 70_000))
        out.append(stream[pos:pos + n])
        pos += n
    return out


# ---- the supervisor's end ---------------------------------------------------------------------------------

class _Transport:
    """What _Peer writes (and whether it aborted); the connection's socket is not the subject here."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.aborted = False

    def write(self, data: Any) -> None:
        self.writes.append(bytes(data))

    def writelines(self, pieces: Any) -> None:
        self.writes.append(b"".join(bytes(p) for p in pieces))

    def abort(self) -> None:
        self.aborted = True

    def is_closing(self) -> bool:
        return self.aborted

    def get_write_buffer_size(self) -> int:
        return 0


_loop: asyncio.AbstractEventLoop | None = None
_tmp = ""


async def _drive_supervisor(stream: bytes, seed: int, want: Reading) -> tuple[list[list[bytes]], _Transport, int]:
    chan = channel_mod.Channel(_tmp)
    got: list[list[bytes]] = []
    if want.identity:
        ident = want.identity.decode("utf-8", "surrogateescape")
        chan.register(ident, lambda parts: got.append([bytes(p) for p in parts]),
                      lambda parts: got.append([b"<hb>"] + [bytes(p) for p in parts]))
    peer = channel_mod._Peer(chan)
    transport = _Transport()
    peer.connection_made(transport)  # type: ignore[arg-type]
    for piece in cuts(stream, seed):
        if transport.aborted:
            break  # a dropped connection reads nothing more
        peer.data_received(piece)
    return got, transport, chan.dropped


def check_supervisor(stream: bytes, seed: int) -> None:
    assert _loop is not None
    want = reference(stream, SUPERVISOR_PEERS, SUPERVISOR_MAX_FRAME)
    got, transport, dropped = _loop.run_until_complete(_drive_supervisor(stream, seed, want))
    if transport.writes[:1] != [zmtp.GREETING + zmtp.ready(b"ROUTER")]:
        raise Finding(f"the supervisor's first write is {transport.writes[:1]!r}")
    if transport.aborted != bool(want.violation):
        raise Finding(f"supervisor dropped={transport.aborted}, reference violation={want.violation!r}")
    if transport.writes[1:] != want.pongs:
        raise Finding(f"supervisor wrote {transport.writes[1:]!r}, expected PONGs {want.pongs!r}")
    if want.identity:
        if got != want.messages:
            raise Finding(f"supervisor routed {got!r}, reference read {want.messages!r}")
    elif dropped != len(want.messages) or got:
        raise Finding(f"anonymous peer: {dropped} dropped, {len(want.messages)} read")


# ---- the worker's end -------------------------------------------------------------------------------------

_dealer: zmtp_socket.DealerSocket | None = None


def _serve(listener: socket.socket) -> None:
    conn, _ = listener.accept()
    conn.sendall(zmtp.GREETING + zmtp.ready(b"ROUTER"))
    while conn.recv(1 << 16):  # the DealerSocket's greeting, READY and PONGs: read and dropped
        pass


def _fresh(dealer: zmtp_socket.DealerSocket) -> None:
    """The dealer's reading state as a new connection's (its __init__'s, before the handshake)."""
    dealer._messages.clear()
    dealer._peer_ready = False
    dealer._steady = False
    dealer._assembler = zmtp.Messages(dealer._on_command, dealer._on_message)
    dealer._reader = zmtp.Reader(zmtp.check_greeting, dealer._assembler.on_frame, WORKER_MAX_FRAME)


def check_worker(stream: bytes, seed: int) -> None:
    dealer = _dealer
    assert dealer is not None
    want = reference(stream, WORKER_PEERS, WORKER_MAX_FRAME)
    _fresh(dealer)
    got: list[list[bytes]] = []
    closed = ""
    for piece in cuts(stream, seed):
        view = memoryview(bytearray(piece))
        try:
            if dealer._steady and len(piece) <= zmtp_socket._COPY_MAX:  # recv_one's own split
                whole = zmtp_socket._whole_messages(view, len(piece), WORKER_MAX_FRAME)
                if whole is not None:
                    dealer._messages.extend(whole)
                    continue
            dealer._feed(view)
        except zmtp_socket.LinkClosed as exc:
            closed = str(exc)
            break
        finally:
            while dealer._messages:
                got.append([bytes(p) for p in dealer._messages.popleft()])
    if bool(closed) != bool(want.violation):
        raise Finding(f"worker closed={closed!r}, reference violation={want.violation!r}")
    if got != want.messages:
        raise Finding(f"worker read {got!r}, reference read {want.messages!r}")


# ---- streams built from the bytes ---------------------------------------------------------------------------

def _frame_bytes(fdp: FDP) -> bytes:
    size = fdp.PickValueInList([0, 1, 5, 255, 256, 300, 65535, 65536, 70_000, 70_001, 200_000])
    fill = fdp.ConsumeBytes(min(size, 8)) or b"\xab"
    return (fill * (size // len(fill) + 1))[:size]


def built(fdp: FDP) -> bytes:
    parts = [zmtp.GREETING]
    if fdp.ConsumeIntInRange(0, 7) == 0:
        parts = [bytes(fdp.ConsumeBytes(64)).ljust(64, b"\x00")]
    for _ in range(fdp.ConsumeIntInRange(0, 8)):
        op = fdp.ConsumeIntInRange(0, 7)
        if op == 0:
            kind = fdp.PickValueInList([b"DEALER", b"ROUTER", b"REQ", b"PUB", b"dealer", b""])
            parts.append(zmtp.ready(kind, fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 8))))
        elif op == 1:
            parts.append(zmtp.command(b"PING", fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 20))))
        elif op == 2:
            parts.append(zmtp.command(fdp.PickValueInList([b"ERROR", b"PONG", b"SUBSCRIBE", b""]),
                                      fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 6))))
        elif op in (3, 4, 5):
            frames = [_frame_bytes(fdp) for _ in range(fdp.ConsumeIntInRange(1, 3))]
            whole, pieces = zmtp.encode(frames)
            parts.append(whole or b"".join(bytes(p) for p in pieces))
        elif op == 6:  # a long header for a short frame, a command with MORE, reserved flag bits
            flags = fdp.ConsumeIntInRange(0, 255)
            body = fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 10))
            parts.append(bytes((flags | 2,)) + struct.pack(">Q", len(body)) + body if flags & 2
                         else bytes((flags, len(body))) + body)
        else:
            parts.append(fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 12)))
    stream = bytearray(b"".join(parts))
    for _ in range(fdp.ConsumeIntInRange(0, 2)):
        if stream:
            stream[fdp.ConsumeIntInRange(0, len(stream) - 1)] = fdp.ConsumeIntInRange(0, 255)
    return bytes(stream)


def check_encoder(fdp: FDP) -> None:
    frames = [_frame_bytes(fdp) for _ in range(fdp.ConsumeIntInRange(1, 4))]
    mixed = [bytearray(f) if i % 3 == 1 else memoryview(f) if i % 3 == 2 else f for i, f in enumerate(frames)]
    whole, pieces = zmtp.encode(mixed)
    wire = whole or b"".join(bytes(memoryview(p).cast("B")) for p in pieces)
    stream = zmtp.GREETING + zmtp.ready(b"DEALER") + wire
    want = reference(stream, SUPERVISOR_PEERS, 1 << 40)
    if want.violation or want.messages != [frames]:
        raise Finding(f"encode({[len(f) for f in frames]}) read back as {want.violation or want.messages!r}")


# ---- the target -------------------------------------------------------------------------------------------

def setup() -> None:
    global _loop, _tmp, _dealer
    logging.getLogger("inferd").setLevel(logging.CRITICAL)  # dropped connections are logged as warnings
    _loop = asyncio.new_event_loop()
    _tmp = tempfile.mkdtemp(prefix="zmtp-fuzz-")
    path = os.path.join(_tmp, "w.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)
    threading.Thread(target=_serve, args=(listener,), daemon=True).start()
    _dealer = zmtp_socket.DealerSocket("ipc://" + path, b"fuzz", WORKER_MAX_FRAME)


def test_one_input(data: bytes) -> None:
    if _dealer is None:
        setup()
    if not data:
        return
    if data[0] & 1:
        fdp = provider(data[1:])
        check_encoder(fdp)
        stream = built(fdp)
    else:
        stream = data[1:]
    seed = data[0] >> 1
    check_supervisor(stream, seed)
    check_worker(stream, seed)
