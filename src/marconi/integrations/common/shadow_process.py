"""The shadow's replay in a child process: :class:`ShadowAlpha`'s background worker without the GIL.

A lagged :class:`~marconi.integrations.common.shadow_alpha.ShadowAlpha` (``lag >= 1``) may replay
its finished requests anywhere, as long as the rule after each one comes back in order. A worker
*thread* takes the replay off the scheduler thread but not off the GIL: its numpy and radix-tree
work still delays the scheduler (docs/vllm-at-scale.md measured 1.4× stock with a thread against
1.8× inline). :class:`ShadowProcess` runs the same replay (the shadow ``ShadowAlpha.start`` builds,
fed as its inline ``observe`` feeds it) in a child process,
``python -m marconi.integrations.common.shadow_process``. The scheduler thread pays for one pipe
write and for serialising the tokens the child has not seen: where the engine names its prefixes
(``RequestObservation.prefix_keys``, vLLM's block hashes), only the tokens past the deepest prefix
the child holds are sent (:mod:`marconi.integrations.common.prefix_delta`), otherwise all of them;
either way as native int32 bytes, packed from the engine's list in place by
:func:`~marconi.integrations.common.prefix_delta.int32_bytes` (~1.5 ns a token compiled, no slice),
which the child reads in place. With a lag a reader thread, blocked in
``read`` outside the GIL nearly always, collects the rules; at lag 0 (``reader_thread=False``) the
caller waits for every rule anyway, so it reads them itself when it waits, and no thread takes the
GIL from it between waits (its caller must then wait often enough that the child's answers never
fill their pipe: :attr:`~marconi.integrations.common.shadow_alpha.ShadowAlpha.max_unsettled`).

Same choices: the child replays the same tokens in submission order through the code an inline
replay runs, so the rule after request ``n`` is the inline replay's, request by request
(tests/test_shadow_alpha_lag.py holds the three ways to one another, and the decoder's tokens to
the requests').

Wire format, both ways: frames of ``kind`` (1 byte) + payload length (4 bytes, little-endian) +
payload. Parent to child: ``S`` start (pickled ``(rules, decay, hysteresis, spec, capacity_bytes,
kept_tokens)``, once, first), ``R`` one request (the marshalled :meth:`PrefixEncoder.encode`
tuple, its ids as :func:`~marconi.integrations.common.prefix_delta.packed_ids` bytes: parent and
child share a machine), ``Q`` one request of a batch whose answer may wait for the batch's last (an
``R``), ``T`` send the tuning record. Child to parent: ``s`` started (the shadow is built; the
parent's constructor waits for it), ``r`` the rule index after each request answered (4 bytes
each), ``t`` the tuning record (pickled), ``e`` a failure (its traceback, UTF-8; the child exits).
The child exits when its input closes, so it never outlives the parent's pipe.

Nothing here knows an engine.
"""

from __future__ import annotations

import marshal
import os
import pickle
import struct
import subprocess
import sys
import threading
import traceback
import weakref
from collections import deque
from pathlib import Path
from typing import IO, Any, Callable, Sequence

from marconi.integrations.common.prefix_delta import KEPT_TOKENS, PrefixDecoder, PrefixEncoder

__all__ = ["ShadowProcess", "serve"]

_HEADER = struct.Struct("<cI")
_INDEX = struct.Struct("<i")


def _write(out: IO[bytes], kind: bytes, payload: bytes) -> None:
    """One frame (OSError, e.g. BrokenPipeError, when the reader is gone)."""
    _write_all(out, [_HEADER.pack(kind, len(payload)), payload])


def _write_all(out: IO[bytes], parts: list[bytes]) -> None:
    """Buffers in order: one ``writev`` where the stream is a pipe's (one system call, and one wake-up
    of the reader, for a batch), else buffered writes and a flush. OSError when the reader is gone."""
    try:
        fd = out.fileno() if hasattr(os, "writev") else -1
    except (AttributeError, OSError, ValueError):       # an in-memory stream
        fd = -1
    if fd < 0:
        for part in parts:
            out.write(part)
        out.flush()
        return
    out.flush()
    iov_max = 512                                       # well under Linux's IOV_MAX (1024)
    for first in range(0, len(parts), iov_max):
        chunk = parts[first:first + iov_max]
        total, sent = sum(map(len, chunk)), os.writev(fd, chunk)
        if sent < total:            # a pipe write can be cut short (a signal): write the rest
            rest = memoryview(b"".join(chunk))[sent:]
            while rest:
                rest = rest[os.write(fd, rest):]


def _read(inp: IO[bytes]) -> tuple[bytes, bytes] | None:
    """One frame, or None at a clean end of input (EOFError for a frame cut short)."""
    head = inp.read(_HEADER.size)
    if not head:
        return None
    if len(head) < _HEADER.size:
        raise EOFError("shadow process: a frame header was cut short")
    kind, size = _HEADER.unpack(head)
    payload = inp.read(size) if size else b""
    if len(payload) < size:
        raise EOFError("shadow process: a frame was cut short")
    return kind, payload


class _Link:
    """What the parent's two threads and its :class:`ShadowProcess` share (the threads hold this, not
    the ShadowProcess, so dropping that ends the child)."""

    def __init__(self, rules: deque[int]) -> None:
        self.rules = rules
        self.cond = threading.Condition()
        self.error: str | None = None
        self.record: dict[str, Any] | None = None
        self.ready = False

    def fail(self, text: str) -> None:
        with self.cond:
            if self.error is None:
                self.error = text
            self.cond.notify_all()

    def raise_if_failed(self) -> None:
        if self.error is not None:
            raise RuntimeError(f"shadow alpha: the replay process failed:\n{self.error}")


class ShadowProcess:
    """The parent's side: start the child, send it requests, collect the rule after each into
    ``rules`` (the lagged source's deque, appended in order under this worker's lock).

    The scheduler thread encodes, marshals and writes a request (a writer thread, tried, made the
    step slower on a 2-core machine: one more thread taking the GIL back); a reader thread collects
    the answers, or (``reader_thread=False``) :meth:`wait_for` reads them on the caller's thread.
    The worker interface :class:`~marconi.integrations.common.shadow_alpha.ShadowAlpha` drives:
    :meth:`submit`, :meth:`wait_for`, :meth:`tuning_record`, :meth:`close`.

    Raises:
        OSError: the child cannot be started; RuntimeError from the constructor when it started but
            ended before its shadow was built (the caller may fall back to a thread).
        RuntimeError: the child failed or went away (from the constructor, :meth:`submit`,
            :meth:`wait_for` or :meth:`tuning_record`, with the child's own traceback as the message
            when it sent one).
    """

    def __init__(self, rules: Sequence[Any], decay: float, hysteresis: float, spec: Any, capacity_bytes: float,
                 rule_indices: deque[int], *, kept_tokens: int = KEPT_TOKENS, batch: int = 1,
                 reader_thread: bool = True) -> None:
        src = str(Path(__file__).resolve().parents[3])       # the directory holding the marconi package
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH", "")) if p)
        from marconi.pool import spawn      # the project's one way to start a program: it dies with us

        proc = spawn([sys.executable, "-m", "marconi.integrations.common.shadow_process"],
                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        assert proc.stdin is not None and proc.stdout is not None
        _widen(proc.stdin)
        self._proc = proc
        self._link = link = _Link(rule_indices)
        self._out = proc.stdin
        self._held: list[bytes] = []           # frames not yet written (headers and payloads)
        self._batch = max(1, batch)
        self._encoder = PrefixEncoder(kept_tokens)
        self._finalize = weakref.finalize(self, _shut, proc)
        self._send(b"S", pickle.dumps((tuple(rules), decay, hysteresis, spec, capacity_bytes, kept_tokens)))
        self._reader_thread = reader_thread
        if reader_thread:
            threading.Thread(target=_collect, args=(proc.stdout, link, proc), name="marconi-shadow-reader",
                             daemon=True).start()
        # Wait for the child's shadow (its imports take about a second): paid once, where the engine
        # starts, not by the first requests' scheduler steps.
        self._wait(lambda: link.ready)
        link.raise_if_failed()

    @property
    def pid(self) -> int:
        return self._proc.pid

    def submit(self, event: Any) -> None:
        """Send one finished request (the tokens the child lacks). RuntimeError if the child has failed."""
        self._link.raise_if_failed()
        # the ids come as int32 bytes (packed_ids): cheaper to write than marshal's ints, and the child
        # reads them in place instead of converting a list (85 µs for 3,800 ids)
        frame = self._encoder.encode(event.prompt_token_ids, event.output_token_ids,
                                     getattr(event, "prefix_keys", ()), getattr(event, "key_tokens", 0))
        payload = marshal.dumps(frame, 2)       # version 2: no table of shared objects, 3× faster
        self._held += (_HEADER.pack(b"R", len(payload)), payload)
        if len(self._held) >= 2 * self._batch:
            self._flush()

    def _send(self, kind: bytes, payload: bytes) -> None:
        self._held += (_HEADER.pack(kind, len(payload)), payload)
        self._flush()

    def _flush(self) -> None:
        """Write the held frames in one system call (one wake-up of the child for a batch); every
        request but the batch's last is marked ``Q``, so the child answers the batch in one frame
        (one wake-up of the reader thread)."""
        held, self._held = self._held, []
        for at in range(0, len(held) - 2, 2):
            if held[at][:1] == b"R":
                held[at] = b"Q" + held[at][1:]
        try:
            _write_all(self._out, held)
        except (OSError, ValueError) as exc:        # a broken pipe, or closed
            self._link.fail(f"{type(exc).__name__} writing to the replay process (pid {self._proc.pid}): {exc}")
            self._link.raise_if_failed()

    def wait_for(self, num_rules: int) -> None:
        """Block until ``rules`` holds ``num_rules`` entries; RuntimeError if the child failed."""
        link = self._link
        if len(link.rules) < num_rules and self._held:
            self._flush()                         # the child needs the held requests first
        self._wait(lambda: len(link.rules) >= num_rules)
        if len(link.rules) < num_rules:
            link.raise_if_failed()

    def _wait(self, done: Callable[[], bool]) -> None:
        """Until ``done()`` or a failure: on the reader thread's notifications, or (without a reader
        thread) reading the child's answers here, blocked in ``read`` outside the GIL."""
        link = self._link
        if self._reader_thread:
            with link.cond:
                while not done() and link.error is None:
                    link.cond.wait()
            return
        inp, proc = self._proc.stdout, self._proc
        while not done() and link.error is None:
            try:
                frame = _read(inp)
            except BaseException as exc:
                link.fail(f"{type(exc).__name__} reading from the replay process (pid {proc.pid}): {exc}")
                return
            if frame is None:
                link.fail(f"the replay process (pid {proc.pid}) ended (exit status {proc.poll()})")
                return
            _take(link, *frame)

    def tuning_record(self) -> dict[str, Any]:
        """The child's regret chooser's record (after every request submitted so far)."""
        link = self._link
        with link.cond:
            link.record = None
        self._send(b"T", b"")
        self._wait(lambda: link.record is not None)
        record = link.record
        if record is None:
            link.raise_if_failed()
        return record            # type: ignore[return-value]

    def close(self) -> None:
        """End the child (it exits at the end of its input) and wait for it briefly."""
        if self._held and self._link.error is None:
            self._flush()
        self._finalize()


def _collect(inp: IO[bytes], link: _Link, proc: subprocess.Popen) -> None:
    """The reader thread: the child's answers into ``link``; its end (or failure) as ``link.error``."""
    try:
        while (frame := _read(inp)) is not None:
            _take(link, *frame)
        link.fail(f"the replay process (pid {proc.pid}) ended (exit status {proc.poll()})")
    except BaseException as exc:
        link.fail(f"{type(exc).__name__} reading from the replay process (pid {proc.pid}): {exc}")


def _take(link: _Link, kind: bytes, payload: bytes) -> None:
    """One answer of the child into ``link`` (and wake whoever waits on it)."""
    with link.cond:
        if kind == b"r":
            link.rules.extend(index for (index,) in _INDEX.iter_unpack(payload))
        elif kind == b"t":
            link.record = pickle.loads(payload)
        elif kind == b"s":
            link.ready = True
        else:
            link.error = payload.decode("utf-8", "replace")
        link.cond.notify_all()


def _widen(pipe: IO[bytes], size: int = 1 << 20) -> None:
    """Give the request pipe room for a burst of requests (Linux's default 64 KiB holds a few; a full
    pipe would block the scheduler thread until the child reads). Best effort: elsewhere, or above
    ``/proc/sys/fs/pipe-max-size``, the pipe keeps its size."""
    try:
        import fcntl

        fcntl.fcntl(pipe.fileno(), getattr(fcntl, "F_SETPIPE_SZ", 1031), size)
    except (ImportError, OSError, ValueError):
        pass


def _shut(proc: subprocess.Popen) -> None:
    try:
        if proc.stdin is not None:
            proc.stdin.close()           # the child exits at the end of its input
    except OSError:
        pass
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        from marconi.pool import stop

        stop(proc, grace_s=1.0)


def serve(inp: IO[bytes], out: IO[bytes]) -> int:
    """The child: build the shadow from the ``S`` frame, then replay each ``R`` request and answer
    the rule after it, until the input ends (0). A failure is sent as an ``e`` frame (1)."""
    from marconi.choosers.regret import RegretEviction
    from marconi.core.cache import PrefixCache

    try:
        first = _read(inp)
        if first is None:
            return 0
        kind, payload = first
        if kind != b"S":
            raise ValueError(f"shadow process: expected a start frame, got {kind!r}")
        rules, decay, hysteresis, spec, capacity, kept_tokens = pickle.loads(payload)
        decoder = PrefixDecoder(kept_tokens)
        # ShadowAlpha.start's shadow, replayed as its inline (lag 0) observe replays it
        chooser = RegretEviction(rules, decay=decay, hysteresis=hysteresis)
        cache = PrefixCache(spec, capacity, "marconi", chooser)
        _write(out, b"s", b"")
        answers = bytearray()                  # rule indices not yet sent (a batch's first requests)
        while (frame := _read(inp)) is not None:
            kind, payload = frame
            if kind == b"R" or kind == b"Q":
                prompt, output = decoder.decode(marshal.loads(payload))
                cache.process(prompt, output)
                answers += _INDEX.pack(chooser.current)
                if kind == b"R":                # a batch's last request: answer the whole batch at once
                    _write(out, b"r", bytes(answers))
                    answers.clear()
            elif kind == b"T":
                if answers:
                    _write(out, b"r", bytes(answers))
                    answers.clear()
                _write(out, b"t", pickle.dumps(chooser.tuning_record()))
            else:
                raise ValueError(f"shadow process: unknown frame kind {kind!r}")
        return 0
    except BaseException:
        try:
            _write(out, b"e", traceback.format_exc().encode())
        except OSError:
            pass
        return 1


if __name__ == "__main__":
    sys.exit(serve(sys.stdin.buffer, sys.stdout.buffer))
