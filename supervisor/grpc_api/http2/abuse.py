"""Flood limits of one HTTP/2 connection: what a client may make the server do for free, counted and
answered with GOAWAY(ENHANCE_YOUR_CALM) as nghttp2 and grpc-core answer it.

The numbers are theirs (or Envoy's where they have none), so that a client which works against
Triton (grpc-core) or an nghttp2 server works here too:

- Acknowledgements obey write back-pressure. While the transport's write buffer is above its
  high-water mark (the client is not reading), at most MAX_UNSENT_ACKS PING/SETTINGS ACKs and
  MAX_UNSENT_FRAMES frames of any kind may be written; one more and the connection is cut off
  (nghttp2: NGHTTP2_DEFAULT_MAX_OBQ_FLOOD_ITEM = 1000 queued ACKs, then NGHTTP2_ERR_FLOODED;
  NGHTTP2_DEFAULT_MAX_OUTBOUND_QUEUE_SIZE = 5000 queued frames).
- RST_STREAM from the client (rapid reset, CVE-2023-44487): a token bucket of RESET_BURST that
  refills RESET_RATE per second (nghttp2's stream reset rate limit: 1000, 33/s).
- Glitches, frames that cost work and carry no request (empty DATA without END_STREAM, PRIORITY,
  unknown frame types, SETTINGS and PINGs, streams we must refuse or reset): a token bucket of
  GLITCH_BURST refilling GLITCH_RATE per second (nghttp2's glitch rate limit: 10000, 330/s). A
  SETTINGS that changes the initial window costs one more token per 64 open streams (each is updated).
- WINDOW_UPDATE: at most 100 + 2 * (streams opened + 10 * DATA frames sent) per connection (Envoy's
  rule, max_inbound_window_update_frames_per_data_frame_sent = 10, with 100 of slack where Envoy has 1).
- Header blocks: at most MAX_CONTINUATIONS CONTINUATION frames after a HEADERS (nghttp2: 8) and
  MAX_SETTINGS entries in one SETTINGS frame (nghttp2: 32).
- PINGs, as grpc-core polices them (--grpc-http2-max-ping-strikes, default 2;
  --grpc-http2-min-recv-ping-interval-without-data, default 5 minutes;
  --grpc-keepalive-permit-without-calls, default false): a PING that comes sooner than the minimum
  interval after the previous one is a strike (sooner than 2 hours while no call runs, unless
  permitted without calls); one strike more than the maximum and the connection gets GOAWAY
  (ENHANCE_YOUR_CALM, "too_many_pings"). Strikes are forgiven whenever the server sends headers or
  data. 0 strikes: not policed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

MAX_UNSENT_ACKS = 1000
MAX_UNSENT_FRAMES = 5000
RESET_BURST, RESET_RATE = 1000, 33.0
GLITCH_BURST, GLITCH_RATE = 10000, 330.0
# Huffman-coded header bytes a connection may have decoded: HPACK's Huffman decoding is pure Python here
# (~0.6 us a byte on the loop), so a client sending big coded headers could keep the loop busy for everyone.
# 256 KiB at once, 128 KiB/s after that (at most ~8% of a core a connection); real clients send a few
# coded bytes a request, the rest indexed.
HUFFMAN_BURST, HUFFMAN_RATE = 256 * 1024, 128 * 1024.0
WINDOW_UPDATES_PER_DATA_FRAME = 10
WINDOW_UPDATE_SLACK = 100
MAX_CONTINUATIONS = 8
MAX_SETTINGS = 32
STREAMS_PER_GLITCH = 64  # a SETTINGS changing the initial window costs a token per this many streams
IDLE_PING_INTERVAL_S = 2 * 3600.0  # grpc-core: a connection without calls may PING as often as TCP keepalive


class Flood(Exception):
    """The client crossed a limit: GOAWAY(ENHANCE_YOUR_CALM) with this text, then close."""


class TokenBucket:
    """`burst` tokens, refilled at `rate` per second; take() is False once they are spent."""

    __slots__ = ("burst", "rate", "tokens", "stamp")

    def __init__(self, burst: int, rate: float) -> None:
        self.burst = float(burst)
        self.rate = rate
        self.tokens = float(burst)
        self.stamp = time.monotonic()

    def take(self, n: float = 1.0) -> bool:
        if self.tokens < n:  # refill only when short: the common case costs no clock read
            now = time.monotonic()
            self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
            self.stamp = now
            if self.tokens < n:
                return False
        self.tokens -= n
        return True


@dataclass(frozen=True)
class PingPolicy:
    """grpc-core's server-side PING policing (seconds); max_strikes 0 turns it off."""

    max_strikes: int = 2
    min_interval: float = 300.0
    permit_without_calls: bool = False


NEVER = float("-inf")


class PingStrikes:
    __slots__ = ("policy", "last", "strikes")

    def __init__(self, policy: PingPolicy) -> None:
        self.policy = policy
        self.last = NEVER  # the last PING's time; NEVER: none since we last sent (and so no strikes)
        self.strikes = 0

    def received(self, calls_running: bool) -> bool:
        """A PING arrived; True when it is one strike too many."""
        policy = self.policy
        now = time.monotonic()
        idle = not calls_running and not policy.permit_without_calls
        interval = IDLE_PING_INTERVAL_S if idle else policy.min_interval
        early = now < self.last + interval
        self.last = now
        if not early:
            return False
        self.strikes += 1
        return policy.max_strikes > 0 and self.strikes > policy.max_strikes

    def forgive(self) -> None:
        """We sent headers or data: the client's next PINGs start afresh."""
        self.last = NEVER
        self.strikes = 0


class FloodGuard:
    """The counters of one connection."""

    __slots__ = ("resets", "glitches", "window_updates", "streams_opened", "data_frames_sent", "unsent_acks",
                 "unsent_frames", "pings", "huffman")

    def __init__(self, ping_policy: PingPolicy) -> None:
        self.resets = TokenBucket(RESET_BURST, RESET_RATE)
        self.glitches = TokenBucket(GLITCH_BURST, GLITCH_RATE)
        self.window_updates = 0
        self.streams_opened = 0
        self.data_frames_sent = 0
        self.unsent_acks = 0  # written while the transport was paused (the client not reading)
        self.unsent_frames = 0
        self.pings = PingStrikes(ping_policy)
        self.huffman = TokenBucket(HUFFMAN_BURST, HUFFMAN_RATE)

    def glitch(self, what: str, cost: float = 1.0) -> None:
        if not self.glitches.take(cost):
            raise Flood(f"too many {what} (more than {GLITCH_BURST} at over {GLITCH_RATE:g}/s)")

    def huffman_decoded(self, nbytes: int) -> None:
        if nbytes and not self.huffman.take(nbytes):
            raise Flood(f"too many Huffman-coded header bytes (more than {HUFFMAN_BURST} at over "
                        f"{HUFFMAN_RATE:g}/s)")

    def reset(self) -> None:
        if not self.resets.take():
            raise Flood(f"too many RST_STREAM (more than {RESET_BURST} at over {RESET_RATE:g}/s)")

    def window_update(self) -> None:
        self.window_updates += 1
        sent = WINDOW_UPDATES_PER_DATA_FRAME * self.data_frames_sent
        allowed = WINDOW_UPDATE_SLACK + 2 * (self.streams_opened + sent)
        if self.window_updates > allowed:
            raise Flood(f"too many WINDOW_UPDATE frames ({self.window_updates} for "
                        f"{self.data_frames_sent} DATA frames sent)")

    def queued(self, ack: bool) -> bool:
        """A frame is written while the client does not read; False once it has too many waiting."""
        self.unsent_frames += 1
        if ack:
            self.unsent_acks += 1
        return self.unsent_acks <= MAX_UNSENT_ACKS and self.unsent_frames <= MAX_UNSENT_FRAMES

    def drained(self) -> None:
        self.unsent_acks = 0
        self.unsent_frames = 0
