"""Files, in one place: :func:`atomic_write` / :func:`atomic_directory` (nothing half-written, special
targets never replaced), bounded JSONL reads with ``path:line`` :class:`JsonError`, and
:func:`check_output`, run before long work so a result is never lost or written over an input.
The rules in full: docs/architecture.md ("Files")."""

from __future__ import annotations

import errno
import gzip
import json
import os
import shutil
import stat
import tempfile
import threading
import zlib
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, Iterable, Iterator, Sequence

from marconi.core.jsonfile import JsonError, check_readable, read_json
from marconi.core.registry import ConfigError

__all__ = ["atomic_write", "atomic_directory", "output_group", "check_replaceable", "check_records_file",
           "refuse_foreign_files",
           "FOLDER_MANIFEST", "write_text", "write_jsonl", "iter_lines", "iter_jsonl",
           "read_jsonl", "read_json", "decode_line", "loads", "check_output", "partial_path", "suffix_refusal",
           "is_stream", "JsonError", "open_binary",
           "line_limit", "MAX_LINE_ENV", "DEFAULT_MAX_LINE_BYTES"]

PathLike = str | os.PathLike


# ============================================================================ writing


def _new_file_mode(target: Path, base: int = 0o666) -> int:
    """The mode ``open()`` (``mkdir()`` with ``base=0o777``) gives a new ``target``; an existing one keeps
    its own."""
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


def _refusal(path: Path, st: os.stat_result, suffix: str = ".jsonl") -> str | None:
    """Why ``path`` (with stat ``st``) cannot be an output file (one ending in ``suffix``), or None."""
    if stat.S_ISDIR(st.st_mode):
        return f"{path} is a directory: give a file name (e.g. {path / ('results' + suffix)})"
    if stat.S_ISSOCK(st.st_mode) or stat.S_ISBLK(st.st_mode):
        return f"{path} is a {'socket' if stat.S_ISSOCK(st.st_mode) else 'block device'}, not a file: refusing to write it"
    return None


@contextmanager
def atomic_write(path: PathLike, mode: str = "w") -> Iterator[IO[Any]]:
    """Open ``path`` (``"w"`` UTF-8 or ``"wb"``), creating parents; committed only on success. Raises
    ConfigError for a directory, socket or block device; OSError (naming ``path``) if it cannot be written."""
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_write: mode must be 'w' or 'wb', got {mode!r}")
    encoding = None if mode == "wb" else "utf-8"
    target = Path(os.path.realpath(path))  # a symlink's target is replaced; the link itself stays
    try:   # the path as given: /dev/stdout into a pipe resolves to "pipe:[N]", which names no file
        st: os.stat_result | None = os.stat(path)
    except FileNotFoundError:
        st = None
    if st is not None:
        refusal = _refusal(Path(path), st)
        if refusal:
            raise ConfigError(refusal)
        if _is_stream(st):
            try:
                with open(path, mode, encoding=encoding) as fh:
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
            group = getattr(_GROUP, "pending", None)
            if group is not None:   # committed with the others when the group ends (output_group)
                group.append((tmp_name, target))
                return
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


_GROUP = threading.local()


@contextmanager
def output_group() -> Iterator[None]:
    """Files that :func:`atomic_write` (and what builds on it: :func:`write_jsonl`, plots through
    ``marconi.report.save_figure``) finishes inside this block are renamed into place together when it
    ends, and none is if it raises or is interrupted: a command's companion outputs (records and
    their plot) are never left half new, half from an earlier run. A file written inside the block
    cannot be read back inside it. Nested groups join the outer one; one group per thread."""
    if getattr(_GROUP, "pending", None) is not None:
        yield
        return
    pending: list[tuple[str, Path]] = []
    _GROUP.pending = pending
    try:
        yield
    except BaseException:
        _GROUP.pending = None
        for tmp_name, _ in pending:
            Path(tmp_name).unlink(missing_ok=True)
        raise
    _GROUP.pending = None
    for i, (tmp_name, target) in enumerate(pending):
        try:
            os.replace(tmp_name, target)
        except BaseException:
            for later, _ in pending[i:]:
                Path(later).unlink(missing_ok=True)
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
def atomic_directory(path: PathLike, *, writer: str | None = None, known: Iterable[str] = (),
                     records: tuple[str, str, Any] | None = None) -> Iterator[Path]:
    """A staging directory that replaces ``path`` as a whole only if the body completes (readers see old
    or new, never a mix; removed on any exception). ConfigError if ``path`` is not a directory.

    ``writer`` (a command, e.g. ``"marconi vllm diagnose"``): the folder is first checked by
    :func:`check_replaceable` with ``known`` and ``records`` (so a folder of someone else's files is
    refused before anything is staged), and the new one lists its files in :data:`FOLDER_MANIFEST`."""
    target = Path(os.path.realpath(path))
    if target.exists() and not target.is_dir():
        raise ConfigError(f"{path} exists and is not a directory")
    if writer is not None:
        check_replaceable(path, writer, known=known, records=records)
    target.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.", suffix=".staging"))
    try:
        with _no_space_named(path):       # a full disk names the folder, not [Errno 28] alone
            yield stage
        if writer is not None:
            files = sorted(p.name for p in stage.iterdir())
            (stage / FOLDER_MANIFEST).write_text(json.dumps({"writer": writer, "files": files}) + "\n")
        os.chmod(stage, _new_file_mode(target, 0o777))
        _swap_in(stage, target)
    finally:
        shutil.rmtree(stage, ignore_errors=True)  # gone already after a swap


#: The file in which a folder that :func:`atomic_directory` wrote for a ``writer`` lists its files.
FOLDER_MANIFEST = ".marconi-folder.json"


def check_records_file(path: PathLike, field: str, *, flag: str = "--out") -> None:
    """Checked before a run that replaces (or appends to) the records file ``path``: nothing where it is
    new, empty or a stream; ConfigError naming ``flag`` where its first line is not a JSON object
    holding ``field`` (the records this kind of run writes), so that a run never destroys a file that
    is not its own results (a trace, notes) by a mistyped ``--out``."""
    p = Path(path)
    try:
        if is_stream(p) or not p.is_file() or p.stat().st_size == 0:
            return
        first = next((value for _, value in iter_jsonl(p)), None)
    except (OSError, ValueError):        # JsonError (a ValueError): a first line that is not JSON, or not UTF-8
        first = None
    if not (isinstance(first, dict) and field in first):
        raise ConfigError(f"{flag} {p} exists and is not result records (its first line is not a record with "
                          f"{field!r}): this run would replace it; remove it or choose another path")


def check_replaceable(path: PathLike, writer: str, *, flag: str = "--out", known: Iterable[str] = (),
                      records: tuple[str, str, Any] | None = None) -> str | None:
    """Whether a run of ``writer`` may replace the folder ``path`` whole, checked before the run: None
    where it is new or empty; a line to show where it holds an earlier report of ``writer``. A folder
    is that only where its :data:`FOLDER_MANIFEST` names ``writer`` (and lists every file in it), or,
    for a report written before manifests, where it has no manifest, every file in it is one of
    ``known``, and ``records`` (``(name, field, value)``) says it holds ``writer``'s own records: its
    file ``name`` is JSONL whose first record has ``field`` equal to ``value`` (or every file in it is
    empty: replacing them loses nothing). Without ``records`` a folder with no manifest is never an
    earlier report. ConfigError naming ``flag`` otherwise: a file;
    a folder whose manifest is another writer's (or unreadable); a folder of files with a report's
    names but not its records (a user's ``report.md``, another command's ``records.jsonl``); or an
    earlier report beside files it did not write (all of them would be lost with it)."""
    target = Path(path)
    if target.exists() and not target.is_dir():
        raise ConfigError(f"{flag} {path} exists and is not a directory")
    if not target.is_dir():
        return None
    present = sorted(p.name for p in target.iterdir())
    if not present:
        return None
    shown = ", ".join(present[:3]) + (f" and {len(present) - 3} more" if len(present) > 3 else "")
    refusal = (f"{flag} {path} is not empty and holds no report of `{writer}` (it holds {shown}): the report "
               "replaces the whole folder, so its files would be lost; choose a new or empty folder")
    manifest_path = target / FOLDER_MANIFEST
    if manifest_path.exists() or manifest_path.is_symlink():
        try:
            manifest: Any = json.loads(manifest_path.read_text())
        except (OSError, ValueError):
            manifest = None
        other = manifest.get("writer") if isinstance(manifest, dict) else None
        if other != writer or not isinstance(manifest.get("files"), list):
            whose = (f"`{other}`'s output" if isinstance(other, str) and other != writer else
                     f"a {FOLDER_MANIFEST} that is not `{writer}`'s")
            raise ConfigError(f"{flag} {path} holds {whose} (its {FOLDER_MANIFEST}), not a report of `{writer}`: the "
                              "report replaces the whole folder, so its files would be lost; choose a new or empty "
                              "folder")
        ours = {str(name) for name in manifest["files"]}
    else:
        ours = set(known)
        if (records is None or not set(present) <= ours
                or not (_holds_records(target / records[0], *records[1:]) or _all_empty(target, present))):
            raise ConfigError(refusal)
    extra = [name for name in present if name not in ours and name != FOLDER_MANIFEST]
    if extra and len(extra) == len([name for name in present if name != FOLDER_MANIFEST]):
        raise ConfigError(refusal)
    refuse_foreign_files(path, extra, flag=flag)
    return f"the report already in {path} is replaced once this run completes; until then it stays as it is"


def _all_empty(folder: Path, names: Sequence[str]) -> bool:
    """Whether every one of ``names`` in ``folder`` is an empty regular file (replacing them loses nothing)."""
    try:
        return all((folder / n).is_file() and not (folder / n).is_symlink() and (folder / n).stat().st_size == 0
                   for n in names)
    except OSError:
        return False


def _holds_records(path: Path, field: str, value: Any) -> bool:
    """Whether ``path`` is a regular file of JSONL whose first record has ``field`` equal to ``value``."""
    try:
        if not path.is_file() or path.is_symlink():
            return False
        first = next((obj for _, obj in iter_jsonl(path)), None)
    except (OSError, ValueError):      # JsonError (a ValueError): not JSON, not UTF-8
        return False
    return isinstance(first, dict) and first.get(field) == value


def refuse_foreign_files(path: PathLike, extra: Sequence[str], *, flag: str = "--out", noun: str = "folder") -> None:
    """ConfigError naming the first of ``extra`` (files in ``path``, an earlier report's folder, that the
    report did not write), if any: replacing the folder whole would lose them."""
    if extra:
        shown = ", ".join(extra[:5]) + (f" and {len(extra) - 5} more" if len(extra) > 5 else "")
        raise ConfigError(f"{flag} {path} holds an earlier report and files it did not write ({shown}): the report "
                          f"replaces the whole {noun}, so they would be lost; move them, or choose a new or empty "
                          f"{noun}")


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
    """Write one ``json.dumps`` line per record, atomically, gzipped where the name ends in ``.gz``
    (as the readers expect); returns ``path``."""
    if str(path).endswith(".gz"):
        import io as _io

        with atomic_write(path, "wb") as raw:
            with gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as packed:
                with _io.TextIOWrapper(packed, encoding="utf-8") as fh:
                    for rec in records:
                        fh.write(json.dumps(rec) + "\n")
        return Path(path)
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


def partial_path(path: PathLike) -> Path:
    """Where a run that failed part-way writes what it finished instead of ``path``, which keeps what it
    held (an earlier good run's file is never replaced by a partial one): beside it, so the place
    :func:`check_output` found writable is the same. ``results.jsonl`` -> ``results.partial.jsonl``."""
    p = Path(path)
    return p.with_name(f"{p.stem}.partial{p.suffix}")


def suffix_refusal(path: PathLike, suffixes: Sequence[str]) -> str | None:
    """Why ``path`` cannot be an output written in the format of ``suffixes`` (the first one named in
    advice; compared case-insensitively), or None: a directory, or a file name with another suffix
    (the writer would put, say, a PNG under ``.svg``). A stream (``/dev/null``) takes any format."""
    p = Path(path)
    try:
        st: os.stat_result | None = p.stat()
    except OSError:
        st = None
    if st is not None and stat.S_ISDIR(st.st_mode):
        return _refusal(p, st, suffixes[0])
    if st is not None and _is_stream(st):
        return None
    if not any(p.name.lower().endswith(s.lower()) for s in suffixes):
        try:
            example = p.with_suffix(suffixes[0])
        except ValueError:  # no name to put a suffix on ("..")
            example = p / f"results{suffixes[0]}"
        return (f"{p} does not end in {' or '.join(suffixes)}, the only format written there: give a name "
                f"such as {example}")
    return None


def check_output(path: PathLike, *, inputs: Sequence[PathLike] = (), directory: bool = False,
                 option: str = "--out", suffixes: Sequence[str] = ()) -> Path:
    """Check, before long work, that ``path`` can be written and destroys none of ``inputs`` (an input
    directory stands for its files). ``directory``: ``path`` is filled by :func:`atomic_directory`, so
    no input may lie inside it. ``suffixes``: the file is written in their format only, so its name
    must end in one (:func:`suffix_refusal`; checked last). Creates nothing. ConfigError saying what
    is wrong and what to do."""
    p = Path(path)
    for source in inputs:
        src = Path(source)
        if not src.exists():           # an input that a later read looks for (a trace's sidecar)
            if not directory and _same_file(p, src):
                raise ConfigError(f"{option} {p} is read by this command where it exists ({src}: a trace's "
                                  "sidecar); writing it would break that input: choose another output path")
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
            refusal = _refusal(p, st, *suffixes[:1])
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
    except OSError as exc:  # the file is written as a new one beside its name, then renamed
        # ENOENT from an existing directory: a pseudo file system (/proc, /sys) that takes no new files
        reason = "it takes no new files" if exc.errno == errno.ENOENT else exc.strerror or str(exc)
        replaced = ", so the existing file cannot be replaced" if st is not None else ""
        raise ConfigError(f"{option} {p}: cannot write in {anchor} ({reason}{replaced}); "
                          "choose a writable place") from None
    finally:  # also when a signal turned into an exception lands between mkstemp and here
        if probe is not None:
            Path(probe).unlink(missing_ok=True)
    refusal = suffix_refusal(p, suffixes) if suffixes and not directory else None
    if refusal:
        raise ConfigError(f"{option}: {refusal}")
    return p


# ============================================================================ reading


def open_binary(path: PathLike) -> IO[bytes]:
    """``path``'s bytes, through gzip when its name ends in ``.gz`` (any case). OSError as ``open``;
    a bad gzip stream raises on read (OSError, EOFError or ``zlib.error``)."""
    if Path(path).name.lower().endswith(".gz"):
        return gzip.open(path, "rb")  # type: ignore[return-value]
    return open(path, "rb")


#: The environment variable that raises (or lowers) the longest line a reader accepts, in bytes.
MAX_LINE_ENV = "MARCONI_MAX_LINE_BYTES"
#: The default longest line: 64 MiB, about 8M token ids as JSON (a 32k-token request is ~200 KB).
DEFAULT_MAX_LINE_BYTES = 64 << 20


def line_limit(value: int | None = None) -> int:
    """The longest line a reader accepts: ``value``, else ``$MARCONI_MAX_LINE_BYTES``, else 64 MiB.
    ConfigError if it is not a whole number >= 1."""
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
    """``(1-based line number, raw line)`` of a (``.gz``) regular file, blanks included, split as bytes
    (a bad byte stays on its line; a leading BOM dropped), each at most ``max_line_bytes``
    (:func:`line_limit`). Raises FileNotFoundError or JsonError (naming file and line) for a missing,
    irregular or corrupt file or an over-long line; ConfigError for a bad limit."""
    p = Path(path)
    limit = line_limit(max_line_bytes)
    check_readable(p)
    lineno = 0
    with open_binary(p) as fh:
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
        except (EOFError, OSError, zlib.error) as exc:      # a gzip stream cut short, not gzip, or corrupt
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
        # where the text ran out mid-value: a line cut short (the file's last: the file truncated)
        body = text.rstrip()
        ran_out = exc.pos >= len(body) or exc.msg.startswith("Unterminated string")
        if "\n" in body:                     # a whole document: its line too
            at = f"line {exc.lineno} column {exc.colno}"
        else:                                # one line: the decoder's position past its newline is its end
            at = f"column {min(exc.pos, len(body)) + 1}"
        hint = ("" if not ran_out else "; the line looks cut short" if text.endswith("\n")
                else "; the file looks truncated")
        raise JsonError(where, f"invalid JSON: {exc.msg} ({at}){hint}") from None
    except RecursionError:
        raise JsonError(where, "JSON nested too deeply to decode") from None
    except ValueError as exc:       # an integer of more digits than Python converts (sys.get_int_max_str_digits)
        raise JsonError(where, f"invalid JSON value: {exc}") from None


def iter_jsonl(path: PathLike, *, max_line_bytes: int | None = None) -> Iterator[tuple[str, Any]]:
    """``(where, value)`` per non-blank line of a JSONL (``.gz``) file, ``where`` = ``path:line``;
    FileNotFoundError, or JsonError for the first bad line or an irregular file."""
    for lineno, raw in iter_lines(path, max_line_bytes=max_line_bytes):
        if not raw.strip():
            continue
        where = f"{os.fspath(path)}:{lineno}"
        yield where, loads(decode_line(raw, where), where)


def read_jsonl(path: PathLike) -> list[Any]:
    """Every value of a JSONL file (see :func:`iter_jsonl`)."""
    return [obj for _, obj in iter_jsonl(path)]
