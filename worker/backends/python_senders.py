"""Non-decoupled Python models answering through `request.get_response_sender()`, as Triton 2.51:
one response per request, sent before or after `execute` returned None; a second response (sent, or
sent and also returned) is the model's error, and the request ends as Triton ends it."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Optional

from ..wire.errors import ErrorCode, InferdError
from .base import Response

# Triton's frontend, when a non-decoupled request got a response and then an error response
TWO_RESPONSES = "expected a single response, got 2"


def after_failure(request: Any, message: str, convert: Callable[[Any, Any], Response]) -> Response:
    """The answer of a request whose execute failed with `message`: a response the model already sent
    with FINAL stands (Triton delivers it; the error goes nowhere); one sent without FINAL is followed
    by the error, which Triton's frontend reports as two responses: that error, carrying the first
    response's outputs too (a gRPC stream delivers them and drops the rest, as Triton's); otherwise the error."""
    sender = request._sender
    if sender is not None and sender.responses:
        if sender.closed:
            return convert(request, sender.responses[0])
        sender._close()
        first = convert(request, sender.responses[0])
        first.error = InferdError(ErrorCode.INTERNAL, TWO_RESPONSES)
        return first
    if sender is not None:
        sender._close()
    return Response(error=InferdError(ErrorCode.INTERNAL, message))


def await_sent(request: Any, poll: Optional[Callable[[], None]], convert: Callable[[Any, Any], Response],
               none: Callable[[], Response]) -> Response:
    """execute returned None for this request: its answer is what the model sends through the sender,
    also later from another thread (the instance waits for it, serving cancellation probes). A model
    that never took the sender cannot answer: the error `none()` at once."""
    sender = request._sender
    if sender is None:
        return none()
    done: threading.Event = sender.done
    while not done.wait(0.02):
        if poll is not None:
            poll()
        if request.is_cancelled():
            sender._close()
            return Response(error=InferdError(ErrorCode.CANCELLED, "request cancelled"))
    if not sender.responses:
        return none()
    return convert(request, sender.responses[0])
