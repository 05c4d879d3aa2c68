"""Files, in one place: atomic writes, JSONL records read with ``path:line`` locations, output checks.

Every file marconi writes goes through :func:`atomic_write`, and every JSONL file it reads through
:func:`iter_lines` / :func:`iter_jsonl`, so the rules below hold everywhere:

* **Nothing half-written.** A regular file is written to a temp file in the target's own directory,
  flushed, fsynced and renamed over the target (``os.replace``) only once complete. On any exception
  -- including :class:`marconi.pool.Terminated`, which the CLI raises on SIGTERM -- the temp file is
  removed and the target is untouched. (``kill -9`` cannot be cleaned up after: a hidden
  ``.<name>.*.tmp`` may remain beside the target.)
* **Special targets are never replaced.** A symlink is followed: the file it points to is replaced
  and the link stays. A character device or a FIFO (``/dev/null``, ``/dev/stdout``, a named pipe) is
  written through as a stream -- renaming over it would destroy it (as root, ``/dev/null`` itself).
  A directory, a socket or a block device is refused.
* **Normal permissions.** A new file gets ``0o666 & ~umask`` (``0644`` usually), like ``open()``; a
  replaced file keeps its mode. (``mkstemp`` alone would leave ``0600``.)
* **Errors name the place.** Readers raise :class:`JsonError` (a ValueError) as ``path:line: what``
  for a line that is not UTF-8, not JSON, or nested too deeply to decode. A write that fails for
  want of space (``ENOSPC``, a quota, a file size limit) raises an OSError naming the target, not a
  bare ``[Errno 28]``.
* **A directory is replaced as a whole.** :func:`atomic_directory` fills a hidden staging directory
  and swaps it in only once complete, so an interrupted report never mixes old and new files.

:func:`check_output` is the pre-flight check commands run *before* long work, so a result is never
computed and then lost to an unwritable ``--out`` (or written over one of the command's inputs:
every file it reads, a trace's sidecar and the files of a model directory included).
"""

from __future__ import annotations

import errno
import gzip
import json
import os
import shutil
import stat
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, Iterable, Iterator, Sequence

from marconi.core.jsonfile import JsonError, check_readable, read_json
from marconi.core.registry import ConfigError

__all__ = ["atomic_write", "atomic_directory", "write_text", "write_jsonl", "iter_lines", "iter_jsonl",
           "read_jsonl", "read_json", "decode_line", "loads", "check_output", "is_stream", "JsonError",
           "line_limit", "MAX_LINE_ENV", "DEFAULT_MAX_LINE_BYTES"]

PathLike = str | os.PathLike


# ============================================================================ writing


def _new_file_mode(target: Path, base: int = 0o666) -> int:
    """The mode ``open()`` (``mkdir()`` with ``base=0o777``) would give a new ``target``, or the
    existing target's, which is kept."""
    try:
        return target.stat().st_mode & 0o7777
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        return base & ~umask


# Errors of a write that can only be about the file being written (a read error has other errnos).
_NO_SPACE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


def _naming(exc: OSError, path: PathLike) -> OSError | None:
    """``exc`` again with ``path`` as its file name (and advice where space ran out), or None if it has one."""
    if exc.filename is not None or exc.errno is None:
        return None
    reason = exc.strerror or str(exc)
    if exc.errno in _NO_SPACE_ERRNOS:
        reason += " (free some space there, or write elsewhere)"
    return OSError(exc.errno, reason, os.fspath(path))


def _is_stream(st: os.stat_result) -> bool:
    return stat.S_ISCHR(st.st_mode) or stat.S_ISFIFO(st.st_mode)


def is_stream(path: PathLike) -> bool:
    """Whether ``path`` is a character device or a FIFO (written through, never replaced)."""
    try:
        return _is_stream(os.stat(path))
    except OSError:
        return False


def _refusal(path: Path, st: os.stat_result) -> str | None:
    """Why ``path`` (with stat ``st``) cannot be an output file, or None."""
    if stat.S_ISDIR(st.st_mode):
        return f"{path} is a directory: give a file name (e.g. {path / 'results.jsonl'})"
    if stat.S_ISSOCK(st.st_mode) or stat.S_ISBLK(st.st_mode):
        return f"{path} is a {'socket' if stat.S_ISSOCK(st.st_mode) else 'block device'}, not a file: refusing to write it"
    return None


@contextmanager
def atomic_write(path: PathLike, mode: str = "w") -> Iterator[IO[Any]]:
    """Open ``path`` for writing (``"w"`` text in UTF-8, or ``"wb"``); commit it only on success.

    See the module docstring for what happens with symlinks, devices, FIFOs and permissions.
    Missing parent directories are created.

    Raises:
        ConfigError: ``path`` is a directory, a socket or a block device.
        OSError: the directory cannot be written (nothing is left behind).
    """
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_write: mode must be 'w' or 'wb', got {mode!r}")
    encoding = None if mode == "wb" else "utf-8"
    target = Path(os.path.realpath(path))  # a symlink's target is replaced; the link itself stays
    try:
        st: os.stat_result | None = target.stat()
    except FileNotFoundError:
        st = None
    if st is not None:
        refusal = _refusal(Path(path), st)
        if refusal:
            raise ConfigError(refusal)
        if _is_stream(st):
            try:
                with open(target, mode, encoding=encoding) as fh:
                    with _no_space_named(path):
                        yield fh
            except OSError as exc:  # flushing at close (/dev/full, a closed pipe)
                named = _naming(exc, path)
                if named is None:
                    raise
                raise named from None
            return
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        try:
            with os.fdopen(fd, mode, encoding=encoding) as fh:
                with _no_space_named(path):
                    yield fh
                fh.flush()
                os.fsync(fh.fileno())
            os.chmod(tmp_name, _new_file_mode(target))
            os.replace(tmp_name, target)
        except OSError as exc:  # after the body: flushing, syncing, renaming -- all about this file
            named = _naming(exc, path)
            if named is None:
                raise
            raise named from None
    except BaseException:
        try:
            os.unlink(tmp_name)
        except FileNotFoundError:
            pass
        raise


@contextmanager
def _no_space_named(path: PathLike) -> Iterator[None]:
    """Inside the caller's body only a want of space is surely about ``path`` (a read error may not be)."""
    try:
        yield
    except OSError as exc:
        named = _naming(exc, path) if exc.errno in _NO_SPACE_ERRNOS else None
        if named is None:
            raise
        raise named from None


@contextmanager
def atomic_directory(path: PathLike) -> Iterator[Path]:
    """A new, empty directory to fill, which replaces ``path`` as a whole only if the body completes.

    The body writes into a hidden staging directory beside ``path`` (``.<name>.*.staging``). On
    success the old ``path`` is renamed aside, the staging directory renamed to ``path`` and the
    old one removed: readers see the old directory or the new one, never a mix (between the two
    renames, for an instant, neither). On any exception -- :class:`marconi.pool.Terminated`
    included -- the staging directory is removed and ``path`` is untouched. A symlink is followed:
    the directory it points to is replaced, the link stays. The new directory gets ``mkdir``'s mode
    (or the old one's). Whatever else was in the old directory is gone: callers check first
    (:func:`check_output` with ``directory=True``) that no input lives there.

    Raises:
        ConfigError: ``path`` exists and is not a directory.
    """
    target = Path(os.path.realpath(path))
    if target.exists() and not target.is_dir():
        raise ConfigError(f"{path} exists and is not a directory")
    target.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.", suffix=".staging"))
    try:
        yield stage
        os.chmod(stage, _new_file_mode(target, 0o777))
        _swap_in(stage, target)
    finally:
        shutil.rmtree(stage, ignore_errors=True)  # gone already after a swap


def _swap_in(stage: Path, target: Path) -> None:
    """Rename ``stage`` to ``target``, replacing (and removing) a directory there; restore it on failure."""
    if not target.exists():
        os.rename(stage, target)
        return
    aside = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.", suffix=".old"))
    try:
        os.rename(target, aside)  # onto the empty directory mkdtemp made: POSIX allows it
        try:
            os.rename(stage, target)
        except BaseException:
            os.rename(aside, target)
            raise
    finally:
        shutil.rmtree(aside, ignore_errors=True)


def write_text(path: PathLike, text: str) -> Path:
    """Write ``text`` (UTF-8) atomically; returns ``path``."""
    with atomic_write(path, "w") as fh:
        fh.write(text)
    return Path(path)


def write_jsonl(path: PathLike, records: Iterable[Any]) -> Path:
    """Write one ``json.dumps`` line per record, atomically; returns ``path``."""
    with atomic_write(path, "w") as fh:
        for rec in records:
            fh.write(json.dumps(rec) + "\n")
    return Path(path)


# ============================================================================ checking an output path


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist (yet)
        return os.path.realpath(a) == os.path.realpath(b)


def _inside(path: PathLike, folder: PathLike) -> bool:
    """Whether ``path`` is ``folder`` or lies under it (symlinks resolved)."""
    real, base = os.path.realpath(path), os.path.realpath(folder)
    return real == base or real.startswith(base.rstrip(os.sep) + os.sep)


def _nearest_existing(path: Path) -> Path:
    for candidate in (path, *path.parents):
        if candidate.exists():
            return candidate
    return Path(".")


def check_output(path: PathLike, *, inputs: Sequence[PathLike] = (), directory: bool = False,
                 option: str = "--out") -> Path:
    """Check, before any long work, that ``path`` can be written and destroys none of ``inputs``.

    ``inputs``: every file the command reads (a trace *and* its ``.meta.json`` sidecar, a latency
    table ...); an input directory (a model directory) stands for every file in it. Inputs that do
    not exist are ignored.

    ``directory``: ``path`` is a directory the command fills (it may exist); given ``inputs``, it
    is one that :func:`atomic_directory` replaces as a whole, so no input may lie inside it. Else
    ``path`` is a file that :func:`atomic_write` will write: it may be no input, and no existing
    file inside an input directory. Nothing is created: the nearest existing ancestor directory
    is probed with a temp file that is removed at once.

    Raises:
        ConfigError: saying what is wrong with ``path`` and what to do.
    """
    p = Path(path)
    for source in inputs:
        src = Path(source)
        if not src.exists():
            continue
        if directory:
            if _inside(src, p):
                raise ConfigError(f"{src}, an input of this command, is inside {option} {p}, which is replaced "
                                  f"as a whole: move the input out of it, or choose another {option}")
        elif src.is_dir():
            if p.exists() and _inside(p, src):
                raise ConfigError(f"{option} {p} is inside {src}, an input of this command (its files are read); "
                                  "writing it would destroy the input: choose another output path")
        elif _same_file(p, src):
            raise ConfigError(f"{option} {p} is also an input of this command ({src}); writing it would "
                              "destroy the input: choose another output path")
    try:
        st: os.stat_result | None = p.stat()
    except (FileNotFoundError, NotADirectoryError):  # the ancestor check below says which part is wrong
        st = None
    except OSError as exc:
        raise ConfigError(f"{option} {p}: {exc.strerror}") from None
    if st is not None:
        if directory:
            if not stat.S_ISDIR(st.st_mode):
                raise ConfigError(f"{option} {p} exists and is not a directory")
        else:
            refusal = _refusal(p, st)
            if refusal:
                raise ConfigError(f"{option}: {refusal}")
            if _is_stream(st):
                if not os.access(p, os.W_OK):
                    raise ConfigError(f"{option} {p}: permission denied")
                return p
    real = Path(os.path.realpath(p))
    anchor = _nearest_existing(real if directory else real.parent)
    if not anchor.is_dir():
        raise ConfigError(f"{option} {p}: {anchor} is not a directory")
    probe: str | None = None
    try:
        fd, probe = tempfile.mkstemp(dir=anchor, prefix=".marconi-probe-", suffix=".tmp")
        os.close(fd)
    except OSError as exc:
        raise ConfigError(f"{option} {p}: cannot write in {anchor} ({exc.strerror}); "
                          "choose a writable place") from None
    finally:  # also when a signal turned into an exception lands between mkstemp and here
        if probe is not None:
            Path(probe).unlink(missing_ok=True)
    return p


# ============================================================================ reading


def _open_binary(path: Path) -> IO[bytes]:
    if path.name.lower().endswith(".gz"):
        return gzip.open(path, "rb")  # type: ignore[return-value]
    return open(path, "rb")


#: The environment variable that raises (or lowers) the longest line a reader accepts, in bytes.
MAX_LINE_ENV = "MARCONI_MAX_LINE_BYTES"
#: The default longest line: 64 MiB, about 8M token ids as JSON (a 32k-token request is ~200 KB).
DEFAULT_MAX_LINE_BYTES = 64 << 20


def line_limit(value: int | None = None) -> int:
    """The longest line a reader accepts: ``value``, else ``$MARCONI_MAX_LINE_BYTES``, else 64 MiB.

    Raises:
        ConfigError: ``value`` or the variable is not a whole number >= 1 (names which).
    """
    if value is None:
        text = os.environ.get(MAX_LINE_ENV, "").strip()
        if not text:
            return DEFAULT_MAX_LINE_BYTES
        try:
            value = int(text)
        except ValueError:
            raise ConfigError(f"{MAX_LINE_ENV}={text!r}: expected a whole number of bytes >= 1 "
                              f"(default {DEFAULT_MAX_LINE_BYTES})") from None
        source = MAX_LINE_ENV
    else:
        source = "max_line_bytes"
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{source}: expected a whole number of bytes >= 1, got {value!r}")
    return value


def iter_lines(path: PathLike, *, max_line_bytes: int | None = None) -> Iterator[tuple[int, bytes]]:
    """``(1-based line number, raw line with its newline)`` of a (``.gz``) file, blank lines included.

    Lines are split on ``\\n`` as bytes and decoded one by one (:func:`decode_line`), so a bad byte is
    reported on its own line -- a text-mode reader decodes ahead in blocks and misplaces it. A UTF-8
    byte order mark at the start of the file is dropped (a file holding only one is empty).

    Bounded: no line may be longer than ``max_line_bytes`` (see :func:`line_limit`; default 64
    MiB, or ``$MARCONI_MAX_LINE_BYTES``), so memory stays bounded by one line whatever the file
    holds -- a file without newlines, or a small gzip that expands to gigabytes of them. Only
    regular files are read (a symlink is followed): a device such as ``/dev/zero`` never ends and
    a FIFO blocks until written to, so both are refused before opening.

    Raises:
        FileNotFoundError, JsonError: a missing file, a directory, a device, FIFO or socket, an
            unreadable (corrupt gzip) stream, or a line over the limit -- the message names the
            file and the line where reading stopped (and, for a long line, how to raise the limit).
        ConfigError: a bad ``max_line_bytes`` or ``$MARCONI_MAX_LINE_BYTES``.
    """
    p = Path(path)
    limit = line_limit(max_line_bytes)
    check_readable(p)
    lineno = 0
    with _open_binary(p) as fh:
        try:
            while True:
                raw = fh.readline(limit + 1)
                if not raw:
                    return
                lineno += 1
                if len(raw) > limit:
                    raise JsonError(f"{p}:{lineno}", _too_long(limit))
                if lineno == 1 and raw.startswith(_UTF8_BOM):
                    raw = raw[len(_UTF8_BOM):]  # what Windows editors put first; not part of the data
                yield lineno, raw
        except (EOFError, OSError, gzip.BadGzipFile) as exc:
            raise JsonError(f"{p}:{lineno + 1}", f"unreadable ({type(exc).__name__}: {exc})") from None


_UTF8_BOM = b"\xef\xbb\xbf"


def _too_long(limit: int) -> str:
    return (f"line longer than {limit:,} bytes without a newline; stopped reading. If the file is not "
            f"a line-per-record file (a JSON array, a binary file) convert it; if the line is "
            f"legitimate, raise the limit with {MAX_LINE_ENV}=<bytes> (or max_line_bytes=)")


def decode_line(raw: bytes, where: str) -> str:
    """``raw`` as UTF-8 text; JsonError ``where: not UTF-8 ...`` otherwise."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise JsonError(where, f"not UTF-8 text (byte 0x{raw[exc.start]:02x} at column {exc.start + 1})") from None


def loads(text: str, where: str) -> Any:
    """``json.loads`` with the error as ``JsonError("where: ...")`` (also for absurd nesting)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        # only where the text ran out mid-value: the last line of a file cut short
        ran_out = exc.pos >= len(text.rstrip()) or exc.msg.startswith("Unterminated string")
        hint = "; the file looks truncated" if ran_out and not text.endswith("\n") else ""
        raise JsonError(where, f"invalid JSON: {exc.msg} (column {exc.colno}){hint}") from None
    except RecursionError:
        raise JsonError(where, "JSON nested too deeply to decode") from None


def iter_jsonl(path: PathLike, *, max_line_bytes: int | None = None) -> Iterator[tuple[str, Any]]:
    """``(where, value)`` for each non-blank line of a JSONL (``.jsonl.gz``) file; ``where`` = ``path:line``.

    Raises:
        FileNotFoundError: no such file.
        JsonError: the first line that is not UTF-8 or not JSON, or longer than ``max_line_bytes``
            (the message names file and line), or a file that is no regular file (:func:`iter_lines`).
    """
    for lineno, raw in iter_lines(path, max_line_bytes=max_line_bytes):
        if not raw.strip():
            continue
        where = f"{os.fspath(path)}:{lineno}"
        yield where, loads(decode_line(raw, where), where)


def read_jsonl(path: PathLike) -> list[Any]:
    """Every value of a JSONL file (see :func:`iter_jsonl`)."""
    return [obj for _, obj in iter_jsonl(path)]
