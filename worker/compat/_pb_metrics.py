"""pb_utils.MetricFamily and Metric: custom metrics exported on the server's /metrics
(worker/metric_registry.py holds them and reports each change to the supervisor)."""

from __future__ import annotations

import weakref
from typing import Optional

from .. import metric_registry as _custom
from .. import pb_args as _args
from ._pb_base import TritonModelException


class Metric:
    """One metric of a family (one label set); made by `MetricFamily.Metric(labels, buckets)`."""

    def __init__(self, state: _custom.MetricState) -> None:
        self._state = state

    def increment(self, value: float) -> None:
        try:
            _custom.REGISTRY.increment(self._state, value)
        except _custom.MetricError as exc:
            raise TritonModelException(str(exc)) from None
        _custom.REGISTRY.applied()

    def set(self, value: float) -> None:
        try:
            _custom.REGISTRY.set(self._state, value)
        except _custom.MetricError as exc:
            raise TritonModelException(str(exc)) from None
        _custom.REGISTRY.applied()

    def observe(self, value: float) -> None:
        try:
            _custom.REGISTRY.observe(self._state, value)
        except _custom.MetricError as exc:
            raise TritonModelException(str(exc)) from None
        _custom.REGISTRY.applied()

    def value(self) -> float:
        """This instance's own value (in Triton, the value summed over every instance sharing the metric)."""
        try:
            return _custom.REGISTRY.value(self._state)
        except _custom.MetricError as exc:
            raise TritonModelException(str(exc)) from None


class MetricFamily:
    """A custom metric family, exported on the server's /metrics under `name` while this object lives."""

    COUNTER = _custom.rules.COUNTER
    GAUGE = _custom.rules.GAUGE
    HISTOGRAM = _custom.rules.HISTOGRAM

    def __init__(self, name: str, description: str, kind: int) -> None:
        # bytes as Triton's std::string reads them; other types are refused below, naming the argument
        if isinstance(name, (bytes, bytearray)):
            name = _args.text(name, "name")
        if isinstance(description, (bytes, bytearray)):
            description = _args.text(description, "description")
        if type(kind) is not int or kind not in _custom.rules.KIND_NAMES:
            raise TypeError("MetricFamily(): kind must be MetricFamily.COUNTER, GAUGE or HISTOGRAM, not %r"
                            % (kind,))
        try:
            self._state = _custom.REGISTRY.add_family(name, description, kind)
        except _custom.MetricError as exc:
            raise TritonModelException(str(exc)) from None
        self.name = name
        self.description = description
        self.kind = kind
        weakref.finalize(self, _custom.REGISTRY.drop_family, self._state.fid)
        _custom.REGISTRY.applied()

    def Metric(  # noqa: N802 - Triton's method name
        self, labels: Optional[dict[str, str]] = None, buckets: Optional[list[float]] = None
    ) -> Metric:
        try:
            metric = Metric(_custom.REGISTRY.add_metric(self._state, labels, buckets))
        except _custom.MetricError as exc:
            raise TritonModelException(str(exc)) from None
        _custom.REGISTRY.applied()
        return metric

