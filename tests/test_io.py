"""marconi.io: the one atomic writer and the one JSONL reader every command uses."""

import gzip
import json
import os
import stat
import sys
import threading

import pytest

from marconi.io import (JsonError, atomic_write, check_output, iter_jsonl, read_json, read_jsonl, write_jsonl,
                        write_text)
from marconi.core.registry import ConfigError


def _listing(path):
    return sorted(p.name for p in path.iterdir())


def test_new_files_get_the_usual_mode_and_replaced_files_keep_theirs(tmp_path):
    old = os.umask(0o022)
    try:
        write_text(tmp_path / "new.txt", "x")
        assert stat.S_IMODE((tmp_path / "new.txt").stat().st_mode) == 0o644  # not mkstemp's 0600
        os.umask(0o077)
        write_text(tmp_path / "private.txt", "x")
        assert stat.S_IMODE((tmp_path / "private.txt").stat().st_mode) == 0o600
    finally:
        os.umask(old)
    (tmp_path / "new.txt").chmod(0o640)
    write_text(tmp_path / "new.txt", "y")
    assert stat.S_IMODE((tmp_path / "new.txt").stat().st_mode) == 0o640


def test_an_exception_leaves_the_old_file_and_no_temp_file(tmp_path):
    target = tmp_path / "r.jsonl"
    target.write_text("old\n")
    with pytest.raises(KeyboardInterrupt):
        with atomic_write(target) as fh:
            fh.write("half")
            raise KeyboardInterrupt
    assert target.read_text() == "old\n"
    assert _listing(tmp_path) == ["r.jsonl"]


def test_a_symlink_is_followed_not_replaced(tmp_path):
    real = tmp_path / "real.jsonl"
    real.write_text("old\n")
    link = tmp_path / "link.jsonl"
    link.symlink_to(real)
    write_jsonl(link, [{"a": 1}])
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert real.read_text() == '{"a": 1}\n'
    dangling = tmp_path / "dangling.jsonl"
    dangling.symlink_to(tmp_path / "sub" / "made.jsonl")
    write_jsonl(dangling, [{"b": 2}])
    assert dangling.is_symlink() and (tmp_path / "sub" / "made.jsonl").read_text() == '{"b": 2}\n'


def test_dev_null_is_written_through_never_replaced(tmp_path):
    before = os.stat("/dev/null")
    write_jsonl("/dev/null", [{"a": 1}])
    after = os.stat("/dev/null")
    assert stat.S_ISCHR(after.st_mode) and (after.st_ino, after.st_rdev) == (before.st_ino, before.st_rdev)
    assert check_output("/dev/null") is not None


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no named pipes on this platform")
def test_a_fifo_is_written_through(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    received = []
    reader = threading.Thread(target=lambda: received.append(open(fifo).read()))
    reader.start()
    write_jsonl(fifo, [{"a": 1}, {"b": 2}])
    reader.join(timeout=30)
    assert received == ['{"a": 1}\n{"b": 2}\n']
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert _listing(tmp_path) == ["pipe"]


def test_directories_and_sockets_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="is a directory"):
        write_text(tmp_path, "x")
    with pytest.raises(ConfigError, match="is a directory"):
        check_output(tmp_path)
    if sys.platform.startswith("linux"):
        import socket

        sock_path = tmp_path / "s.sock"
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(sock_path))
        try:
            with pytest.raises(ConfigError, match="socket"):
                check_output(sock_path)
            with pytest.raises(ConfigError, match="socket"):
                write_text(sock_path, "x")
        finally:
            sock.close()


def test_check_output_catches_inputs_and_unwritable_places_without_creating_anything(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text("x\n")
    with pytest.raises(ConfigError, match="also an input"):
        check_output(trace, inputs=[str(trace)])
    link = tmp_path / "alias.jsonl"
    link.symlink_to(trace)
    with pytest.raises(ConfigError, match="also an input"):
        check_output(link, inputs=[str(trace)])
    with pytest.raises(ConfigError, match="not a directory"):
        check_output(trace / "r.jsonl")
    assert check_output(tmp_path / "new" / "deeper" / "r.jsonl") == tmp_path / "new" / "deeper" / "r.jsonl"
    assert check_output(tmp_path / "outdir", directory=True)
    with pytest.raises(ConfigError, match="not a directory"):
        check_output(trace, directory=True)
    assert _listing(tmp_path) == ["alias.jsonl", "t.jsonl"]  # nothing created, no probe left


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through directory permissions")
def test_check_output_refuses_a_read_only_directory(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        with pytest.raises(ConfigError, match="cannot write"):
            check_output(ro / "r.jsonl")
    finally:
        ro.chmod(0o755)


def test_check_output_refuses_a_place_even_root_cannot_write(tmp_path):
    if not os.path.isdir("/proc/self"):
        pytest.skip("no /proc")
    with pytest.raises(ConfigError, match="cannot write"):
        check_output("/proc/self/r.jsonl")


def test_iter_jsonl_names_file_and_line(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text('{"a": 1}\n\n[2]\n{"b": \n')
    it = iter_jsonl(path)
    assert next(it) == (f"{path}:1", {"a": 1})
    assert next(it) == (f"{path}:3", [2])
    with pytest.raises(JsonError, match=r"r\.jsonl:4: invalid JSON"):
        next(it)


def test_a_bad_byte_is_reported_on_its_own_line(tmp_path):
    lines = [json.dumps({"i": i}).encode() for i in range(400)]
    lines[299] = b'{"i": "\xff"}'
    path = tmp_path / "r.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    with pytest.raises(JsonError, match=r"r\.jsonl:300: not UTF-8") as info:
        read_jsonl(path)
    assert info.value.where == f"{path}:300"


def test_deep_nesting_is_an_error_not_a_crash(tmp_path):
    path = tmp_path / "deep.jsonl"
    path.write_text("[" * 100_000 + "]" * 100_000 + "\n")
    with pytest.raises(JsonError, match=r"deep\.jsonl:1: JSON nested too deeply"):
        read_jsonl(path)
    whole = tmp_path / "deep.json"
    whole.write_text("{\"a\": " * 100_000 + "1" + "}" * 100_000)
    with pytest.raises(JsonError, match="nested too deeply"):
        read_json(whole)


def test_gzip_and_directories(tmp_path):
    gz = tmp_path / "r.jsonl.gz"
    with gzip.open(gz, "wt") as fh:
        fh.write('{"a": 1}\n{"a": 2}\n')
    assert read_jsonl(gz) == [{"a": 1}, {"a": 2}]
    gz.write_bytes(gz.read_bytes()[:-12])  # cut the stream short
    with pytest.raises(JsonError, match="unreadable"):
        read_jsonl(gz)
    with pytest.raises(JsonError, match="is a directory"):
        read_jsonl(tmp_path)
    with pytest.raises(FileNotFoundError):
        read_jsonl(tmp_path / "missing.jsonl")


def test_read_json_names_the_line(tmp_path):
    path = tmp_path / "c.json"
    path.write_text('{\n  "a": 1,\n  "b": ,\n}\n')
    with pytest.raises(JsonError, match=r"c\.json:3: invalid JSON"):
        read_json(path)
    path.write_bytes(b'{\n"a": "\xfe"}\n')
    with pytest.raises(JsonError, match=r"c\.json:2: not UTF-8"):
        read_json(path)


# ----------------------------------------------------------------------------- hardening (issue 21)
def test_check_output_refuses_an_existing_file_inside_an_input_directory(tmp_path):
    """A model directory is read as a whole (config.json, weights ...): --out must not name any of its files."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    with pytest.raises(ConfigError, match=r"inside .*model.*, an input of this command"):
        check_output(model / "config.json", inputs=[model])
    link = tmp_path / "cfg-link.json"
    link.symlink_to(model / "config.json")
    with pytest.raises(ConfigError, match="an input of this command"):
        check_output(link, inputs=[model])
    assert check_output(model / "results.jsonl", inputs=[model])  # a new file there destroys nothing
    assert (model / "config.json").read_text() == "{}"


def test_check_output_of_a_replaced_directory_refuses_inputs_inside_it(tmp_path):
    out = tmp_path / "report"
    out.mkdir()
    table = out / "ttft.csv"
    table.write_text("tokens,ttft_ms\n1,1\n")
    with pytest.raises(ConfigError, match=r"ttft\.csv.*is inside --out"):
        check_output(out, directory=True, inputs=[table])
    assert check_output(out, directory=True, inputs=[tmp_path / "elsewhere.csv"])
    assert table.exists()


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full")
def test_a_full_device_error_names_the_file():
    with pytest.raises(OSError, match="No space left on device.*/dev/full") as info:
        write_jsonl("/dev/full", [{"a": 1}] * 10_000)
    assert info.value.errno == 28


def test_a_full_disk_error_names_the_file_and_leaves_nothing(tmp_path, monkeypatch):
    target = tmp_path / "r.jsonl"
    target.write_text("old\n")

    def full(fd):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError, match=r"No space left on device.*r\.jsonl") as info:
        write_jsonl(target, [{"a": 1}])
    assert info.value.errno == 28 and info.value.filename == str(target)
    assert target.read_text() == "old\n" and _listing(tmp_path) == ["r.jsonl"]


def test_atomic_directory_replaces_the_old_directory_only_when_complete(tmp_path):
    from marconi.io import atomic_directory

    out = tmp_path / "report"
    out.mkdir()
    (out / "old.md").write_text("old")
    (out / "fig.png").write_text("old png")
    with pytest.raises(KeyboardInterrupt):
        with atomic_directory(out) as stage:
            (stage / "fig.png").write_text("new png")
            raise KeyboardInterrupt  # interrupted half-way: the old report stays whole, nothing mixed
    assert _listing(out) == ["fig.png", "old.md"] and (out / "fig.png").read_text() == "old png"
    assert _listing(tmp_path) == ["report"]  # no staging directory left
    with atomic_directory(out) as stage:
        (stage / "new.md").write_text("new")
    assert _listing(out) == ["new.md"]  # the old files are gone, not mixed in
    assert _listing(tmp_path) == ["report"]
    old = os.umask(0o022)
    try:
        with atomic_directory(tmp_path / "fresh" / "made") as stage:
            (stage / "a").write_text("a")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "fresh" / "made").stat().st_mode) == 0o755  # not mkdtemp's 0700


def test_jsonl_written_under_a_gz_name_is_gzipped_and_reads_back(tmp_path):
    """Old: plain text under a .gz name, which the project's own reader then refused (audit)."""
    path = write_jsonl(tmp_path / "r.jsonl.gz", [{"a": 1}, {"b": [2, 3]}])
    assert gzip.decompress(path.read_bytes()).decode() == '{"a": 1}\n{"b": [2, 3]}\n'
    assert [rec for _, rec in iter_jsonl(path)] == [{"a": 1}, {"b": [2, 3]}]


def test_an_output_group_commits_its_files_together_or_not_at_all(tmp_path):
    """Companion outputs (records and their plot) were replaced one by one, so an interrupt between
    them left new records beside an earlier run's plot (audit)."""
    from marconi.io import output_group, write_text

    a, b = tmp_path / "a.jsonl", tmp_path / "a.png"
    write_text(a, "old a")
    write_text(b, "old b")
    with pytest.raises(KeyboardInterrupt):
        with output_group():
            write_text(a, "new a")
            assert a.read_text() == "old a"          # not in place until the group ends
            raise KeyboardInterrupt                  # before the plot is drawn
    assert (a.read_text(), b.read_text()) == ("old a", "old b")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.jsonl", "a.png"]      # no temp file left
    with output_group():
        write_text(a, "new a")
        with output_group():                         # a nested group joins the outer one
            write_text(b, "new b")
        assert b.read_text() == "old b"
    assert (a.read_text(), b.read_text()) == ("new a", "new b")


def test_a_full_disk_inside_a_staged_folder_names_the_folder(tmp_path):
    """Old: '[Errno 28] No space left on device' and no path (vllm diagnose, audit)."""
    import errno

    from marconi.io import atomic_directory

    with pytest.raises(OSError) as info:
        with atomic_directory(tmp_path / "R"):
            raise OSError(errno.ENOSPC, "No space left on device")
    assert info.value.filename == str(tmp_path / "R") and "free some space there" in str(info.value)
    assert not (tmp_path / "R").exists() and list(tmp_path.iterdir()) == []
