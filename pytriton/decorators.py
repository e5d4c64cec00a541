"""PyTriton's decorators for inference callables (`@batch`, `@sample`, `@group_by_keys`...).

An inference callable receives a list of requests (dict-like `proxy.Request`s) and returns one dict
of outputs per request. `@batch` turns that into `func(**batched_inputs) -> dict of batched outputs`;
the others adapt either the list form or the batched form, as in PyTriton. Decorators that need the
model's configuration (`@fill_optionals`, `@pad_batch`, `@first_value`, `@triton_context`, list outputs)
read it from the model being served on the calling thread (backend.current_model).

The requests are the last positional argument, so the decorators work on methods too.
"""

from __future__ import annotations

import functools
import inspect
import itertools
import operator
from bisect import bisect_left
from collections.abc import Callable, Sequence
from typing import Any, Optional

import numpy as np

from .backend import current_model
from .exceptions import PyTritonBadParameterError, PyTritonRuntimeError, PyTritonValidationError
from .model_spec import BoundModel

TRITON_CONTEXT_FIELD_NAME = "triton_context"
_SPECIAL_KEYS = ("__triton_context__", TRITON_CONTEXT_FIELD_NAME)


class TritonContext:
    """What `@triton_context` passes: `model_config` of the model being served (and `model_configs`,
    keyed by the model name)."""

    def __init__(self, model: Optional[BoundModel]) -> None:
        self.model = model
        self.model_config = model.config if model is not None else None
        self.model_configs = {model.name: model.config} if model is not None else {}


def _model() -> BoundModel:
    model = current_model()
    if model is None:
        raise PyTritonRuntimeError("this decorator needs the model's configuration: call the function through "
                                   "Triton.bind()")
    return model


def _split(args: tuple) -> tuple[tuple, Any]:
    if not args:
        raise PyTritonValidationError("an inference callable takes the list of requests")
    return args[:-1], args[-1]


def batch_size(request: Any) -> int:
    first = next(iter(request.values()), None)
    return 0 if first is None else int(first.shape[0]) if first.ndim else 1


def convert_output(outputs: Any, model: Optional[BoundModel] = None) -> dict[str, Any]:
    """A dict as it is; a list/tuple mapped onto the model's outputs in order."""
    if isinstance(outputs, dict):
        return outputs
    if isinstance(outputs, (list, tuple)):
        model = model or _model()
        if len(outputs) != len(model.outputs):
            raise PyTritonValidationError("Outputs length different than config outputs length")
        return {str(t.name): o for t, o in zip(model.outputs, outputs)}
    raise PyTritonValidationError("Unsupported output type %s." % type(outputs).__name__)


def sample(func: Callable[..., Any]) -> Callable[..., Any]:
    """The first request's inputs as keyword arguments; the result is that request's outputs."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        head, requests = _split(args)
        outputs = func(*head, **{**kwargs, **requests[0]})
        if inspect.isgenerator(outputs):
            return ([convert_output(o)] for o in outputs)
        return [convert_output(outputs)]

    return wrapper


def batch(func: Callable[..., Any]) -> Callable[..., Any]:
    """Requests concatenated along axis 0 into keyword arguments; outputs split back per request."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        head, requests = _split(args)
        names = requests[0].keys()
        for other in requests[1:]:
            if other.keys() != names:
                raise PyTritonValidationError("Cannot batch requests with different set of inputs keys")
        inputs = {name: np.concatenate([r[name] for r in requests]) for name in names}
        outputs = func(*head, **{**kwargs, **inputs})
        sizes = [batch_size(r) for r in requests]

        def split(result: Any) -> list[dict[str, Any]]:
            result = convert_output(result)
            total = sum(sizes)
            wrong = {k: v.shape for k, v in result.items() if not v.ndim or v.shape[0] != total}
            if wrong:
                raise PyTritonValidationError(
                    "Received output tensors with different batch sizes: %s. Expected batch size: %d. "
                    % (", ".join("%s: %s" % kv for kv in wrong.items()), total))
            out, start = [], 0
            for size in sizes:
                out.append({k: v[start:start + size] for k, v in result.items()})
                start += size
            return out

        if inspect.isgenerator(outputs):
            return (split(o) for o in outputs)
        return split(outputs)

    return wrapper


def group_by_keys(func: Callable[..., Any]) -> Callable[..., Any]:
    """Calls `func` once per group of requests with the same input names; results in request order."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        head, requests = _split(args)
        indexed = sorted(((i, tuple(sorted(r.keys())), r) for i, r in enumerate(requests)),
                         key=operator.itemgetter(1))
        results: list[tuple[int, Any]] = []
        for _, group in itertools.groupby(indexed, key=operator.itemgetter(1)):
            members = list(group)
            out = func(*head, [r for _, _, r in members], **kwargs)
            results.extend(zip([i for i, _, _ in members], out))
        results.sort(key=operator.itemgetter(0))
        return [r for _, r in results]

    return wrapper


def _value_key(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        if value.dtype.kind in "OSU":
            return tuple(bytes(v) if isinstance(v, (bytes, np.bytes_)) else str(v).encode()
                         for v in value.reshape(-1)) + (value.shape,)
        return value.tobytes() + str(value.shape).encode()
    return value


def group_by_values(*keys: str, pad_fn: Optional[Callable[[Any], Any]] = None) -> Callable[..., Any]:
    """After `@batch`: calls `func` once per group of samples whose `keys` inputs are equal, then
    reassembles the outputs in sample order (`pad_fn` may pad the groups' outputs to one shape first)."""

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            inputs = {k: v for k, v in kwargs.items() if k not in _SPECIAL_KEYS}
            special = {k: v for k, v in kwargs.items() if k in _SPECIAL_KEYS}
            size = batch_size(inputs)
            order = sorted(range(size), key=lambda i: tuple(_value_key(inputs[k][i]) for k in keys)) \
                if all(k in inputs for k in keys) else list(range(size))
            groups: list[tuple[list[int], Any]] = []
            for _, grp in itertools.groupby(order, key=lambda i: tuple(_value_key(inputs[k][i]) for k in keys
                                                                        if k in inputs)):
                idx = list(grp)
                sub = {name: value[idx] for name, value in inputs.items()}
                groups.append((idx, func(*args, **sub, **special)))
            if pad_fn is not None:
                padded = pad_fn([g[1] for g in groups])
                groups = [(g[0], p) for g, p in zip(groups, padded)]
            first = groups[0][1]
            result = {name: np.zeros((size,) + data.shape[1:], dtype=data.dtype) for name, data in first.items()}
            for idx, out in groups:
                for name, data in out.items():
                    result[name][idx, ...] = data
            return result

        return wrapper

    return decorate


class ConstantPadder:
    """`pad_fn` for `@group_by_values`: pads every group's outputs to the largest shape with `pad_value`."""

    def __init__(self, pad_value: Any = 0) -> None:
        self.pad_value = pad_value

    def __call__(self, batches: Sequence[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
        names = list(dict.fromkeys(n for b in batches for n in b))
        out: list[dict[str, np.ndarray]] = [dict(b) for b in batches]
        for name in names:
            arrays = [b[name] for b in batches if name in b]
            kinds = {a.dtype.kind for a in arrays}
            if len(kinds) > 1 or (kinds <= set("biuf") and len({a.dtype for a in arrays}) > 1):
                raise PyTritonRuntimeError("All input arrays for given input name must have the same dtype.")
            target = tuple(np.max([a.shape[1:] for a in arrays], axis=0)) if arrays[0].ndim > 1 else ()
            dtype = max((a.dtype for a in arrays), key=lambda d: d.itemsize)
            for b in out:
                if name in b:
                    a = b[name]
                    pad = [(0, 0)] + [(0, t - s) for s, t in zip(a.shape[1:], target)]
                    value = b"" if dtype.kind in "SUO" else self.pad_value
                    b[name] = np.pad(a, pad, mode="constant", constant_values=value).astype(dtype)
        return out


def fill_optionals(**defaults: np.ndarray) -> Callable[..., Any]:
    """Adds missing inputs with default values (numpy arrays without the batch axis, tiled per request)."""
    bad = sorted(k for k, v in defaults.items() if not isinstance(v, np.ndarray))
    if bad:
        raise PyTritonBadParameterError("Could not use %s defaults as they are not NumPy arrays" % ", ".join(bad))

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            model = _model()
            declared = {str(t.name): t for t in model.inputs}
            unknown = sorted(set(defaults) - set(declared))
            if unknown:
                raise PyTritonBadParameterError("Could not found %s inputs" % ", ".join(unknown))
            for name, value in defaults.items():
                if np.dtype(value.dtype) != np.dtype(declared[name].dtype):
                    raise PyTritonBadParameterError(
                        "Could not use %s: dtype=%s expected_dtype=%s defaults as they have different than input "
                        "signature dtypes" % (name, value.dtype, np.dtype(declared[name].dtype)))
            _, requests = _split(args)
            for request in requests:
                size = batch_size(request) if model.config.batching else None
                for name, value in defaults.items():
                    if name in request:
                        continue
                    request[name] = np.tile(value, (size,) + (1,) * value.ndim) if size is not None else value
            return func(*args, **kwargs)

        return wrapper

    return decorate


def triton_context(func: Callable[..., Any]) -> Callable[..., Any]:
    """Passes `triton_context=TritonContext(...)` (the served model's configuration)."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        kwargs[TRITON_CONTEXT_FIELD_NAME] = TritonContext(current_model())
        return func(*args, **kwargs)

    return wrapper


def pad_batch(func: Callable[..., Any]) -> Callable[..., Any]:
    """After `@batch`: repeats the last row of every input up to the next preferred batch size (or the
    max batch size)."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        inputs = {k: v for k, v in kwargs.items() if k not in _SPECIAL_KEYS}
        if not inputs:
            return func(*args, **kwargs)
        config = _model().config
        sizes = sorted(config.batcher.preferred_batch_size or []) if config.batcher is not None else []
        sizes.append(config.max_batch_size)
        current = next(iter(inputs.values())).shape[0]
        target = sizes[min(bisect_left(sizes, current), len(sizes) - 1)]
        for name, array in inputs.items():
            extra = max(0, target - array.shape[0])
            if extra and array.shape[0]:
                kwargs[name] = np.concatenate([array, np.repeat(array[-1:], extra, axis=0)])
        return func(*args, **kwargs)

    return wrapper


def first_value(*keys: str, squeeze_single_values: bool = True, strict: bool = True) -> Callable[..., Any]:
    """Replaces the `keys` inputs by their first element (all elements must be equal when `strict`); a
    single-value array becomes a scalar when `squeeze_single_values`. Works on `@batch` keyword arguments
    or on the list of requests."""
    reserved = [k for k in keys if k in _SPECIAL_KEYS]
    if reserved:
        raise PyTritonBadParameterError("The keys %s are not allowed as keys for @first_value wrapper."
                                        % ", ".join(reserved))

    def first(name: str, value: np.ndarray) -> Any:
        if strict and value.size and not np.all(value == value[0:1]):
            raise PyTritonRuntimeError("The values on the %r input are not equal. To proceed, either disable strict "
                                       "mode in @first_value wrapper or ensure that the values always are consistent."
                                       % name)
        head = value[0]
        if squeeze_single_values and np.size(head) == 1:
            return np.asarray(head).reshape(()).item() if not isinstance(head, (bytes, np.bytes_)) else head
        return head

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            model = current_model()
            if model is not None and not model.config.batching:
                raise PyTritonRuntimeError("The @first_value decorator can only be used with models that support "
                                           "batching.")
            if args and isinstance(args[-1], (list, tuple)) and args[-1] and hasattr(args[-1][0], "keys"):
                for request in args[-1]:
                    for key in keys:
                        if key in request:
                            request[key] = first(key, request[key])
                return func(*args, **kwargs)
            for key in keys:
                if key in kwargs:
                    kwargs[key] = first(key, kwargs[key])
            return func(*args, **kwargs)

        return wrapper

    return decorate
