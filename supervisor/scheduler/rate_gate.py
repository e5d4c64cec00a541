"""One model version's side of the rate limiter (rate_limiter.py): which of its instances are limited and
whether one holds a grant.

The default scheduler and the dynamic batcher (callback-driven) keep their unlimited instances as before
and give a limited one a batch only while it holds a grant: with work waiting and no instance able to take
it, `stage` has the idle limited instance with the best score wait for its resources (one at a time per
model; once granted and launched, the next one may wait). The grant calls the scheduler back (`bind`);
the scheduler `take`s it and launches a batch formed then, and calls `executed` when that batch is
answered. A grant the scheduler did not take within that call is given back unused. The sequence
batcher's runners, one per instance, `acquire` instead and `release` after their batch.

A limited instance runs one batch at a time, holding its resources for that batch only: inferd's worker
pipelining (batches sent ahead) does not apply to it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence

from .base import Executor
from .rate_limiter import IDLE, RateLimiter, Ticket


class RateGate:
    def __init__(self, limiter: RateLimiter, tickets: Sequence[tuple[Executor, Ticket]]) -> None:
        self.limiter = limiter
        self.limited = [e for e, _ in tickets]
        self.tickets = [t for _, t in tickets]
        self._ticket = {id(e): t for e, t in tickets}
        self._granted: list[Executor] = []  # hold a grant, no batch launched yet (within the grant's call)
        self._staged: Executor | None = None  # waits for its resources
        self._wake: Callable[[], None] = _nothing

    def bind(self, wake: Callable[[], None]) -> None:
        """`wake()` is called when a grant arrives: the scheduler takes it within that call, or loses it."""
        self._wake = wake

    def unlimited(self, executors: Sequence[Executor]) -> list[Executor]:
        return [e for e in executors if id(e) not in self._ticket]

    def is_limited(self, executor: Executor) -> bool:
        return id(executor) in self._ticket

    @property
    def waiting(self) -> bool:
        """An instance waits for its resources."""
        return self._staged is not None

    # ---- callback-driven schedulers ----
    def take(self) -> Executor | None:
        """A ready instance holding a grant: its batch must be launched now (`launching`)."""
        while self._granted:
            executor = self._granted[-1]
            if executor.ready:
                return executor
            self._granted.pop()
            self.limiter.release(self._ticket[id(executor)], executed=False)
        return None

    def launching(self, executor: Executor) -> None:
        """A batch goes to the instance: the grant `take` gave is in use until `executed`."""
        if executor in self._granted:
            self._granted.remove(executor)

    def stage(self, held: Mapping[int, int]) -> None:
        """Work waits that no instance can take: the idle ready limited instance (no batch in `held`) with
        the best score waits for its resources, unless one waits already."""
        if self._staged is not None:
            return
        best: Executor | None = None
        best_score = 0
        for executor in self.limited:
            ticket = self._ticket[id(executor)]
            if (ticket.state == IDLE and executor.ready and not held.get(id(executor))
                    and (best is None or ticket.score < best_score)):
                best, best_score = executor, ticket.score
        if best is not None:
            self._staged = best
            self.limiter.request(self._ticket[id(best)], self._on_grant)

    def unstage(self) -> None:
        """No work left for the instance waiting: it stops waiting (and holds back nobody)."""
        staged, self._staged = self._staged, None
        if staged is not None:
            self.limiter.withdraw(self._ticket[id(staged)])

    def _on_grant(self, ticket: Ticket) -> None:
        executor, self._staged = self._staged, None
        if executor is None or self._ticket.get(id(executor)) is not ticket:
            self.limiter.release(ticket, executed=False)
            return
        self._granted.append(executor)
        try:
            self._wake()
        finally:
            while self._granted:  # not taken: the queue emptied meanwhile, or the scheduler closed
                self.limiter.release(self._ticket[id(self._granted.pop())], executed=False)

    def executed(self, executor: Executor) -> None:
        """The batch of a limited instance is answered: its resources are free."""
        ticket = self._ticket.get(id(executor))
        if ticket is not None:
            self.limiter.release(ticket)

    def instance_changed(self, executor: Executor) -> None:
        if self._staged is executor and not executor.ready:
            self.unstage()

    def close(self) -> None:
        self.unstage()

    # ---- runner-driven schedulers (the sequence batcher) ----
    async def acquire(self, executor: Executor) -> None:
        """Wait until the instance holds its resources; `release` it after the batch. Cancelling the wait
        withdraws it (or gives back a grant that came meanwhile)."""
        ticket = self._ticket[id(executor)]
        granted: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def on_grant(_: Ticket) -> None:
            if granted.done():  # the waiter was cancelled as the grant came
                self.limiter.release(ticket, executed=False)
            else:
                granted.set_result(None)

        self.limiter.request(ticket, on_grant)
        try:
            await granted
        except BaseException:
            self.limiter.withdraw(ticket)
            if granted.done() and not granted.cancelled():
                self.limiter.release(ticket, executed=False)
            raise

    def release(self, executor: Executor, executed: bool = True) -> None:
        self.limiter.release(self._ticket[id(executor)], executed)


def _nothing() -> None:
    pass
