"""ZMTP framing both ways against a real libzmq peer (pyzmq DEALER), for random messages: what libzmq
sends, inferd's reader (wire/zmtp.py, as both ends use it) reads as the frames sent; what inferd's writer
(`zmtp.encode`) sends, libzmq receives as the frames given. fuzz/targets/zmtp_frames.py fuzzes the same
reader against a reference written from RFC 23; this holds the reference's reading to libzmq's."""

from __future__ import annotations

import os
import socket

import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from inferd.worker.wire import zmtp

FRAME = st.one_of(st.binary(max_size=300), st.sampled_from([b"", b"y" * 255, b"z" * 256, bytes(range(256)) * 300]))
MESSAGES = st.lists(st.lists(FRAME, min_size=1, max_size=4), min_size=1, max_size=4)


class _Peer:
    """One accepted connection read with inferd's Reader + Messages."""

    def __init__(self, conn: socket.socket) -> None:
        self.conn = conn
        self.commands: list[bytes] = []
        self.messages: list[list[bytes]] = []
        self.assembler = zmtp.Messages(self._command, lambda parts: self.messages.append([bytes(p) for p in parts]))
        self.reader = zmtp.Reader(zmtp.check_greeting, self.assembler.on_frame, 1 << 30)

    def _command(self, body: memoryview) -> None:
        name, rest = zmtp.parse_command(body)
        self.commands.append(name)
        if name == b"READY":
            assert zmtp.parse_properties(rest)[b"socket-type"] == b"DEALER"
            self.assembler.handshaken = True

    def read_until(self, done) -> None:
        while not done():
            data = self.conn.recv(1 << 16)
            assert data, "libzmq closed the connection"
            self.reader.feed(data)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(messages=MESSAGES)
def test_random_messages_cross_libzmq_both_ways_unchanged(tmp_path, messages):
    path = str(tmp_path / "z.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)
    ctx = zmq.Context()
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.setsockopt(zmq.RCVTIMEO, 10_000)
    try:
        dealer.connect("ipc://" + path)
        conn, _ = listener.accept()
        conn.settimeout(10)
        conn.sendall(zmtp.GREETING + zmtp.ready(b"ROUTER"))
        peer = _Peer(conn)
        peer.read_until(lambda: b"READY" in peer.commands)
        for frames in messages:
            dealer.send_multipart(frames)
        peer.read_until(lambda: len(peer.messages) == len(messages))
        assert peer.messages == messages
        for frames in messages:
            whole, pieces = zmtp.encode(frames)
            conn.sendall(whole or b"".join(bytes(memoryview(p).cast("B")) for p in pieces))
            assert dealer.recv_multipart() == frames
    finally:
        dealer.close(0)
        ctx.term()
        listener.close()
        if "conn" in locals():
            conn.close()
        os.unlink(path)  # (the next example binds the same path)
