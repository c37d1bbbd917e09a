"""Watch a server's ``GET /metrics`` while a benchmark runs: the peak of its gauges, the change in its
counters.

``MetricsWatch(base_url, every_s=0.05)`` is a context manager that scrapes in a background thread and keeps,
for every sample, its largest value (``peak``) and its first and last values (``delta``). Names are matched
after the engine's namespace, so ``watch.peak("num_requests_running")`` reads ``vllm:num_requests_running``
on our server as on vLLM's (any namespace). Parsing is prometheus_client's
(``longctx.serve.prometheus.parse_metrics``); no torch, no engine.
"""

from __future__ import annotations

import threading

from longctx.serve.prometheus import read_metrics


class MetricsWatch:
    """Scrape ``{base_url}/metrics`` every ``every_s`` seconds between ``__enter__`` and ``__exit__``."""

    def __init__(self, base_url: str, every_s: float = 0.05) -> None:
        if not every_s > 0:
            raise ValueError(f"every_s must be > 0, got {every_s!r}")
        self.base_url, self.every_s = base_url, float(every_s)
        self.first: dict[str, float] = {}
        self.last: dict[str, float] = {}
        self.max: dict[str, float] = {}
        self.num_scrapes = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def scrape(self) -> None:
        sample = read_metrics(self.base_url)
        if not self.first:
            self.first = dict(sample)
        self.last = sample
        for name, value in sample.items():
            self.max[name] = max(value, self.max.get(name, value))
        self.num_scrapes += 1

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.scrape()
            except OSError:
                pass  # a scrape that fails (server busy) is skipped; the next one counts
            self._stop.wait(self.every_s)

    def __enter__(self) -> MetricsWatch:
        self.scrape()  # the counters' starting values, before any request is sent
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.scrape()  # the counters' final values

    def _name(self, suffix: str) -> str:
        hits = [n for n in self.last if n.split(":", 1)[-1] == suffix]
        if len(hits) != 1:
            raise KeyError(f"no single metric named *:{suffix} (found {hits or 'none'})")
        return hits[0]

    def peak(self, suffix: str) -> float:
        """The largest value a sample named ``*:suffix`` took in any scrape."""
        return self.max[self._name(suffix)]

    def delta(self, suffix: str) -> float:
        """Last minus first scrape of ``*:suffix`` (a counter's increase over the watch)."""
        name = self._name(suffix)
        return self.last[name] - self.first.get(name, 0.0)
