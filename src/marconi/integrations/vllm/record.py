"""``MARCONI_VLLM_RECORD``: a privacy-safe recording of a live vLLM server's traffic, one line per request.

With ``MARCONI_VLLM_RECORD=path`` the engine core appends one JSONL line per finished or aborted
request when vLLM frees it; decisions are unchanged (no policy observes as ``lru``). No token ids:
each block hash is stored as ``blake2b(salt ‖ hash)``, the 256-bit salt only in the sidecar
``<path>.meta.json``, so two recordings cannot be joined. ``path`` must not exist;
``MARCONI_VLLM_RECORD_MAX_BYTES`` (default 1 GiB) caps the file; at the cap, or where a write
fails, recording stops and the sidecar says ``truncated`` (and ``truncated_reason``). A bad path is
a :class:`~marconi.core.registry.ConfigError` at registration.
Fields and sidecar: docs/diagnose.md, "1. Record".
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import secrets
import time
from pathlib import Path
from typing import Any, Mapping

from marconi.core.registry import ConfigError

__all__ = ["ENV_RECORD", "ENV_RECORD_MAX_BYTES", "RECORDING_FORMAT", "RECORDING_VERSION", "Recorder",
           "record_path_from_env", "check_record_path", "salted_id", "salt_id"]

ENV_RECORD = "MARCONI_VLLM_RECORD"
ENV_RECORD_MAX_BYTES = "MARCONI_VLLM_RECORD_MAX_BYTES"
RECORDING_FORMAT = "marconi-vllm-recording"
RECORDING_VERSION = 1
DEFAULT_MAX_BYTES = 2**30
META_SUFFIX = ".meta.json"

logger = logging.getLogger("marconi.integrations.vllm")


def salted_id(salt: bytes, block_hash: bytes) -> int:
    """``blake2b(salt ‖ hash)`` as an integer in ``[0, 2**63)``: equal hashes map to equal ids
    within one recording, and nothing links them to the tokens or to another recording."""
    return int.from_bytes(hashlib.blake2b(salt + block_hash, digest_size=8).digest(), "big") >> 1


def salt_id(salt: bytes) -> str:
    """The salt's fingerprint (16 hex digits), in the sidecar and the JSONL's header line."""
    return hashlib.blake2b(salt, digest_size=8).hexdigest()


def record_path_from_env(env: Mapping[str, str] | None = None) -> str | None:
    env = os.environ if env is None else env
    return env.get(ENV_RECORD, "").strip() or None


def _max_bytes(env: Mapping[str, str]) -> int:
    raw = env.get(ENV_RECORD_MAX_BYTES, "").strip()
    if not raw:
        return DEFAULT_MAX_BYTES
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 1:
        raise ConfigError(f"{ENV_RECORD_MAX_BYTES}={raw!r}: write a whole number of bytes >= 1")
    return value


def check_record_path(path: str, env: Mapping[str, str] | None = None) -> None:
    """Refuse, before vLLM starts, a recording path that exists or cannot be created (ConfigError
    naming ``MARCONI_VLLM_RECORD``, its value and what to do)."""
    env = os.environ if env is None else env
    _max_bytes(env)
    target = Path(path)
    for p in (target, Path(path + META_SUFFIX)):
        if p.exists() or p.is_symlink():
            raise ConfigError(f"{ENV_RECORD}={path!r}: {p} already exists and a recording never overwrites one; "
                              "give a new path (one per server start)")
    parent = target.parent if str(target.parent) else Path(".")
    if not parent.is_dir():
        raise ConfigError(f"{ENV_RECORD}={path!r}: the folder {parent} does not exist; create it or fix the path")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(f"{ENV_RECORD}={path!r}: cannot create files in {parent} (permission denied); "
                          f"fix the path or unset {ENV_RECORD}")


class Recorder:
    """One recording: the open JSONL, its salt, the first-admission hits of requests in flight.
    Built by :meth:`open` in the engine core; fed by the plugin's admission and ``_free_request`` hooks."""

    def __init__(self, path: str, fh: Any, salt: bytes, meta: dict[str, Any], max_bytes: int) -> None:
        self.path = path
        self._fh = fh
        self._salt = salt
        self.meta = meta
        self.max_bytes = max_bytes
        self.bytes_written = 0
        self.num_written = 0
        self.truncated = False
        self._hits: dict[str, int] = {}

    @classmethod
    def open(cls, path: str, *, block_size: int, model: str, vllm_version: str, policy: str,
             settings: Mapping[str, Any], max_num_seqs: int | None = None,
             env: Mapping[str, str] | None = None) -> "Recorder":
        """Create ``path`` (never over an existing file) and its sidecar; ConfigError naming
        ``MARCONI_VLLM_RECORD`` if it exists or cannot be created."""
        from marconi.io import atomic_write

        env = os.environ if env is None else env
        check_record_path(path, env)
        salt = secrets.token_bytes(32)
        meta = {"format": RECORDING_FORMAT, "version": RECORDING_VERSION, "salt": salt.hex(), "salt_id": salt_id(salt),
                "block_size": int(block_size), "model": model, "vllm_version": vllm_version, "policy": policy,
                "max_num_seqs": max_num_seqs, "settings": dict(settings), "started": time.time(), "truncated": False}
        try:
            fh = open(path, "x", encoding="utf-8", buffering=1)
        except OSError as exc:
            raise ConfigError(f"{ENV_RECORD}={path!r}: cannot create it ({exc.strerror or exc}); give a new, "
                              "writable path") from None
        try:
            with atomic_write(path + META_SUFFIX) as side:
                side.write(json.dumps(meta, indent=1) + "\n")
            header = json.dumps({"recording": meta["salt_id"], "format": RECORDING_FORMAT}) + "\n"
            fh.write(header)
        except BaseException:
            fh.close()
            os.unlink(path)
            raise
        rec = cls(path, fh, salt, meta, _max_bytes(env))
        rec.bytes_written = len(header)
        return rec

    def admitted(self, request: Any, num_hits: int) -> None:
        """A lookup at scheduling: the hit of the first scheduling (not after a preemption) is kept,
        as vLLM's ``prefill_stats`` keep it."""
        if int(getattr(request, "num_preemptions", 0) or 0) <= 0:
            self._hits[request.request_id] = int(num_hits)

    def finished(self, request: Any) -> None:
        """The request was freed: write its line (never raises: a failing write, or the size cap,
        stops recording and marks the sidecar ``truncated``)."""
        hit = self._hits.pop(request.request_id, 0)
        if self._fh is None:
            return
        try:
            hashes = [salted_id(self._salt, bytes(h)) for h in request.block_hashes]
            line = json.dumps({"arrival": float(request.arrival_time), "finish": time.time(),
                               "prompt_len": int(request.num_prompt_tokens),
                               "output_len": int(request.num_output_tokens), "hash_ids": hashes,
                               "num_cached_tokens": hit, "num_preemptions": int(request.num_preemptions),
                               "num_computed_tokens": int(getattr(request, "num_computed_tokens", 0) or 0)},
                              separators=(",", ":")) + "\n"
            if self.bytes_written + len(line) > self.max_bytes:
                logger.warning("marconi: recording %s reached %s=%d bytes after %d requests; recording stops (start "
                               "a new path to record more)", self.path, ENV_RECORD_MAX_BYTES, self.max_bytes,
                               self.num_written)
                self._stop(f"its size cap, {ENV_RECORD_MAX_BYTES}={self.max_bytes} bytes")
                return
            self._fh.write(line)
            self.bytes_written += len(line)
            self.num_written += 1
        except Exception as exc:       # never take the server down for a recording
            logger.exception("marconi: recording to %s failed; recording stops", self.path)
            self._stop(f"a write failed after {self.num_written} requests: {type(exc).__name__}: {exc}")

    def _stop(self, reason: str) -> None:
        """Stop recording: the sidecar gets ``"truncated": true`` and ``truncated_reason`` (so a
        diagnosis says later traffic is missing), where it can still be written; never raises."""
        from marconi.io import atomic_write

        self.truncated = True
        self.meta["truncated"] = True
        self.meta["truncated_reason"] = reason
        try:
            with atomic_write(self.path + META_SUFFIX) as side:
                side.write(json.dumps(self.meta, indent=1) + "\n")
        except Exception:      # a full disk may refuse the sidecar too: the log says so
            logger.exception("marconi: could not mark the recording's sidecar %s truncated", self.path + META_SUFFIX)
        try:
            self.close()
        except Exception:      # the file's last buffered bytes cannot be written either
            self._fh = None

    def close(self) -> None:
        if self._fh is not None:
            fh, self._fh = self._fh, None
            fh.close()
