"""When a replay submits its requests: a closed loop, Poisson arrivals, or the trace's own timestamps.

One module owns admission so that every engine serving a trace (the replay worker, the in-process
engine of :mod:`marconi.integrations.vllm.offline`) submits by the same rule, step for step: a
difference in hits is then the engines', never the load's. Standard library and numpy only, so it
imports in both environments. The modes are :data:`ARRIVALS` (docs/vllm.md, "The replay"); in every
mode a turn is submitted only after its session predecessor finishes (its prompt holds that output).
"""

from __future__ import annotations

from collections import deque
from typing import Hashable, Sequence

__all__ = ["ARRIVALS", "Admitter", "poisson_times", "trace_times", "predecessors", "make_admitter"]

ARRIVALS = ("closed-loop", "poisson", "trace")


def poisson_times(num: int, rate: float, seed: int) -> list[float]:
    """Arrival times (seconds) of ``num`` requests at ``rate`` per second, seeded: the replay's
    draws since it had a ``--rate`` (numpy's ``default_rng(seed)``), so results stay comparable."""
    import numpy as np

    return np.cumsum(np.random.default_rng(seed).exponential(1.0 / rate, size=num)).tolist()


def trace_times(ts: Sequence[float], time_scale: float = 1.0) -> list[float]:
    """The trace's timestamps shifted so the earliest is 0 and multiplied by ``time_scale``."""
    if not ts:
        return []
    first = min(ts)
    return [(float(t) - first) * time_scale for t in ts]


def predecessors(sessions: Sequence[Hashable]) -> list[int | None]:
    """For each request, the index of the previous request of its session (None: its first turn)."""
    prev_of: list[int | None] = []
    last_in_session: dict[Hashable, int] = {}
    for i, s in enumerate(sessions):
        prev_of.append(last_in_session.get(s))
        last_in_session[s] = i
    return prev_of


class Admitter:
    """Decides, between engine steps, which requests to submit: ``for i in admitter.admit(clock):
    submit(i)``, step, ``admitter.finish(i)`` per finished request; with nothing in flight, jump the
    clock to :meth:`next_arrival`. ``concurrency`` caps admitted-and-unfinished requests (None: no
    cap); ``times`` are the arrivals (None: all due at once; ties keep trace order).
    """

    def __init__(self, sessions: Sequence[Hashable], *, concurrency: int | None = None,
                 times: Sequence[float] | None = None) -> None:
        if concurrency is not None and concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        if times is not None and len(times) != len(sessions):
            raise ValueError(f"{len(times)} arrival times for {len(sessions)} requests")
        self.num = len(sessions)
        self.prev_of = predecessors(sessions)
        self.cap = concurrency if concurrency is not None else self.num
        self.times = list(times) if times is not None else None
        self.order = (sorted(range(self.num), key=lambda i: (self.times[i], i)) if self.times is not None
                      else list(range(self.num)))
        self.done = [False] * self.num
        self.waiting_on_prev: deque[int] = deque()       # admitted (a slot taken), predecessor unfinished
        self.next_k = 0                                  # position in ``order`` of the next request due
        self.num_admitted = 0
        self.num_done = 0

    def _ready(self, i: int) -> bool:
        p = self.prev_of[i]
        return p is None or self.done[p]

    def admit(self, clock: float = 0.0) -> list[int]:
        """The requests to submit now, in order: waiting turns whose predecessor finished, then
        newly due requests while a slot is free (those still behind a predecessor take a slot and wait)."""
        out = [i for i in self.waiting_on_prev if self._ready(i)]
        for i in out:
            self.waiting_on_prev.remove(i)
        while (self.next_k < self.num and self.num_admitted - self.num_done < self.cap
               and (self.times is None or self.times[self.order[self.next_k]] <= clock)):
            i = self.order[self.next_k]
            self.next_k += 1
            self.num_admitted += 1
            if self._ready(i):
                out.append(i)
            else:
                self.waiting_on_prev.append(i)
        return out

    def finish(self, i: int) -> None:
        """Request ``i`` finished: its slot frees and its session's next turn may go."""
        if self.done[i]:
            raise ValueError(f"request {i} finished twice")
        self.done[i] = True
        self.num_done += 1

    def next_arrival(self) -> float | None:
        """When the next request not yet admitted arrives (None: all admitted, or closed loop)."""
        if self.times is None or self.next_k >= self.num:
            return None
        return self.times[self.order[self.next_k]]

    @property
    def finished(self) -> bool:
        return self.num_done >= self.num


def make_admitter(sessions: Sequence[Hashable], arrivals: str, *, concurrency: int | None = None,
                  rate: float | None = None, ts: Sequence[float] | None = None, time_scale: float = 1.0,
                  seed: int = 0) -> Admitter:
    """The admitter for ``arrivals`` (one of :data:`ARRIVALS`) from the options that mode reads.

    Raises:
        ValueError: an unknown mode, or the mode's option missing or out of range.
    """
    if arrivals == "closed-loop":
        if concurrency is None:
            raise ValueError("closed-loop arrivals need a concurrency")
        return Admitter(sessions, concurrency=concurrency)
    if arrivals == "poisson":
        if rate is None or not rate > 0:
            raise ValueError(f"poisson arrivals need a rate > 0, got {rate!r}")
        return Admitter(sessions, times=poisson_times(len(sessions), rate, seed))
    if arrivals == "trace":
        if ts is None or len(ts) != len(sessions):
            raise ValueError("trace arrivals need one timestamp per request")
        if not time_scale >= 0:
            raise ValueError(f"time_scale must be >= 0 (0: all at once), got {time_scale!r}")
        return Admitter(sessions, times=trace_times(ts, time_scale))
    raise ValueError(f"unknown arrivals {arrivals!r}; known: {', '.join(ARRIVALS)}")
