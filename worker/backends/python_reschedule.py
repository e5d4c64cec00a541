"""Request rescheduling (`request.set_release_flags(TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)`), as
Triton 2.51 runs it for iterative_sequence models: a request the model released with RESCHEDULE (and
returned None for) is executed again, with the same inputs and response sender, until the model
releases it for good. Triton puts it back into the model's queue; here the instance runs it again at
once, before its next batch."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

RELEASE_ALL = 1
RESCHEDULE = 2

NOT_NONE = "Expected a None object in the execute function return list for reschduled request, found type '%s'."
NOT_ITERATIVE = ("Request is released with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE, while the model is not "
                 "configured to support iterative sequence")


def rescheduled(requests: list[Any]) -> list[int]:
    """Positions of the requests the model asked to run again (their flags are reset for that run)."""
    again = [i for i, request in enumerate(requests) if request._release_flags & RESCHEDULE]
    for i in again:
        requests[i]._release_flags = RELEASE_ALL
    return again


def run_again(requests: list[Any], responses: list[Any], execute: Callable[[list[Any]], list[Any]]) -> list[Any]:
    """Execute the rescheduled requests of a batch again until none is left; `responses` (one per
    request, None where the model returned none) is updated with what the later runs returned."""
    responses = list(responses)
    again = rescheduled(requests)
    while again:
        live = [i for i in again if not requests[i].is_cancelled()]
        subset = [requests[i] for i in live]
        if not subset:
            break
        for i, response in zip(live, execute(subset)):
            responses[i] = response
        again = [live[j] for j in rescheduled(subset)]
    return responses
