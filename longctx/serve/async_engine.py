"""``AsyncEngine``: one engine loop in a background thread, many asyncio clients.

The HTTP handlers (asyncio, uvicorn's event loop) never touch the engine. They hand a request over through a
thread-safe command queue; the engine thread adds it at the next step boundary, steps the engine (continuous
batching: every running request advances in the same forward pass), and after each step pushes each
request's new tokens, with the engine's timestamps, onto that request's ``asyncio.Queue`` through
``loop.call_soon_threadsafe``. Aborts (a client that went away, a stop string) travel the same command
queue, so only the engine thread ever mutates the engine. torch releases the GIL while it computes, so the
event loop keeps accepting connections and streaming tokens while a step runs.

Events on ``RequestHandle.events``: ``("prompt_logprobs", [TokenLogprob, ...])`` (when the request's
``SamplingParams.prompt_logprobs`` is set; may come in several parts while a prompt is prefilled in chunks),
``("tokens", [(token_id, time_s, TokenLogprob | None), ...])`` (the record when ``logprobs`` is set), then
``("finish", reason)`` (``"stop"``: EOS, ``"length"``: max_tokens, ``"abort"``) or ``("error", message)``.

What vLLM's metrics observe (``observer``, e.g. ``longctx.serve.prometheus.RequestObserver``): time to first
token from the request's arrival at the engine, inter-token gaps between consecutive tokens, each finished
request (``finished(seq, reason, end_s)``; a request stopped by a stop string ends normally with "stop", one
whose client left with "abort") and the tokens of each step, all on the engine's clock.
"""

from __future__ import annotations

import asyncio
import itertools
import queue
import threading
from dataclasses import dataclass

from longctx.engine.sampling_params import SamplingParams
from longctx.engine.sequence import SequenceStatus


@dataclass(eq=False)
class RequestHandle:
    """One request in flight: its prompt, limits, sampling parameters and event queue."""

    prompt_token_ids: list[int]
    max_tokens: int
    sampling: SamplingParams | None  # None: greedy
    events: asyncio.Queue
    ignore_eos: bool = False
    request_id: int = 0
    seq: object | None = None  # the engine's Sequence once added (engine thread writes it once)
    num_sent: int = 0  # output tokens already pushed (engine thread only)
    done: bool = False
    aborted: bool = False
    stopped: bool = False  # aborted by the server because a stop string (or stop token) ended it

    @property
    def is_waiting(self) -> bool:
        """Not yet holding KV blocks: still in the command queue or in the engine's waiting queue."""
        if self.done:
            return False
        return self.seq is None or self.seq.status is SequenceStatus.WAITING


NO_TOKEN = -1  # the end-of-sequence id of a request that ignores EOS: no token has it


class AsyncEngine:
    """Runs ``engine`` in a daemon thread; ``submit`` / ``abort`` from the event loop.

    Args:
        engine: a ``longctx.engine.Engine`` (its executor samples each request's tokens with the
            ``SamplingParams`` given to ``submit``, carried on the sequence).
        max_waiting: requests allowed to wait for KV blocks at once; beyond it ``submit`` raises
            ``Overloaded`` (the server answers 503). None: no limit (vLLM queues every request).
        history_len: step records kept in ``engine.history`` (the loop trims older ones).
        observer: gets ``first_token(s)``, ``inter_token(s)``, ``finished(seq, reason, end_s)`` and
            ``step(num_tokens)`` (None: nobody).
    """

    def __init__(self, engine, max_waiting: int | None = None, history_len: int = 10_000,
                 observer=None) -> None:
        if max_waiting is not None and max_waiting < 0:
            raise ValueError(f"max_waiting must be >= 0 or None, got {max_waiting}")
        self.engine = engine
        self.max_waiting = None if max_waiting is None else int(max_waiting)
        self.history_len = int(history_len)
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._ids = itertools.count()
        self._handles: set[RequestHandle] = set()  # event-loop side view (for counts)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self.num_steps = 0
        self.loop_error: str | None = None
        self.observer = observer
        sampler = getattr(engine.executor, "sampler", None)
        self._logprobs = getattr(sampler, "logprobs", None)  # the executor's LogprobRecorder, if it has one

    @property
    def records_logprobs(self) -> bool:
        """True when the executor records log-probabilities (``TorchExecutor``; a cost model does not)."""
        return self._logprobs is not None

    # ---- lifecycle (event loop side) ----
    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name="longctx-engine", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    @property
    def healthy(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self.loop_error is None

    # ---- requests (event loop side) ----
    def num_waiting(self) -> int:
        return sum(h.is_waiting for h in self._handles)

    def submit(self, prompt_token_ids: list[int], max_tokens: int,
               sampling: SamplingParams | None = None, ignore_eos: bool = False) -> RequestHandle:
        """Queue a request; raises ``Overloaded`` when ``max_waiting`` requests already wait.
        ``ignore_eos``: generate ``max_tokens`` tokens whatever comes (the EOS token does not end it)."""
        if not self.healthy:
            raise Overloaded("the engine loop is not running")
        if self.max_waiting is not None and self.num_waiting() >= self.max_waiting:
            raise Overloaded(f"{self.max_waiting} requests already wait for KV cache blocks; retry later")
        handle = RequestHandle(list(prompt_token_ids), int(max_tokens), sampling, asyncio.Queue(),
                               bool(ignore_eos))
        handle.request_id = next(self._ids)
        self._handles.add(handle)
        self._commands.put(("add", handle))
        self._wake.set()
        return handle

    def abort(self, handle: RequestHandle, stopped: bool = False) -> None:
        """Stop a request (idempotent): the engine frees its KV blocks at the next step boundary.
        ``stopped``: a stop string ended it (its end-to-end latency counts; a client's
        disconnect does not)."""
        if not handle.aborted:
            handle.aborted, handle.stopped = True, bool(stopped)
            self._commands.put(("abort", handle))
            self._wake.set()

    def release(self, handle: RequestHandle) -> None:
        """The handler is done with ``handle`` (call once, in a ``finally``): aborts it if unfinished."""
        if not handle.done:
            self.abort(handle)
        self._handles.discard(handle)

    def stats(self) -> dict:
        """Pool and queue occupancy (plain data; read without locking, so approximate while stepping)."""
        bm = self.engine.block_manager
        return {
            "num_blocks": bm.num_blocks,
            "block_size": bm.block_size,
            "num_free_blocks": bm.num_free_blocks,
            "num_running": len(self.engine.running),
            "num_waiting": len(self.engine.waiting) + len(self.engine.pending),
            "num_in_flight": len(self._handles),
            "num_steps": self.num_steps,
        }

    # ---- the engine thread ----
    def _push(self, handle: RequestHandle, event: tuple) -> None:
        self._loop.call_soon_threadsafe(handle.events.put_nowait, event)

    def _apply_commands(self, live: dict[int, RequestHandle]) -> None:
        while True:
            try:
                kind, handle = self._commands.get_nowait()
            except queue.Empty:
                return
            if kind == "add":
                if handle.aborted:
                    handle.done = True
                    continue
                try:
                    seq = self.engine.add_request(handle.prompt_token_ids, handle.max_tokens,
                                                  sampling=handle.sampling,
                                                  eos_token_id=NO_TOKEN if handle.ignore_eos else None)
                except ValueError as exc:
                    handle.done = True
                    self._push(handle, ("error", str(exc)))
                    continue
                handle.seq = seq
                live[seq.seq_id] = handle
            elif kind == "abort" and handle.seq is not None and not handle.done:
                self.engine.abort(handle.seq.seq_id)  # frees its blocks; the executor forgets it
                live.pop(handle.seq.seq_id, None)
                handle.done = True
                self._forget_logprobs(handle.seq.seq_id)
                if self.observer is not None:  # a stop string ended it normally; a client leaving: an abort
                    self.observer.finished(handle.seq, "stop" if handle.stopped else "abort",
                                           self.engine.clock.now())
                self._push(handle, ("finish", "abort"))

    def _forget_logprobs(self, seq_id: int) -> None:
        if self._logprobs is not None:
            self._logprobs.forget(seq_id)

    def _observe(self, seq, start: int, stop: int) -> None:
        times = seq.token_times_s
        for i in range(start, stop):
            if i == 0:
                self.observer.first_token(times[0] - seq.arrival_s)
            else:
                self.observer.inter_token(times[i] - times[i - 1])

    def _deliver(self, live: dict[int, RequestHandle]) -> None:
        for seq_id, handle in list(live.items()):
            seq = handle.seq
            prompt, records = self._logprobs.take(seq_id) if self._logprobs is not None else ([], [])
            if prompt:
                self._push(handle, ("prompt_logprobs", prompt))
            n = len(seq.output_token_ids)
            if n > handle.num_sent:
                start = handle.num_sent
                recs = records if len(records) == n - start else [None] * (n - start)
                new = list(zip(seq.output_token_ids[start:n], seq.token_times_s[start:n], recs, strict=True))
                handle.num_sent = n
                if self.observer is not None:
                    self._observe(seq, start, n)
                self._push(handle, ("tokens", new))
            if seq.status is SequenceStatus.FINISHED:
                handle.done = True
                del live[seq_id]
                self._forget_logprobs(seq_id)
                if self.observer is not None:
                    self.observer.finished(seq, seq.finish_reason or "stop", seq.finished_s)
                self._push(handle, ("finish", seq.finish_reason or "stop"))

    def _run(self) -> None:
        live: dict[int, RequestHandle] = {}
        engine = self.engine
        try:
            while not self._stop.is_set():
                self._apply_commands(live)
                if not engine.has_unfinished():
                    self._wake.wait(0.5)
                    self._wake.clear()
                    continue
                engine.step()
                self.num_steps += 1
                if self.observer is not None and engine.history:
                    record = engine.history[-1]
                    self.observer.step(record.num_prefill_tokens + record.num_decode_tokens)
                self._deliver(live)
                engine.finished.clear()  # delivered: the server keeps no per-request history
                engine.aborted.clear()
                if len(engine.history) > self.history_len:
                    del engine.history[: len(engine.history) - self.history_len]
        except Exception as exc:  # the loop died: fail every request in flight, report unhealthy
            self.loop_error = f"{type(exc).__name__}: {exc}"
            for handle in live.values():
                handle.done = True
                self._push(handle, ("error", f"engine failure: {self.loop_error}"))


class Overloaded(RuntimeError):
    """The server cannot take more requests now (HTTP 503)."""
