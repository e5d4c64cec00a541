"""Triton's rate limiter (`--rate-limit=execution_count`, docs/rate-limiter.md): one per server, shared by
the schedulers of every model.

An instance whose group has a `rate_limiter` executes only once it holds every resource the group lists,
and holds them until that execution is answered. Resources are counted per device (a CPU instance is on
device 0, as in Triton) unless `global`. How many of each there are: the count given by
`--rate-limit-resource=<name>:<count>[:<device>]`, else the largest any loaded instance asks. With any
`--rate-limit-resource` given, a resource it does not name has none, so an instance asking for one cannot
load (Triton's message); nor can one that makes a resource both global and per-device.

Instances waiting for their resources ("staged") are granted in order of `executions x priority` (a
priority of 0 counts as 1), so an instance of priority 2 gets half the turns of one of priority 1 while
both wait; ties go to the one staged first. An instance that cannot get its resources yet keeps later
ones that need any of the same resources waiting (a big request is not starved by small ones), as Triton
does; instances needing only other resources go on.

Grants are made once the event loop's current pass is over (a scheduler releasing resources stages its
next batch first, so it competes with the others as Triton's instances do) and are handed to the
scheduler by the callback it staged with; the scheduler forms its batch then, so requests arriving while
it waited join it. Groups without `rate_limiter` are never registered here: nothing limits them.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from inferd.worker.wire.errors import ErrorCode, InferdError

log = logging.getLogger("inferd.scheduler.rate_limiter")

GLOBAL = -1  # the device key of global resources
MODES = ("execution_count", "off")

# a ticket's states
IDLE, STAGED, GRANTED, REMOVED = "idle", "staged", "granted", "removed"


@dataclass(frozen=True)
class Resource:
    name: str
    count: int
    is_global: bool = False


@dataclass(frozen=True)
class LimiterSpec:
    """An instance group's `rate_limiter`."""

    resources: tuple[Resource, ...] = ()
    priority: int = 0

    @classmethod
    def from_config(cls, rate_limiter: Mapping[str, Any]) -> LimiterSpec:
        """From the group's `rate_limiter` in the model config's JSON rendering."""
        resources = tuple(Resource(str(r.get("name", "")), int(r.get("count") or 0), bool(r.get("global")))
                          for r in rate_limiter.get("resources") or ())
        return cls(resources, int(rate_limiter.get("priority") or 0))


@dataclass(frozen=True)
class ExplicitResource:
    """One `--rate-limit-resource`; device None: every device."""

    name: str
    count: int
    device: int | None = None


def parse_resource_flag(text: str) -> ExplicitResource:
    """`<name>:<count>[:<device>]` as tritonserver reads it; ValueError with its message (and ours for a
    count or device that is not a number)."""
    usage = ("--rate-limit-resource option format is '<resource_name>:<count>:<device>' or "
             "'<resource_name>:<count>'. Got " + text)
    parts = text.split(":")
    if len(parts) not in (2, 3):
        raise ValueError(usage)
    numbers = []
    for what, value in zip(("count", "device"), parts[1:]):
        try:
            number = int(value.strip())
        except ValueError:
            raise ValueError(f"{usage} ({what} {value!r} is not an integer)") from None
        if number < 0:
            raise ValueError(f"{usage} ({what} must not be negative)")
        numbers.append(number)
    return ExplicitResource(parts[0], numbers[0], numbers[1] if len(numbers) == 2 else None)


class Ticket:
    """One registered instance: where it runs, what it needs, how often it executed, and whether it waits
    for (STAGED) or holds (GRANTED) its resources."""

    __slots__ = ("owner", "device", "needs", "priority", "executions", "state", "order", "on_grant")

    def __init__(self, owner: str, device: int, spec: LimiterSpec) -> None:
        self.owner = owner  # for messages and logs: "<model> <instance>"
        self.device = device
        self.needs: dict[tuple[int, str], int] = {}
        for r in spec.resources:
            key = (GLOBAL if r.is_global else device, r.name)
            self.needs[key] = r.count  # a name listed twice: the last one counts, as in Triton
        self.priority = max(1, spec.priority)
        self.executions = 0
        self.state = IDLE
        self.order = 0  # when it was staged: ties in score go to the earliest
        self.on_grant: Callable[[Ticket], None] | None = None

    @property
    def score(self) -> int:
        """Lower goes first (Triton's scaled priority)."""
        return self.executions * self.priority

    def __repr__(self) -> str:
        return f"Ticket({self.owner!r}, device={self.device}, {self.state}, executions={self.executions})"


class RateLimiter:
    def __init__(self, explicit: Iterable[ExplicitResource] = ()) -> None:
        self.explicit = tuple(explicit)
        self._tickets: list[Ticket] = []
        self.limits: dict[tuple[int, str], int] = {}  # (device or GLOBAL, name) -> copies
        self.held: dict[tuple[int, str], int] = {}  # copies granted now
        self._staged: list[Ticket] = []
        self._orders = itertools.count()
        self._pass_due = False

    # ---- instances come and go ----
    def register(self, owner: str, placements: Sequence[tuple[str, int, LimiterSpec]]) -> list[Ticket]:
        """Tickets for one model version's limited instances, (instance name, device, spec) each. Raises
        InferdError (INVALID_ARG, Triton's message) when the resources they ask cannot all be had; then
        none of them is registered."""
        tickets = [Ticket(f"{owner} {name}", device, spec) for name, device, spec in placements]
        limits = self._limits_for(self._tickets + tickets)
        self._tickets.extend(tickets)
        self.limits = limits
        log.debug("rate limiter: %s registered %d instance(s); resources: %s", owner, len(tickets), self.describe())
        return tickets

    def unregister(self, tickets: Iterable[Ticket]) -> None:
        """The instances are gone: what they hold is free, what they waited for is withdrawn, and the
        default counts are those of the instances left."""
        for t in tickets:
            if t.state == REMOVED:
                continue
            if t.state == GRANTED:
                self._free(t)
            elif t.state == STAGED:
                self._staged.remove(t)
            t.state = REMOVED
            t.on_grant = None
            self._tickets.remove(t)
        try:
            self.limits = self._limits_for(self._tickets)
        except InferdError as exc:  # (fewer instances never ask for more than before)
            log.error("rate limiter: %s", exc.message)
        self._schedule_pass()

    def _limits_for(self, tickets: Sequence[Ticket]) -> dict[tuple[int, str], int]:
        """Copies of each resource: the largest any instance asks, or the explicit count (checked)."""
        wanted: dict[tuple[int, str], int] = {}
        for t in tickets:
            for key, count in t.needs.items():
                if count > wanted.get(key, -1):
                    wanted[key] = count
        limits = dict(wanted)
        if self.explicit:
            for (device, name), needed in sorted(wanted.items()):
                available = self._explicit_count(device, name)
                if available < needed:
                    raise InferdError(ErrorCode.INVALID_ARG,
                                      f'Resource count for "{name}" is limited to {available} which will prevent '
                                      "scheduling of one or more model instances, the minimum required count is "
                                      f"{needed}")
                limits[(device, name)] = available
        global_names = {name for device, name in wanted if device == GLOBAL}
        for device, name in sorted(wanted):
            if device != GLOBAL and name in global_names:
                raise InferdError(ErrorCode.INVALID_ARG,
                                  f'Resource "{name}" is present as both global and device-specific resource in the '
                                  "model configuration.")
        return limits

    def _explicit_count(self, device: int, name: str) -> int:
        """The copies --rate-limit-resource gives (0 when it does not name the resource). A global resource
        takes the largest count given for the name, whatever the device."""
        counts = [r.count for r in self.explicit
                  if r.name == name and (device == GLOBAL or r.device is None or r.device == device)]
        return max(counts, default=0)

    # ---- executions ----
    def request(self, ticket: Ticket, on_grant: Callable[[Ticket], None]) -> None:
        """Wait for the ticket's resources: `on_grant(ticket)` is called once they are held (never within
        this call). The ticket must be idle."""
        if ticket.state != IDLE:
            raise RuntimeError(f"rate limiter: {ticket!r} asked for its resources twice")
        ticket.state = STAGED
        ticket.on_grant = on_grant
        ticket.order = next(self._orders)
        self._staged.append(ticket)
        self._schedule_pass()

    def withdraw(self, ticket: Ticket) -> None:
        """No longer wait (the instance went down, the scheduler closes). Nothing if it was not waiting."""
        if ticket.state == STAGED:
            self._staged.remove(ticket)
            ticket.state = IDLE
            ticket.on_grant = None

    def release(self, ticket: Ticket, executed: bool = True) -> None:
        """The execution is over (`executed`; else the grant went unused): its resources are free."""
        if ticket.state != GRANTED:
            return  # unregistered meanwhile
        self._free(ticket)
        ticket.state = IDLE
        ticket.on_grant = None
        if executed:
            ticket.executions += 1
        self._schedule_pass()

    def _free(self, ticket: Ticket) -> None:
        held = self.held
        for key, count in ticket.needs.items():
            held[key] -= count

    def _schedule_pass(self) -> None:
        if not self._pass_due and self._staged:
            self._pass_due = True
            asyncio.get_running_loop().call_soon(self._grant_pass)

    def _grant_pass(self) -> None:
        """Grant the waiting tickets that fit, best score first; one that does not fit holds back the later
        ones that need any of the same resources."""
        self._pass_due = False
        blocked: set[tuple[int, str]] = set()
        for t in sorted(self._staged, key=lambda t: (t.score, t.order)):
            if t.state != STAGED:  # withdrawn by an earlier grant's callback
                continue
            if any(key in blocked for key in t.needs):
                continue
            if not self._fits(t):
                blocked.update(t.needs)
                continue
            for key, count in t.needs.items():
                self.held[key] = self.held.get(key, 0) + count
            self._staged.remove(t)
            t.state = GRANTED
            on_grant, t.on_grant = t.on_grant, None
            try:
                if on_grant is not None:
                    on_grant(t)
            except Exception:
                log.exception("rate limiter: the grant callback of %s failed", t.owner)
                self.release(t, executed=False)

    def _fits(self, ticket: Ticket) -> bool:
        held, limits = self.held, self.limits
        return all(held.get(key, 0) + count <= limits.get(key, 0) for key, count in ticket.needs.items())

    # ---- introspection ----
    def describe(self) -> dict[str, Any]:
        """The resources, their copies and what is held now (logged at start, read by tests)."""
        out: dict[str, Any] = {}
        for (device, name), copies in sorted(self.limits.items()):
            where = "global" if device == GLOBAL else f"device {device}"
            out.setdefault(where, {})[name] = {"count": copies, "held": self.held.get((device, name), 0)}
        return out
