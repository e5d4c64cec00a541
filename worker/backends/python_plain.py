"""A Python model's returned responses in the usual case, checked and converted in one pass: a list of
one pb_utils.InferenceResponse per request, none with an error or parameters, no request rescheduled or
holding a response sender. Anything else returns None, and python_model's general path (its return
rules, senders, rescheduling, errors) decides from the start; nothing here raises or changes a request.
Same responses as that path: the outputs pruned to the requested ones. `alike_results` takes the most
usual case of all, one requested output per request of the same name, datatype, shape and dtype
(backends.base.AlikeResults: the arrays, without a Response per request)."""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from .base import AlikeResults, Response, Tensor
from .python_reschedule import RELEASE_ALL

_new = object.__new__
_ndarray = np.ndarray


def alike_results(pb_requests: list[Any], returned: Any, response_type: type[Any]) -> Optional[AlikeResults]:
    if type(returned) is not list or len(returned) != len(pb_requests) or not returned:
        return None
    first = returned[0]
    if type(first) is not response_type or len(first._outputs) != 1:
        return None
    out = first._outputs[0]
    name, datatype, array = out._name, out._datatype, out._array
    if type(array) is not _ndarray:
        return None
    shape, dtype = array.shape, array.dtype
    arrays: list[Any] = []
    append = arrays.append
    release_all, ndarray = RELEASE_ALL, _ndarray
    seen: Any = arrays  # the last list of wanted outputs found to hold `name` (requests share one)
    try:
        for req, resp in zip(pb_requests, returned):  # a loop, not a comprehension: no call per response
            if (type(resp) is not response_type or resp._error is not None or resp._parameters != "{}"
                    or req._sender is not None or req._release_flags != release_all):
                return None
            out, = resp._outputs  # (ValueError unless exactly one)
            array = out._array
            if (out._name != name or out._datatype != datatype or type(array) is not ndarray
                    or array.shape != shape or (array.dtype is not dtype and array.dtype != dtype)):
                return None
            wanted = req._requested
            if wanted is not seen:
                if name not in wanted:
                    return None
                seen = wanted
            append(array)
    except ValueError:  # a response of more or fewer outputs
        return None
    return AlikeResults(name, datatype, arrays)


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
