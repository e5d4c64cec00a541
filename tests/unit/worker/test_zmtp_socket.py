"""The worker's own ZMTP DEALER (worker/zmtp_socket.py) against a libzmq ROUTER: handshake and
identity, frames that cross many reads and writes, ZMTP heartbeats answered, and a clear error when
the supervisor goes away or is not there."""

from __future__ import annotations

import os
import select
import socket
import threading
import time

import pytest
import zmq
from inferd.worker.zmtp_socket import DealerSocket, LinkClosed


@pytest.fixture
def router(tmp_path):
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, 10_000)  # a hang fails the test instead of stalling the suite
    endpoint = "ipc://%s/r.sock" % tmp_path
    sock.bind(endpoint)
    yield sock, endpoint
    sock.close(0)
    ctx.term()


def test_identity_and_messages_both_ways(router):
    sock, endpoint = router
    dealer = DealerSocket(endpoint, b"worker-1", 1 << 20)
    dealer.send_multipart([b"hello", b"", memoryview(b"world")])
    assert sock.recv_multipart() == [b"worker-1", b"hello", b"", b"world"]
    sock.send_multipart([b"worker-1", b"a", b"bc"])
    sock.send_multipart([b"worker-1", b"d"])
    first = dealer.recv_multipart()
    assert [bytes(f) for f in first] == [b"a", b"bc"] and not first[1].readonly
    assert [bytes(f) for f in dealer.recv_multipart()] == [b"d"]
    assert dealer.recv_multipart(block=False) is None
    dealer.close()


def test_large_frames_cross_many_reads_and_partial_writes(router):
    sock, endpoint = router
    dealer = DealerSocket(endpoint, b"w", 64 << 20)
    big = bytes(range(256)) * (24 << 12)  # 24 MiB: more than the socket buffers hold, so sends are partial
    mid = b"m" * 70_000
    sock.send_multipart([b"w", b"head", big, mid, b"tail"])
    got = dealer.recv_multipart()
    assert [len(f) for f in got] == [4, len(big), len(mid), 4]
    assert bytes(got[1]) == big and bytes(got[2]) == mid and bytes(got[3]) == b"tail"
    assert not any(f.readonly for f in got)  # models may change their inputs in place
    dealer.send_multipart([b"head", memoryview(big), mid, b"tail"])
    assert sock.recv_multipart() == [b"w", b"head", big, mid, b"tail"]
    dealer.close()


def test_frame_over_the_bound_is_refused(router):
    sock, endpoint = router
    dealer = DealerSocket(endpoint, b"w", 1000)
    sock.send_multipart([b"w", b"x" * 1001])
    with pytest.raises(LinkClosed, match="1001-byte frame|exceeds"):
        dealer.recv_multipart()
    dealer.close()


def test_poll_wakes_on_a_message_and_recv_nowait_takes_it(router):
    sock, endpoint = router
    dealer = DealerSocket(endpoint, b"w", 1 << 20)
    assert dealer.recv_multipart(block=False) is None
    threading.Timer(0.05, sock.send_multipart, args=([b"w", b"late"],)).start()
    readable, _, _ = select.select([dealer.fileno()], [], [], 10)
    assert readable
    got = None
    deadline = time.monotonic() + 10
    while got is None and time.monotonic() < deadline:
        got = dealer.recv_multipart(block=False)
    assert got is not None and bytes(got[0]) == b"late"
    dealer.close()


def test_zmtp_heartbeats_are_answered(tmp_path):
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.HEARTBEAT_IVL, 20)
    sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, 150)
    sock.setsockopt(zmq.RCVTIMEO, 10_000)
    monitor = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
    endpoint = "ipc://%s/hb.sock" % tmp_path
    sock.bind(endpoint)
    dealer = DealerSocket(endpoint, b"w", 1 << 20)
    # read (and so answer PINGs) for ten heartbeat timeouts: libzmq drops a peer that stays silent
    deadline = time.monotonic() + 1.5
    while time.monotonic() < deadline:
        select.select([dealer.fileno()], [], [], 0.01)
        assert dealer.recv_multipart(block=False) is None
    assert not monitor.poll(0), "the ROUTER dropped the connection: PINGs went unanswered"
    dealer.send_multipart([b"still here"])
    assert sock.recv_multipart() == [b"w", b"still here"]
    dealer.close()
    monitor.close(0)
    sock.close(0)
    ctx.term()


def test_supervisor_gone_is_a_clear_error(router):
    sock, endpoint = router
    dealer = DealerSocket(endpoint, b"w", 1 << 20)
    sock.close(0)
    with pytest.raises(LinkClosed, match="closed the connection"):
        dealer.recv_multipart()
    dealer.close()


def test_no_listener_and_wrong_transport(tmp_path):
    with pytest.raises(LinkClosed, match="cannot connect"):
        DealerSocket("ipc://%s/nobody.sock" % tmp_path, b"w", 1 << 20, connect_timeout_s=0.2)
    with pytest.raises(ValueError, match="ipc://"):
        DealerSocket("tcp://127.0.0.1:1", b"w", 1 << 20)


def test_a_silent_listener_fails_the_handshake_in_time(tmp_path):
    path = str(tmp_path / "mute.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)
    started = time.monotonic()
    with pytest.raises(LinkClosed, match="no ZMTP handshake"):
        DealerSocket("ipc://" + path, b"w", 1 << 20, connect_timeout_s=0.3)
    assert time.monotonic() - started < 10
    listener.close()


def test_frames_joined_across_reads_stay_writable():
    from inferd.worker.wire import zmtp

    got: list = []
    whole, _ = zmtp.encode([b"a" * 300, b"b" * 10])
    stream = zmtp.GREETING + whole
    for cut in (65, 70, 300, len(stream) - 3):
        got.clear()
        reader = zmtp.Reader(lambda greeting: None, lambda flags, body: got.append(body), 1 << 20)
        reader.feed(bytearray(stream[:cut]))
        reader.feed(bytearray(stream[cut:]))
        assert [bytes(f) for f in got] == [b"a" * 300, b"b" * 10]
        assert not any(f.readonly for f in got), cut


def test_frames_of_earlier_reads_keep_their_bytes(router):
    """Short reads share one read buffer and are copied out of it; longer ones keep it: either way a
    message's frames stay its own after later reads (and a model's in-place change touches only them)."""
    sock, endpoint = router
    dealer = DealerSocket(endpoint, b"w", 1 << 20)
    kept = []
    for i in range(4):
        size = 20_000 if i % 2 else 10  # above and below the copy bound
        sock.send_multipart([b"w", bytes([65 + i]) * size])
        kept.append(dealer.recv_multipart())  # one message per read: each was sent after the last read
    kept[0][0][0] = ord("z")
    assert [(len(f[0]), bytes(f[0][1:2])) for f in kept] == [(10, b"A"), (20_000, b"B"), (10, b"C"), (20_000, b"D")]
    assert bytes(kept[0][0][:1]) == b"z" and bytes(kept[2][0][:1]) == b"C"
    dealer.close()


def test_recv_one_splits_whole_reads_and_leaves_the_rest_to_the_reader(tmp_path):
    """The main loop's receive (recv_one) splits a read holding whole messages itself (one, or several
    sent ahead); a message cut by a read's end, a PING between messages and an oversized frame go through
    the frame reader, and the split resumes once nothing is left over."""
    from inferd.worker.wire import zmtp

    path = str(tmp_path / "peer.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)
    accepted: list = []

    def accept() -> None:
        conn, _ = listener.accept()
        conn.sendall(zmtp.GREETING + zmtp.ready(b"ROUTER"))
        accepted.append(conn)

    thread = threading.Thread(target=accept)
    thread.start()
    dealer = DealerSocket("ipc://" + path, b"w", 1 << 16)
    thread.join(10)
    (peer,) = accepted
    peer.settimeout(10)
    peer.recv(4096)  # the dealer's greeting and READY

    def message(*frames: bytes) -> bytes:
        return zmtp.encode(list(frames))[0]

    def write_then_read(data: bytes) -> list:
        peer.sendall(data)
        return [bytes(f) for f in dealer.recv_one()]

    one = message(b"h" * 300, b"d" * 7)  # a long header frame, a short data frame
    assert dealer._steady
    assert write_then_read(one) == [b"h" * 300, b"d" * 7]
    assert dealer._steady
    # cut inside the first frame's size, then inside a body: the reader holds the rest between reads
    for cut in (1, 5, 9, 200, len(one) - 1):
        peer.sendall(one[:cut])
        time.sleep(0.01)  # (the two parts usually arrive as two reads; either way the result is the same)
        threading.Timer(0.05, peer.sendall, args=(one[cut:],)).start()
        assert [bytes(f) for f in dealer.recv_one()] == [b"h" * 300, b"d" * 7], cut
        assert dealer._steady, cut
    # messages in one read: the later ones wait in the queue
    assert write_then_read(message(b"a") + message(b"b", b"c") + message(b"h" * 300)) == [b"a"]
    assert [bytes(f) for f in dealer.recv_one()] == [b"b", b"c"]
    assert [bytes(f) for f in dealer.recv_one()] == [b"h" * 300]
    assert dealer._steady
    # a whole message then part of the next in one read: the reader keeps the part for the next read
    two = message(b"d") + one
    peer.sendall(two[:10])
    time.sleep(0.01)
    threading.Timer(0.05, peer.sendall, args=(two[10:],)).start()
    assert [bytes(f) for f in dealer.recv_one()] == [b"d"]
    assert [bytes(f) for f in dealer.recv_one()] == [b"h" * 300, b"d" * 7]
    assert dealer._steady
    # a ZMTP PING before a message is answered (the reader handles commands)
    peer.sendall(zmtp.command(b"PING", b"\x00\x01ctx") + message(b"after ping"))
    assert [bytes(f) for f in dealer.recv_one()] == [b"after ping"]
    pong = peer.recv(4096)
    assert b"PONG" in pong and pong.endswith(b"ctx")
    assert dealer._steady
    # frames are writable and their own (models change inputs in place)
    got = dealer.recv_one() if not peer.sendall(message(b"x" * 10)) else None
    assert got is not None and not got[0].readonly
    got[0][0] = ord("y")
    assert write_then_read(message(b"x" * 10)) == [b"x" * 10]
    # a frame over the bound is refused, not split
    peer.sendall(zmtp.frame_header(0, (1 << 16) + 1))
    with pytest.raises(LinkClosed, match="exceeds"):
        dealer.recv_one()
    dealer.close()
    peer.close()
    listener.close()


def test_recv_ready_takes_whole_messages_without_waiting(tmp_path):
    """A decoupled model's main loop reads with recv_ready after each wake-up: None while nothing whole has
    come (a message cut by a read's end waits in the reader), whole reads split in one pass, several
    messages of one read handed out one by one."""
    from inferd.worker.wire import zmtp

    path = str(tmp_path / "peer.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)
    accepted: list = []

    def accept() -> None:
        conn, _ = listener.accept()
        conn.sendall(zmtp.GREETING + zmtp.ready(b"ROUTER"))
        accepted.append(conn)

    thread = threading.Thread(target=accept)
    thread.start()
    dealer = DealerSocket("ipc://" + path, b"w", 1 << 16)
    thread.join(10)
    (peer,) = accepted
    peer.settimeout(10)
    peer.recv(4096)

    def message(*frames: bytes) -> bytes:
        return zmtp.encode(list(frames))[0]

    def ready() -> list | None:
        select.select([dealer.fileno()], [], [], 10)
        got = dealer.recv_ready()
        return None if got is None else [bytes(f) for f in got]

    assert dealer.recv_ready() is None  # nothing sent
    one = message(b"h" * 300, b"d" * 7)
    peer.sendall(one)
    assert ready() == [b"h" * 300, b"d" * 7] and dealer._steady
    peer.sendall(one[:9])
    assert ready() is None  # a part: kept by the reader
    peer.sendall(one[9:])
    assert ready() == [b"h" * 300, b"d" * 7] and dealer._steady
    peer.sendall(message(b"a") + message(b"b", b"c"))
    assert ready() == [b"a"]
    assert dealer.recv_ready() is not None and dealer.recv_ready() is None
    peer.sendall(zmtp.command(b"PING", b"\x00\x01ctx") + message(b"after ping"))
    assert ready() == [b"after ping"]
    assert b"PONG" in peer.recv(4096)
    peer.close()
    with pytest.raises(LinkClosed):
        while ready() is None:
            pass
    dealer.close()
    listener.close()


def _voluntary_switches(tid: int) -> int:
    with open("/proc/self/task/%d/status" % tid) as status:
        for line in status:
            if line.startswith("voluntary_ctxt_switches:"):
                return int(line.split()[1])
    raise AssertionError("no voluntary_ctxt_switches for thread %d" % tid)


def _sleeping(tid: int) -> bool:
    with open("/proc/self/task/%d/stat" % tid) as stat:
        return stat.read().rsplit(")", 1)[1].split()[0] == "S"


@pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="needs /proc (Linux)")
def test_main_loop_wait_is_not_woken_when_the_supervisor_reads(tmp_path):
    """A thread blocked in recv() on a Unix socket is woken each time the peer reads what the socket sent
    (freed send-buffer space wakes every sleeper): in lock step that was a wake-up and a sleep for nothing
    per request. recv_one waits in poll() for POLLIN, which those wake-ups do not end."""
    from inferd.worker.wire import zmtp

    path = str(tmp_path / "peer.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)
    accepted: list = []

    def accept() -> None:
        conn, _ = listener.accept()
        conn.sendall(zmtp.GREETING + zmtp.ready(b"ROUTER"))
        accepted.append(conn)

    thread = threading.Thread(target=accept)
    thread.start()
    dealer = DealerSocket("ipc://" + path, b"w", 1 << 16)
    thread.join(10)
    (peer,) = accepted
    peer.settimeout(10)
    handshake = zmtp.GREETING + zmtp.ready(b"DEALER", b"w")
    got = b""
    while len(got) < len(handshake):
        got += peer.recv(len(handshake) - len(got))
    sent = 20
    one, _ = zmtp.encode([b"answer"])
    for _ in range(sent):  # what the worker sent, not yet read by the supervisor: one buffer each
        dealer.send_multipart([b"answer"])
    received: list = []
    waiting = threading.Thread(target=lambda: received.append([bytes(f) for f in dealer.recv_one()]))
    waiting.start()
    deadline = time.monotonic() + 10
    tid = waiting.native_id
    while not _sleeping(tid):  # blocked in its wait
        assert time.monotonic() < deadline, "the receiving thread never went to sleep"
        time.sleep(0.001)
    before = _voluntary_switches(tid)
    for _ in range(sent):  # the supervisor reads the answers one at a time, the receiver still waiting
        assert peer.recv(len(one)) == one
        time.sleep(0.002)
    woken = _voluntary_switches(tid) - before
    peer.sendall(zmtp.encode([b"next"])[0])
    waiting.join(10)
    assert received == [[b"next"]]
    assert woken <= 2, "the waiting receiver was woken %d times by its peer's reads" % woken
    dealer.close()
    peer.close()
    listener.close()


def _steady(router) -> tuple:
    """The router and a dealer that has read one message (the link in its steady state: recv_one's path)."""
    sock, endpoint = router
    dealer = DealerSocket(endpoint, b"w", 1 << 20)
    sock.send_multipart([b"w", b"first"])
    assert [bytes(f) for f in dealer.recv_one()] == [b"first"]
    return sock, dealer


def _recv_one_timed(dealer: DealerSocket, after_s: float, send) -> tuple[list, float]:
    """recv_one in this thread while another sends after `after_s`: (frames, this thread's CPU seconds)."""
    timer = threading.Timer(after_s, send)
    timer.start()
    cpu0 = time.thread_time()
    got = dealer.recv_one()
    cpu = time.thread_time() - cpu0
    timer.join()
    return got, cpu


def test_poll_next_polls_for_the_next_message_then_sleeps_again(router):
    """Asked to (an Execute's poll_us), the next recv_one reads as soon as a message is there instead of
    sleeping in poll(): it spends CPU while it waits. The one after sleeps as before."""
    sock, dealer = _steady(router)

    dealer.poll_next(5_000_000)  # more than the most: capped at MAX_POLL_US (1 s)
    got, polling_cpu = _recv_one_timed(dealer, 0.2, lambda: sock.send_multipart([b"w", b"polled"]))
    assert [bytes(f) for f in got] == [b"polled"]
    got, sleeping_cpu = _recv_one_timed(dealer, 0.2, lambda: sock.send_multipart([b"w", b"slept"]))
    assert [bytes(f) for f in got] == [b"slept"]
    assert polling_cpu > 0.01 and sleeping_cpu < 0.005, (polling_cpu, sleeping_cpu)
    dealer.close()


def test_a_poll_that_ends_without_a_message_sleeps_until_one_comes(router):
    sock, dealer = _steady(router)
    dealer.poll_next(20_000)  # 20 ms, then poll()
    got, cpu = _recv_one_timed(dealer, 0.3, lambda: sock.send_multipart([b"w", b"late"]))
    assert [bytes(f) for f in got] == [b"late"]
    assert cpu < 0.1, cpu  # the 20 ms of polling at most, not the whole 300 ms
    dealer.close()


def test_the_supervisor_closing_during_a_poll_is_a_closed_link(router):
    sock, dealer = _steady(router)
    dealer.poll_next(1_000_000)
    timer = threading.Timer(0.05, sock.close, args=(0,))
    timer.start()
    with pytest.raises(LinkClosed):
        dealer.recv_one()
    timer.join()
    dealer.close()


def test_held_messages_leave_in_order_in_one_write_on_flush_or_the_next_plain_send(router):
    sock, endpoint = router
    dealer = DealerSocket(endpoint, b"w", 64 << 20)
    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)
    for k in range(3):
        dealer.send_multipart([b"held", b"%d" % k], hold=True)
    assert dealer.holding
    assert not poller.poll(100)  # nothing written yet
    assert not dealer.try_send_many([[b"other thread"]])  # (held messages go first: it must wait)
    dealer.flush()
    assert not dealer.holding
    assert [sock.recv_multipart() for _ in range(3)] == [[b"w", b"held", b"%d" % k] for k in range(3)]
    # a message sent without hold (here one with a large frame, written from where it lies) follows the held ones
    dealer.send_multipart([b"held", b"a"], hold=True)
    big = b"x" * (1 << 20)
    dealer.send_multipart([b"big", memoryview(big)], hold=True)  # (a large frame is never held)
    assert not dealer.holding
    assert sock.recv_multipart() == [b"w", b"held", b"a"]
    assert sock.recv_multipart() == [b"w", b"big", big]
    # what is held is bounded: past it, everything held is written
    frame = b"y" * 10_000
    for _ in range(10):
        dealer.send_multipart([frame], hold=True)
    assert dealer.holding  # the last ones are held again after the write
    dealer.flush()
    assert [sock.recv_multipart() for _ in range(10)] == [[b"w", frame]] * 10
    assert not poller.poll(100)
    dealer.close()
