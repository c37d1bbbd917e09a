"""Clocks: where the engine's timestamps come from (seconds).

- ``WallClock``: real time (``time.perf_counter``) since the clock was made; used with ``TorchExecutor``,
  whose steps really take their time.
- ``VirtualClock``: simulated time; each step advances it by the ``duration_s`` the executor reports
  (a cost model), so an H100-scale run takes milliseconds of real time.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Seconds since the clock's origin."""

    def advance(self, duration_s: float) -> None:
        """Account for a step that took ``duration_s`` (a no-op for wall time, which moved by itself)."""

    def wait_until(self, t_s: float) -> None:
        """Idle until time ``t_s`` (the next arrival)."""


class WallClock:
    """Real time since construction (or the last ``reset``)."""

    def __init__(self) -> None:
        self._origin = time.perf_counter()

    def reset(self) -> None:
        self._origin = time.perf_counter()

    def now(self) -> float:
        return time.perf_counter() - self._origin

    def advance(self, duration_s: float) -> None:
        pass

    def wait_until(self, t_s: float) -> None:
        delay = t_s - self.now()
        if delay > 0:
            time.sleep(delay)


class VirtualClock:
    """Simulated time, starting at ``start_s``; moves only when told to."""

    def __init__(self, start_s: float = 0.0) -> None:
        self._t = float(start_s)

    def now(self) -> float:
        return self._t

    def advance(self, duration_s: float) -> None:
        if duration_s < 0:
            raise ValueError(f"duration_s must be >= 0, got {duration_s}")
        self._t += float(duration_s)

    def wait_until(self, t_s: float) -> None:
        self._t = max(self._t, float(t_s))
