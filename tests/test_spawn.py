"""Children die with the command, scratch folders go, engine environments are probed (issue 31).

Every command that starts another program goes through :mod:`marconi.pool`'s one spawn helper and
one scratch folder; the engine's interpreter is checked once, up front, by
:func:`marconi.integrations.common.probe.probe_python`. The commands are exercised end to end with a
*fake* engine interpreter (a Python script that answers the probe and plays the vLLM replay worker or
SGLang's bench), so no vLLM or SGLang is needed here.

Linux only where a test reads /proc or relies on PR_SET_PDEATHSIG.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from marks import slow, slow_but_first

REPO = Path(__file__).resolve().parents[1]
LINUX = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc; PR_SET_PDEATHSIG is Linux's")


# ====================================================================================== helpers
def _alive(pid: int) -> bool:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return text[text.rindex(")") + 2:].split()[0] != "Z"     # a zombie has exited


def _wait_for(condition, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


def _assert_gone(pid: int, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.05)
    if _alive(pid):
        os.kill(pid, signal.SIGKILL)          # never leave it running after a failure
        raise AssertionError(f"child {pid} outlived its parent")


FAKE_ENGINE = """\
#!{python}
# A stand-in for an engine environment's python (issue 31 tests): answers the probe, then plays the
# vLLM replay worker (MODE=ok: writes a result; exit0: exits 0 without one; hang: waits forever) or
# SGLang's bench (prints nothing). Every invocation but the probe writes its pid to PIDS.
import json, os, sys, time
MODE, PIDS, PACKAGE = {mode!r}, {pids!r}, {package!r}
if len(sys.argv) > 1 and sys.argv[1] == "-c":                # marconi's probe
    print("marconi-probe", "3.11", "9.9.9" if sys.argv[-1] == PACKAGE else "-", "0.0.0")
    sys.exit(0)
with open(PIDS, "a") as fh:
    fh.write(f"{{os.getpid()}}\\n")
if MODE == "hang":
    time.sleep(600)
    sys.exit(0)
if MODE == "exit0" or "marconi.lab.sglang_bench" in sys.argv:
    sys.exit(0)
requests_path, out_path = sys.argv[3], sys.argv[4]           # -m MODULE requests.json out.json ...
n = len(json.load(open(requests_path))["requests"])
result = {{"vllm_version": "9.9.9", "kv_cache": {{"num_blocks": 50, "block_size": 16, "pool_bytes": 800, "groups": []}},
          "first_token_s": [0.1 * (i + 1) for i in range(n)], "arrival_s": [0.0] * n,
          "finish_s": [0.2 * (i + 1) for i in range(n)], "prefix_cache_hits": 0, "prefix_cache_queries": 10,
          "num_cached_tokens": [0] * n, "virtual_s": 1.0, "num_preemptions": [0] * n, "sched_s_per_step": 1e-5,
          "num_steps": 3, "scheduler": "fake", "plugin_evictions": None, "kv_bytes": 800, "kv_floor_applied": False,
          "num_params": 1, "wall_s": 0.01}}
with open(out_path, "w") as fh:
    json.dump(result, fh)
"""


def _fake_engine(tmp_path: Path, mode: str, package: str = "vllm") -> tuple[Path, Path]:
    """A fake engine python (executable script) and the file its invocations append their pids to."""
    pids = tmp_path / "pids"
    script = tmp_path / f"fake-{package}-python"
    script.write_text(FAKE_ENGINE.format(python=sys.executable, mode=mode, pids=str(pids), package=package))
    script.chmod(0o755)
    return script, pids


def _marconi(args: list[str], tmp_path: Path, **kw) -> subprocess.Popen:
    env = {**os.environ, "TMPDIR": str(tmp_path / "tmp")}
    env.pop("MARCONI_KEEP_SCRATCH", None)
    (tmp_path / "tmp").mkdir(exist_ok=True)
    return subprocess.Popen([sys.executable, "-m", "marconi.cli", *args], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True, **kw)


REPLAY = ["vllm", "replay", "--blocks", "50", "--concurrency", "1", "--num-requests", "2", "--no-emulation",
          "--plot", ""]


# ====================================================================================== the helper
PARENT = textwrap.dedent("""
    import sys, time
    from marconi.pool import child_process, sigterm_raises
    with sigterm_raises(), child_process([sys.executable, "-c", "import time; time.sleep(600)"]) as child:
        print(child.pid, flush=True)
        time.sleep(600)
""")


@LINUX
@pytest.mark.parametrize("sig", slow_but_first([signal.SIGTERM, signal.SIGINT, signal.SIGKILL]))
def test_child_dies_when_only_its_parent_is_signalled(sig):
    # issue 31, bug 11 (mechanism): SIGTERM / SIGINT to the parent alone, or kill -9, never leaves the child running.
    # SIGINT back to its default first: a runner started in the background (nohup ... &) ignores it, the parent
    # would inherit that, and Python raises KeyboardInterrupt only for a SIGINT not ignored at start-up.
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True, start_new_session=True,
                              preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    child = int(parent.stdout.readline())
    assert _alive(child)
    os.kill(parent.pid, sig)              # the parent alone: the child has its own process group
    parent.wait(timeout=30)
    _assert_gone(child)


def test_child_process_stops_the_child_when_the_body_raises():
    # issue 31, bug 11 (mechanism): an error in the with-body stops the child (and its group)
    from marconi.pool import child_process

    with pytest.raises(RuntimeError):
        with child_process([sys.executable, "-c", "import time; time.sleep(600)"], grace_s=5) as proc:
            raise RuntimeError("boom")
    assert proc.poll() is not None


def test_run_child_reports_a_program_that_cannot_run():
    # issue 31, bug 10 (mechanism): an unrunnable program is a status and a line, not an exception deep inside
    from marconi.pool import EXEC_FAILED, run_child

    proc = run_child(["/nonexistent/python", "-c", "pass"])
    assert proc.returncode == EXEC_FAILED
    assert "cannot run /nonexistent/python" in proc.stderr


def test_scratch_dir_goes_on_success_error_and_interrupt_unless_kept(tmp_path, monkeypatch):
    # issue 31, bug 12 (mechanism): temporary folders go however the block ends; a debug variable keeps them
    import tempfile

    from marconi.pool import KEEP_SCRATCH_ENV, scratch_dir

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.delenv(KEEP_SCRATCH_ENV, raising=False)
    with scratch_dir("marconi-test-") as work:
        (work / "requests.json").write_text("{}")
    for exc in (RuntimeError, KeyboardInterrupt):
        with pytest.raises(exc):
            with scratch_dir("marconi-test-") as work:
                raise exc()
    assert list(tmp_path.iterdir()) == []
    given = tmp_path / "mine"
    with scratch_dir("marconi-test-", given) as work:
        assert work == given
    assert given.is_dir()                         # a folder the caller named is theirs: kept
    monkeypatch.setenv(KEEP_SCRATCH_ENV, "1")
    with scratch_dir("marconi-test-") as work:
        pass
    assert work.is_dir()


# ====================================================================================== the probe
@pytest.mark.parametrize("python, said", [("/bin/true", "not a Python interpreter"),
                                          (sys.executable, "without vllm"),
                                          ("/nonexistent/python", "no such file")])
def test_probe_names_the_option_and_the_make_target(python, said):
    # issue 31, unclear row "--vllm-python pointing at a Python without vLLM, or at /bin/true"
    from marconi.core.registry import ConfigError
    from marconi.integrations.common.probe import probe_python

    if python == sys.executable and __import__("importlib").util.find_spec("vllm") is not None:
        pytest.skip("this interpreter has vllm")
    with pytest.raises(ConfigError) as err:
        probe_python(python, "vllm", option="--vllm-python", make_target="make vllm-env")
    message = str(err.value)
    assert message.startswith(f"--vllm-python {python}: ") and said in message and "make vllm-env" in message
    assert "\n" not in message


@slow
@pytest.mark.parametrize("python", ["/bin/true", sys.executable])
def test_vllm_replay_with_a_wrong_vllm_python_is_one_line(tmp_path, python):
    # issue 31, bug 10 / unclear row: no traceback, no log to dig in; the option and the fix are named
    proc = _marconi([*REPLAY, "--vllm-python", python, "--out", str(tmp_path / "r.jsonl")], tmp_path)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2, err
    assert "--vllm-python" in err and "make vllm-env" in err and "Traceback" not in err
    assert not (tmp_path / "r.jsonl").exists() and list((tmp_path / "tmp").iterdir()) == []


# ====================================================================================== vllm replay
@slow
@LINUX
def test_sigterm_to_vllm_replay_stops_its_worker_and_removes_the_scratch_folder(tmp_path):
    # issue 31, bugs 11 and 12: the worker is not left running (reparented to init), the trace's JSON not left in /tmp
    fake, pids = _fake_engine(tmp_path, "hang")
    proc = _marconi([*REPLAY, "--vllm-python", str(fake), "--out", str(tmp_path / "r.jsonl")], tmp_path)
    worker = _wait_for(lambda: pids.exists() and pids.read_text().split() and int(pids.read_text().split()[0]),
                       120, "the replay worker")
    assert list((tmp_path / "tmp").glob("marconi-replay-*"))
    os.kill(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=60) == 143
    _assert_gone(worker)
    assert list((tmp_path / "tmp").iterdir()) == []


@slow
def test_vllm_replay_removes_its_scratch_folder_on_success(tmp_path):
    # issue 31, bug 12: a run that succeeds leaves no /tmp/marconi-replay-* behind
    fake, _ = _fake_engine(tmp_path, "ok")
    out = tmp_path / "r.jsonl"
    proc = _marconi([*REPLAY, "--vllm-python", str(fake), "--out", str(out)], tmp_path)
    _, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err
    assert len(out.read_text().splitlines()) == 2          # lru and marconi
    assert list((tmp_path / "tmp").iterdir()) == []


@slow
def test_vllm_replay_worker_exiting_0_without_a_result_is_an_error(tmp_path):
    # issue 31, bug 10 (the replay's side): exit 0 and no result is a failure naming it; the folder still goes
    fake, _ = _fake_engine(tmp_path, "exit0")
    out = tmp_path / "r.jsonl"
    proc = _marconi([*REPLAY, "--vllm-python", str(fake), "--out", str(out)], tmp_path)
    _, err = proc.communicate(timeout=180)
    assert proc.returncode != 0 and "exit 0 without writing its result" in err, err
    assert not out.exists() and list((tmp_path / "tmp").iterdir()) == []


# ====================================================================================== sglang bench
SGLANG = ["sglang", "bench", "--num-requests", "3"]


@slow
@pytest.mark.parametrize("option, value, said", [("--model", "nosuch", "--model: unknown model 'nosuch'"),
                                                 ("--trace", "nosuch.jsonl", "--trace 'nosuch.jsonl'"),
                                                 ("--sglang-python", "/bin/true", "--sglang-python /bin/true: not a Python")])
def test_sglang_bench_checks_its_inputs_before_spawning(tmp_path, option, value, said):
    # issue 31, bug 10: --model nosuch / --trace nosuch.jsonl / --sglang-python /bin/true fail in the parent, one line
    fake, pids = _fake_engine(tmp_path, "ok", package="sglang")
    args = [*SGLANG, "--sglang-python", str(fake), "--out", str(tmp_path / "s.jsonl"), option, value]
    proc = _marconi(args, tmp_path)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2 and said in err and "Traceback" not in err, err
    assert not pids.exists()                      # the SGLang side never started
    assert not (tmp_path / "s.jsonl").exists()


@slow
def test_sglang_bench_child_exiting_0_without_records_is_an_error(tmp_path):
    # issue 31, bug 10: exit 0 with no records used to print an empty table and exit 0
    fake, pids = _fake_engine(tmp_path, "ok", package="sglang")
    proc = _marconi([*SGLANG, "--sglang-python", str(fake), "--out", str(tmp_path / "s.jsonl")], tmp_path)
    out, err = proc.communicate(timeout=120)
    assert pids.exists()
    assert proc.returncode == 1 and "0 of 2 records" in err, err
    assert "policy" not in out                    # no table


def test_sglang_bench_child_refuses_a_request_count_below_one():
    # issue 31, bug 10: --num-requests 0 / -3 never reach the replay (the child refuses them too)
    from marconi.lab.sglang_bench import main

    for n in ("0", "-3"):
        with pytest.raises(SystemExit) as err:
            main(["--num-requests", n])
        assert err.value.code == 2


# ====================================================================================== adaptive rules
def test_cutting_rule_in_marconi_vllm_adaptive_rules_is_refused_when_read():
    # issue 31, unclear row "MARCONI_VLLM_ADAPTIVE_RULES with a cutting rule": refused at config read time
    from marconi.core.registry import ConfigError
    from marconi.integrations.vllm.config import PluginConfig

    env = {"MARCONI_VLLM_POLICY": "marconi", "MARCONI_VLLM_ALPHA": "adaptive", "MARCONI_VLLM_ADAPTIVE_RULES": "lru/a0.5mt"}
    with pytest.raises(ConfigError) as err:
        PluginConfig.from_env(env)
    message = str(err.value)
    assert message.startswith("MARCONI_VLLM_ADAPTIVE_RULES='lru/a0.5mt'") and "a0.5mt" in message
    assert "lru/a0.5m/a2m" in message and "selector=" not in message


def test_vllm_align_refuses_a_cutting_rule_when_the_name_is_parsed():
    # issue 31, same row: vllm-align refused it only at run time, hinting at a selector= it does not have
    from marconi.core.registry import ConfigError
    from marconi.sim.systems import make_system

    with pytest.raises(ConfigError) as err:
        make_system("vllm-align:eviction=marconi,alpha=adaptive,rules=lru/a0.5mt")
    message = str(err.value)
    assert "rules=lru/a0.5mt" in message and "selector=" not in message and "lru/a0.5m/a2m" in message


def test_sglang_radix_rule_refuses_a_cutting_rule():
    # issue 31, same row, SGLang's side: its ranking cannot cut dead tails either
    from marconi.core.eviction import EvictionRule
    from marconi.core.registry import ConfigError
    from marconi.integrations.sglang.policy import radix_rule

    with pytest.raises(ConfigError):
        radix_rule(EvictionRule.from_label("a0.5mt"))
    assert radix_rule(EvictionRule.from_label("a2m")) == (2.0, "marginal")


# ====================================================================================== vllm frontier
@slow
@LINUX
def test_sigterm_to_vllm_frontier_stops_its_worker_and_removes_the_scratch_folder(tmp_path):
    # issue 31, bugs 11 and 12 (frontier): no worker left running, no /tmp/marconi-frontier-* left
    fake, pids = _fake_engine(tmp_path, "hang")
    args = ["vllm", "frontier", "--out", str(tmp_path / "front"), "--vllm-python", str(fake), "--traces", "swe-sample",
            "--limit", "2", "--budgets", "0", "--intervals", "0", "--arms", "dp", "--capacity", "0.05x"]
    proc = _marconi(args, tmp_path)
    worker = _wait_for(lambda: pids.exists() and pids.read_text().split() and int(pids.read_text().split()[0]),
                       120, "the replay worker")
    assert list((tmp_path / "tmp").glob("marconi-frontier-*"))
    os.kill(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=60) == 143
    _assert_gone(worker)
    assert list((tmp_path / "tmp").iterdir()) == []


def test_run_frontier_removes_its_scratch_folder_on_success(tmp_path, monkeypatch):
    # issue 31, bug 12 (frontier): a run that succeeds leaves no marconi-frontier-* behind
    import tempfile

    import marconi.integrations.vllm.replay.run as run
    from marconi.lab.frontier import FrontierConfig, run_frontier

    seen = []

    def fake_replay(config, *, work_dir=None, **kw):
        seen.append(Path(work_dir))
        assert Path(work_dir).parent.name.startswith("marconi-frontier-")
        return [{"per_request": {"num_cached_tokens": [0, 5]}, "states_per_request": 1.0, "prompt_tokens": 10,
                 "block_size": 16, "token_hit_rate": 0.5}]

    fake, _ = _fake_engine(tmp_path, "ok")
    monkeypatch.setattr(run, "run_replay", fake_replay)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    monkeypatch.delenv("MARCONI_KEEP_SCRATCH", raising=False)
    (tmp_path / "tmp").mkdir()
    config = FrontierConfig(vllm_python=str(fake), workloads=("swe-sample",), budgets=(0, 1), intervals=(),
                            pools=({"capacity": "0.05x"},), limit=2, families=("dp",))
    records = run_frontier(config)
    assert [r["arm"] for r in records] == ["dp-0", "dp-1"] and len(seen) == 2
    assert list((tmp_path / "tmp").iterdir()) == []


# ====================================================================================== bench servers
HEALTH_SERVER = textwrap.dedent("""
    import http.server, sys
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
        def log_message(self, *a):
            pass
    http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
""")


class _Launch:
    def args(self, port: int) -> list[str]:
        return [sys.executable, "-c", HEALTH_SERVER, str(port)]

    def environment(self) -> dict[str, str]:
        return dict(os.environ)


@slow
@LINUX
def test_a_bench_server_outlives_the_thread_that_waited_for_it(tmp_path):
    # issue 31, bug 11's mechanism: the death signal follows the spawning thread, so servers are spawned
    # by the caller's thread and only waited for in helper threads (serve_side_by_side); the server must
    # survive those threads and die at stop
    from concurrent.futures import ThreadPoolExecutor

    from marconi.integrations.common.server import ServerProcess

    server = ServerProcess(_Launch(), log_path=tmp_path / "server.log", startup_timeout_s=60, name="fake server")
    server.spawn()
    try:
        with ThreadPoolExecutor(1) as pool:
            pool.submit(server.wait_healthy).result()
        time.sleep(0.5)                                   # the helper thread has exited
        server.check_alive()
        pid = server.pid
    finally:
        server.stop()
    _assert_gone(pid)


LITTERING_SERVER = textwrap.dedent("""
    import json, os, sys, tempfile, time
    open(os.path.join(tempfile.gettempdir(), "left-by-the-engine"), "w").close()
    names = ("TMPDIR", "PROMETHEUS_MULTIPROC_DIR", "TORCHINDUCTOR_CACHE_DIR")
    with open(sys.argv[1] + ".part", "w") as fh:
        json.dump({n: os.environ.get(n) for n in names}, fh)
    os.rename(sys.argv[1] + ".part", sys.argv[1])
    time.sleep(600)
""")


@LINUX
@pytest.mark.parametrize("cache", [None, "given"])
def test_a_server_leaves_nothing_in_the_temp_folder(tmp_path, cache):
    # what an engine server writes to its temporary folder (vLLM: a ZMQ socket per connection, a
    # vllm_dist_* store per worker) goes with it at stop; torch's compile cache stays shared: where
    # torch would have put it, or where the environment already says
    from marconi.integrations.common.server import ServerProcess

    outer, seen = tmp_path / "tmp", tmp_path / "seen.json"
    outer.mkdir()
    given = str(tmp_path / "inductor")

    class Littering:
        def args(self, port: int) -> list[str]:
            return [sys.executable, "-c", LITTERING_SERVER, str(seen)]

        def environment(self) -> dict[str, str]:
            env = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_CACHE_DIR"}
            return {**env, "TMPDIR": str(outer), **({"TORCHINDUCTOR_CACHE_DIR": given} if cache else {})}

    server = ServerProcess(Littering(), log_path=tmp_path / "server.log", name="fake server")
    server.spawn()
    try:
        deadline = time.monotonic() + 60
        while not seen.exists():
            assert time.monotonic() < deadline, server.log_tail()
            time.sleep(0.05)
        env = json.loads(seen.read_text())
        assert Path(env["TMPDIR"], "left-by-the-engine").exists()
    finally:
        server.stop()
    assert not Path(env["TMPDIR"]).exists() and not Path(env["PROMETHEUS_MULTIPROC_DIR"]).exists()
    assert Path(env["TMPDIR"]).parent == Path(env["PROMETHEUS_MULTIPROC_DIR"]).parent
    if cache:
        assert env["TORCHINDUCTOR_CACHE_DIR"] == given
    else:
        assert env["TORCHINDUCTOR_CACHE_DIR"].startswith(str(outer / "torchinductor_"))
    assert list(outer.iterdir()) == []


SERVER_PARENT = textwrap.dedent("""
    import os, sys, time
    sys.path.insert(0, sys.argv[1])
    from test_spawn import _Launch
    from marconi.integrations.common.server import ServerProcess
    server = ServerProcess(_Launch(), log_path=sys.argv[2], startup_timeout_s=60)
    server.start()
    print(server.pid, flush=True)
    time.sleep(600)
""")


@slow
@LINUX
def test_a_bench_server_dies_with_a_killed_bench(tmp_path):
    # issue 31, bug 11's mechanism for `marconi vllm bench`: kill -9 of the bench leaves no server running
    # (its server's scratch folder, which nothing can remove after a kill -9, goes to this test's folder)
    (tmp_path / "tmp").mkdir()
    parent = subprocess.Popen([sys.executable, "-c", SERVER_PARENT, str(Path(__file__).parent), str(tmp_path / "log")],
                              stdout=subprocess.PIPE, text=True, start_new_session=True,
                              env={**os.environ, "TMPDIR": str(tmp_path / "tmp")})
    server = int(parent.stdout.readline())
    assert _alive(server)
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait(timeout=30)
    _assert_gone(server)


# ====================================================================================== the real vLLM worker
def _descendants(root: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                text = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            children.setdefault(int(text[text.rindex(")") + 2:].split()[1]), []).append(int(entry))
    out, todo = set(), [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in out:
                out.add(child)
                todo.append(child)
    return out


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


@slow
@LINUX
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "kill-9"])
def test_signal_to_vllm_replay_stops_the_real_vllm_worker(tmp_path, sig):
    # issue 31, bug 11 with vLLM itself (.venv-vllm): the worker, reparented to init before, dies with the command
    from vllm_env import vllm_python

    python = vllm_python()
    args = ["vllm", "replay", "--vllm-python", python, "--blocks", "400", "--concurrency", "4", "--num-requests", "300",
            "--no-emulation", "--plot", "", "--policies", "lru", "--out", str(tmp_path / "r.jsonl")]
    proc = _marconi(args, tmp_path)

    def worker():
        if proc.poll() is not None:
            raise AssertionError(f"the replay exited early ({proc.returncode}): {proc.stderr.read()[-2000:]}")
        found = [p for p in _descendants(proc.pid) if b"replay.worker" in _cmdline(p)]
        return found[0] if found else None
    pid = _wait_for(worker, 300, "the vLLM replay worker")
    time.sleep(2.0)                                       # let it import vLLM and start
    os.kill(proc.pid, sig)
    proc.wait(timeout=120)
    _assert_gone(pid, timeout_s=60)
    if sig == signal.SIGTERM:                             # kill -9 runs no clean-up: only the worker is checked
        assert list((tmp_path / "tmp").iterdir()) == []


# ====================================================================================== the mechanism
SPAWNS = {("subprocess", "Popen"), ("subprocess", "run"), ("subprocess", "call"), ("subprocess", "check_call"),
          ("subprocess", "check_output"), ("os", "system"), ("os", "popen"), ("os", "spawnv"), ("os", "spawnl")}
# mkdtemp folders the library removes itself: io.py's staging (renamed or removed), the server's metrics dir
MKDTEMP_OWNERS = {"pool.py", "io.py", "integrations/common/server.py"}


def test_only_the_spawn_helper_starts_programs_and_makes_scratch_folders():
    # issue 31, "the same helper everywhere": a new command cannot spawn or leave a temp folder its own way
    import ast

    src = REPO / "src" / "marconi"
    offending = []
    for path in src.rglob("*.py"):
        rel = path.relative_to(src).as_posix()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and isinstance(node.func.value, ast.Name):
                pair = (node.func.value.id, node.func.attr)
                if pair in SPAWNS and rel != "pool.py":
                    offending.append(f"{rel}:{node.lineno}: {'.'.join(pair)} (use marconi.pool.spawn/run_child)")
                if pair == ("tempfile", "mkdtemp") and rel not in MKDTEMP_OWNERS:
                    offending.append(f"{rel}:{node.lineno}: tempfile.mkdtemp (use marconi.pool.scratch_dir)")
    assert not offending, "\n".join(offending)


@slow
def test_a_real_vllm_replay_leaves_nothing_in_the_temp_folder(tmp_path):
    # issue 31, bug 12 with vLLM itself: neither the scratch folder nor the worker's own temp files
    # (gloo's marconi-replay-dist-* store) stay behind after a successful run
    from vllm_env import vllm_python

    args = ["vllm", "replay", "--vllm-python", vllm_python(), "--blocks", "400", "--concurrency", "2",
            "--num-requests", "4", "--policies", "lru", "--plot", "", "--out", str(tmp_path / "r.jsonl")]
    proc = _marconi(args, tmp_path)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    assert len((tmp_path / "r.jsonl").read_text().splitlines()) == 1
    assert list((tmp_path / "tmp").iterdir()) == []
