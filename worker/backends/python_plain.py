"""A Python model's returned responses in the usual case, checked and converted in one pass: a list of
one pb_utils.InferenceResponse per request, none with an error or parameters, no request rescheduled or
holding a response sender. Anything else returns None, and python_model's general path (its return
rules, senders, rescheduling, errors) decides from the start; nothing here raises or changes a request.
Same responses as that path: the outputs pruned to the requested ones."""

from __future__ import annotations

from typing import Any, Optional

from .base import Response, Tensor
from .python_reschedule import RELEASE_ALL

_new = object.__new__


def plain_results(pb_requests: list[Any], returned: Any, response_type: type[Any]) -> Optional[list[Response]]:
    if type(returned) is not list or len(returned) != len(pb_requests):
        return None
    results: list[Response] = []
    append = results.append
    new = _new
    for req, resp in zip(pb_requests, returned):  # a loop, not a comprehension: no call per response
        if (type(resp) is not response_type or resp._error is not None or resp._parameters != "{}"
                or req._sender is not None or req._release_flags != RELEASE_ALL):
            return None
        wanted = req._requested
        outputs = []
        for t in resp._outputs:
            name = t._name
            if name in wanted:
                tensor = new(Tensor)  # (Tensor and Response built without their __init__'s call)
                tensor.name = name
                tensor.datatype = t._datatype
                tensor.array = t._array
                outputs.append(tensor)
        result = new(Response)
        result.outputs = outputs
        result.error = None
        result.parameters = {}
        append(result)
    return results
