"""The engine-free half of a real-server bench: which requests, replayed how, summarised how.

:func:`select_requests` picks the trace's first requests; :func:`serve_side_by_side` starts an
engine's servers together and replays the requests *paired* at ``concurrency == 1``
(:func:`replay_paired`: request ``i`` on every server, in alternating order, before ``i+1``, so
background load falls on every policy alike) or each server alone (:func:`replay_concurrent`).
Every request asks for its trace output's length with ``ignore_eos``.
"""

from __future__ import annotations

import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping, NamedTuple, Sequence

import numpy as np

from marconi.core.registry import ConfigError, parse_name
from marconi.integrations.common.client import CompletionResult, complete
from marconi.integrations.common.server import ServerProcess
from marconi.workloads import is_workload, load_trace
from marconi.workloads.trace import Request, Trace

__all__ = ["Progress", "Selection", "ServedRun", "select_requests", "max_tokens", "serve_side_by_side",
           "replay_paired", "replay_concurrent", "percentile", "mean_or_none", "file_label"]

Progress = Callable[[str], None]


def max_tokens(request: Request) -> int:
    """What a replayed request asks the server for: its trace output's length (at least 1 token)."""
    return max(1, len(request.output_tokens))


# ====================================================================================== requests
class Selection(NamedTuple):
    requests: list[Request]
    indices: list[int]                  # each request's position in the (capped) trace
    trace_info: dict[str, Any]          # echoed into records: the trace's name and the cap


def select_requests(trace: str, *, max_input_len: int, num_requests: int | None = None,
                    max_output_len: int | None = None, notice: Progress | None = None) -> Selection:
    """The first ``num_requests`` requests of ``trace`` (all: None), outputs cut to ``max_output_len``.
    A catalog name is built with ``max_input_len`` unless it sets its own; in a trace file a session
    ends before its first input longer than that. ``notice``: told of a stand-in for absent data, and
    once of the requests a file's cap left out, with the flag that keeps them (None: a ``NOTE:`` line
    on stderr, so no bench measures a bundled sample believing it the trace, nor a cut trace whole).

    Raises:
        ConfigError: neither a file nor a catalog name, or no request fits the cap.
    """
    loaded, cap = _capped_trace(trace, max_input_len, notice if notice is not None else _note_on_stderr)
    out, indices = [], []
    for i, req in enumerate(loaded):
        if num_requests is not None and len(out) >= num_requests:
            break
        if max_output_len is not None and len(req.output_tokens) > max_output_len:
            req = replace(req, output_tokens=req.output_tokens[:max_output_len])
        out.append(req)
        indices.append(i)
    if not out:
        raise ConfigError(f"trace {trace!r} has no request with an input of at most {cap:,} tokens: raise "
                          "--max-input-len")
    return Selection(out, indices, {"trace": loaded.name, "trace_params": {"max_input_len": cap}})


def _note_on_stderr(message: str) -> None:
    print(f"NOTE: {message}", file=sys.stderr, flush=True)


def _capped_trace(text: str, max_input_len: int, notice: Progress | None) -> tuple[Trace, int]:
    """The trace, its inputs capped, and the cap that applied (a catalog name's own wins)."""
    if is_workload(text):
        from marconi.workloads.catalog import WORKLOADS, NoRequests

        parsed = parse_name(text)
        if "max_input_len" in WORKLOADS.params_of(parsed.name):   # the builder ends sessions at the cap
            ours = "max_input_len" not in parsed.params
            parsed.params.setdefault("max_input_len", str(max_input_len))
            try:
                trace = load_trace(str(parsed), notice=notice)  # the catalog parsed the cap: it is an int
            except NoRequests as exc:
                if not ours:                    # the name's own cap: the catalog's message names it
                    raise
                raise ConfigError(f"trace {text!r} has no request with an input of at most {max_input_len:,} tokens: "
                                  f"raise --max-input-len ({exc})") from None
            return trace, int(parsed.params["max_input_len"])
        text = str(parsed)              # a builder without a cap (sharegpt, mooncake): cut as a file is
    trace = load_trace(text, notice=notice)
    ended: set[Any] = set()
    kept = []
    for req in trace:
        if req.session_id in ended:
            continue
        if req.input_len > max_input_len:
            ended.add(req.session_id)
            continue
        kept.append(req)
    if len(kept) == len(trace):
        return trace, max_input_len
    if notice is not None and kept:     # once per trace (none kept: select_requests' error names the flag)
        after = len(trace) - len(kept) - len(ended)       # later turns of those sessions
        notice(f"trace {trace.name}: {len(trace) - len(kept):,} of {len(trace):,} requests left out: "
               f"{len(ended):,} with an input longer than --max-input-len {max_input_len:,} tokens"
               + (f" and the {after:,} later turn(s) of their sessions (a session ends at its first such input)"
                  if after else "") + "; raise --max-input-len to keep them")
    return Trace(kept, name=trace.name, meta=dict(trace.meta)), max_input_len


# ====================================================================================== serving
@dataclass(slots=True)
class ServedRun:
    """One server's replay: a result per request (in request order), its time, its counters."""

    results: list[CompletionResult]
    wall_s: float                       # time spent in this server's requests
    metrics: dict[str, float]           # /metrics after the last request
    startup_s: float


def serve_side_by_side(servers: Mapping[str, ServerProcess], model: str, requests: Sequence[Request], *,
                       concurrency: int, progress: Progress,
                       on_up: Callable[[str, ServerProcess], None] | None = None) -> dict[str, ServedRun]:
    """Start ``servers`` (label -> a server not yet started) together, replay ``requests`` on them
    (paired at ``concurrency == 1``, else each alone), read their metrics, stop them (always).

    ``on_up(label, server)`` runs once per server when all are healthy (an engine's own checks); it
    may raise.
    """
    with ExitStack() as stack:
        for server in servers.values():
            stack.callback(server.stop)
        for server in servers.values():      # spawned here: a server dies with the thread that spawned it
            server.spawn()
        with ThreadPoolExecutor(len(servers)) as pool:
            for fut in [pool.submit(s.wait_healthy) for s in servers.values()]:
                fut.result()
        for label, server in servers.items():
            progress(f"[{label}] server up in {server.startup_s:.0f}s")
            if on_up is not None:
                on_up(label, server)
        if concurrency == 1:
            results, walls = replay_paired(servers, model, requests, progress)
        else:
            results, walls = {}, {}
            for label, server in servers.items():
                started = time.perf_counter()
                results[label] = replay_concurrent(server, model, requests, concurrency, label, progress)
                walls[label] = time.perf_counter() - started
        metrics = {label: server.metrics() for label, server in servers.items()}
    return {label: ServedRun(results[label], walls[label], metrics[label], server.startup_s)
            for label, server in servers.items()}


def replay_paired(servers: Mapping[str, ServerProcess], model: str, requests: Sequence[Request],
                  progress: Progress) -> tuple[dict[str, list[CompletionResult]], dict[str, float]]:
    """Request by request, to every server in turn (alternating which goes first): the results per
    server and the time each spent in its own requests."""
    import httpx

    names = list(servers)
    results: dict[str, list[CompletionResult]] = {p: [] for p in names}
    walls = dict.fromkeys(names, 0.0)
    report_every = max(1, len(requests) // 10)
    with httpx.Client() as client:
        for i, req in enumerate(requests):
            for label in (names if i % 2 == 0 else names[::-1]):
                servers[label].check_alive()
                started = time.perf_counter()
                results[label].append(complete(client, servers[label].base_url, model, req.input_tokens.tolist(),
                                               max_tokens(req)))
                walls[label] += time.perf_counter() - started
            if (i + 1) % report_every == 0 or i + 1 == len(requests):
                progress(f"{i + 1}/{len(requests)} requests on {len(names)} server(s)")
    return results, walls


def replay_concurrent(server: ServerProcess, model: str, requests: Sequence[Request], concurrency: int,
                      label: str, progress: Progress) -> list[CompletionResult]:
    """Send every request; a session's turns in order, at most ``concurrency`` in flight."""
    import httpx

    results: list[Any] = [None] * len(requests)
    last_of_session: dict[Any, Future[CompletionResult]] = {}
    done = 0
    report_every = max(1, len(requests) // 10)
    with httpx.Client(limits=httpx.Limits(max_connections=concurrency + 1)) as client, \
            ThreadPoolExecutor(max_workers=concurrency) as pool:

        def run(i: int, previous: Future[CompletionResult] | None) -> CompletionResult:
            if previous is not None:
                previous.result()
            req = requests[i]
            return complete(client, server.base_url, model, req.input_tokens.tolist(), max_tokens(req))

        pending: list[tuple[int, Future[CompletionResult]]] = []
        for i, req in enumerate(requests):
            while len(pending) >= concurrency:        # bound the queue, not only the workers
                j, fut = pending.pop(0)
                results[j] = fut.result()
                done += 1
                if done % report_every == 0:
                    progress(f"[{label}] {done}/{len(requests)} requests")
            fut = pool.submit(run, i, last_of_session.get(req.session_id))
            last_of_session[req.session_id] = fut
            pending.append((i, fut))
            server.check_alive()
        for j, fut in pending:
            results[j] = fut.result()
            done += 1
    progress(f"[{label}] {done}/{len(requests)} requests done")
    return results


# ====================================================================================== summaries
def percentile(values: Sequence[float | None], q: float) -> float | None:
    """The ``q``-th percentile of the values that are not None (None if there are none)."""
    arr = np.asarray([v for v in values if v is not None], dtype=np.float64)
    return float(np.percentile(arr, q)) if arr.size else None


def mean_or_none(values: Sequence[float | None]) -> float | None:
    """The mean of the values that are not None (None if there are none)."""
    kept = [v for v in values if v is not None]
    return float(np.mean(kept)) if kept else None


def file_label(label: str) -> str:
    """A policy label as a file name part: ``marconi:alpha=adaptive`` -> ``marconi-alpha-adaptive``."""
    return "".join(c if c.isalnum() or c in "._" else "-" for c in label)
