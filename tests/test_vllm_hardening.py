"""Issue 21, the vLLM plugin's cases: a setting that cannot run is loud, stock vLLM is never stopped,
the α-source factory fails clearly, the bench checks its options before any server starts.

Most cases need no vLLM: the plugin's configuration and registration are importable without it
(registration fails before it would import vLLM). The one test that needs vLLM's own block pool
runs it in the vLLM environment through a subprocess; under ``MARCONI_REQUIRE_VLLM=1`` a missing
environment fails it, under a plain ``pytest`` it skips, saying why.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from marconi.cli import main
from marconi.core.model import ModelSpec, get_model
from marconi.core.registry import ConfigError
from marconi.integrations.vllm import plugin
from marconi.lab import vllm_bench as bench
from marconi.lab.vllm_bench import BenchConfig, run_bench
from marconi.integrations.vllm.config import PluginConfig
from marconi.integrations.vllm.models import PRESETS
from marconi.sim.sweep import PointsFailed, expand_points, run_sweep
from marconi.sim.systems import make_system
from marconi.workloads import build_workload
from vllm_env import VLLM_PYTHON, require_vllm

REPO = Path(__file__).resolve().parents[1]
SPEC = get_model("paper-7b")
QWEN_TINY_CONFIG = {"model_type": "qwen3_next", **PRESETS["qwen3_next-tiny"][1], "torch_dtype": "bfloat16"}
UNWRITABLE = "/proc/nope/blocks.jsonl"       # no such directory, even for root


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """A clean plugin environment; registration forgotten before and after."""
    for name in list(os.environ):
        if name.startswith("MARCONI_VLLM_"):
            monkeypatch.delenv(name)
    plugin.reset_registration()
    yield monkeypatch
    plugin.reset_registration()


# ====================================================================================== bug 12
def test_an_unwritable_trace_stops_registration_naming_the_variable(env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Bug 12: a typo in MARCONI_VLLM_TRACE used to turn Marconi's eviction off (vLLM ran LRU, one
    log line said so). Now registration refuses, before it imports vLLM, so vLLM does not start."""
    env.setenv("MARCONI_VLLM_POLICY", "marconi")
    for bad in (UNWRITABLE, str(tmp_path), str(tmp_path / "missing-dir" / "t.jsonl")):
        env.setenv("MARCONI_VLLM_TRACE", bad)
        plugin.reset_registration()
        with pytest.raises(ConfigError, match=rf"MARCONI_VLLM_TRACE={bad!r}: cannot append to it"):
            plugin.register()


def test_a_trace_that_fails_at_attach_is_refused_not_run_stock(tmp_path: Path,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    """Bug 12, the engine core's half: the hooks open the trace before they touch vLLM, and a
    setting that cannot run propagates out of the scheduler hook (vLLM's engine core does not
    start). Only a vLLM the hooks do not fit runs stock, logged."""
    with pytest.raises(plugin.PluginSettingError, match="MARCONI_VLLM_TRACE"):
        plugin.attach_hooks(object(), PluginConfig(policy="marconi", trace_path=UNWRITABLE))
    with caplog.at_level(logging.ERROR, logger="marconi.integrations.vllm"):
        assert plugin.attach_hooks(object(), PluginConfig(policy="marconi", trace_path=str(tmp_path / "t"))) is None
    assert "vLLM runs with its own eviction" in caplog.text


# ====================================================================================== bug 16
def _raising_factory(spec: object, config: object) -> object:
    raise RuntimeError("my source is broken")


def _no_arguments() -> object:
    return None


NOT_CALLABLE = 42


def test_a_wrong_alpha_source_factory_is_a_config_error_naming_the_variable(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Bug 16: a factory that raises, takes other arguments, is not callable, or whose module fails
    to import gave a traceback; every one is a ConfigError naming MARCONI_VLLM_ALPHA_SOURCE and its value."""
    (tmp_path / "broken_source_module.py").write_text("raise RuntimeError('import-time bug')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for target, match in ((f"{__name__}:_raising_factory", "raised RuntimeError: my source is broken"),
                          (f"{__name__}:_no_arguments", "raised TypeError"),
                          (f"{__name__}:NOT_CALLABLE", "is not callable"),
                          (f"{__name__}:absent", "cannot load it"),
                          ("broken_source_module:f", "cannot load it .RuntimeError: import-time bug")):
        config = PluginConfig(policy="marconi", alpha_source=target)
        with pytest.raises(ConfigError, match=rf"^MARCONI_VLLM_ALPHA_SOURCE={target!r}: .*{match}"):
            config.make_alpha_source(SPEC)
    for half in ("json:", ":loads", " : "):
        with pytest.raises(ConfigError, match="write module:factory"):
            PluginConfig(policy="marconi", alpha_source=half)


def test_an_unloadable_alpha_source_stops_registration(env: pytest.MonkeyPatch) -> None:
    """Bug 16 in the plugin: the module is imported and the factory found at registration (every
    vLLM process), so a typo stops vLLM before a server starts, not inside the engine core."""
    env.setenv("MARCONI_VLLM_POLICY", "marconi")
    env.setenv("MARCONI_VLLM_ALPHA_SOURCE", "no_such_module_here:make")
    with pytest.raises(ConfigError, match="MARCONI_VLLM_ALPHA_SOURCE='no_such_module_here:make': cannot load it"):
        plugin.register()


def test_the_simulators_alpha_source_errors_name_the_system_parameter() -> None:
    """Bug 16 in the simulator: ``vllm-align:alpha_source=`` errors named MARCONI_VLLM_ALPHA_SOURCE,
    a variable the user never set. An unloadable one fails with the name (before any point runs); a
    factory that raises fails where the cache is built, both naming the system parameter."""
    with pytest.raises(ConfigError, match="vllm-align: alpha_source='no_such_module_here:make': cannot load") as info:
        make_system("vllm-align:eviction=marconi,alpha_source=no_such_module_here:make")
    assert "MARCONI_VLLM" not in str(info.value)
    with pytest.raises(ConfigError, match="vllm-align: alpha_source=") as info:
        expand_points(["vllm-align:eviction=marconi,alpha_source=no_such_module_here:make"], ["1GB"], ["paper-7b"])
    system = make_system(f"vllm-align:eviction=marconi,block=384,blocks=60,alpha_source={__name__}:_raising_factory")
    spec = ModelSpec.from_hf_config(QWEN_TINY_CONFIG, name="qwen3_next-tiny")
    with pytest.raises(ConfigError, match=r"vllm-align: alpha_source=.*raised RuntimeError") as info:
        system.build(spec, 0)
    assert "MARCONI_VLLM" not in str(info.value)


def test_the_docs_say_an_alpha_source_runs_arbitrary_code() -> None:
    """``module:factory`` imports a module and calls it: code of the user's choosing, in every vLLM
    process (or in the simulator's workers). The docs and both docstrings say so."""
    from marconi.integrations.vllm import config, system

    docs = (REPO / "docs" / "vllm.md").read_text()
    for text in (docs, config.__doc__ or "", system.__doc__ or "", PluginConfig.make_alpha_source.__doc__ or ""):
        assert "runs arbitrary code" in " ".join(text.split())


# ====================================================================================== no policy
def test_with_no_policy_no_setting_stops_stock_vllm(env: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A bad MARCONI_VLLM_ALPHA (or any other setting) with no policy made register() raise, which
    stops stock vLLM although the plugin then patches nothing. Now it is ignored, with a warning.
    (The CPU fix is off here, where vLLM is absent: with it on, registration imports vLLM.)"""
    env.setenv("MARCONI_VLLM_MAMBA2_CPU_FIX", "off")
    for name, value in (("MARCONI_VLLM_ALPHA", "x"), ("MARCONI_VLLM_ALPHA", "adaptive"),
                        ("MARCONI_VLLM_EFFICIENCY", "fast"), ("MARCONI_VLLM_ALPHA_SOURCE", "nocolon"),
                        ("MARCONI_VLLM_ADAPTIVE_RULES", "lru/a1m")):
        env.setenv(name, value)
        plugin.reset_registration()
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="marconi.integrations.vllm"):
            plugin.register()
        assert name in caplog.text and "MARCONI_VLLM_POLICY is unset" in caplog.text, name
        env.delenv(name)
    config, ignored = PluginConfig.lenient_from_env({"MARCONI_VLLM_MAMBA2_CPU_FIX": "maybe"})
    assert config == PluginConfig() and ignored == ["MARCONI_VLLM_MAMBA2_CPU_FIX='maybe': choose auto or off"]
    env.setenv("MARCONI_VLLM_TRACE", UNWRITABLE)  # no policy: no trace is written, so none is checked
    plugin.reset_registration()
    plugin.register()
    config, ignored = PluginConfig.lenient_from_env({"MARCONI_VLLM_ALPHA": "x", "MARCONI_VLLM_MAMBA2_CPU_FIX": "off"})
    assert config == PluginConfig(mamba2_cpu_fix=False) and len(ignored) == 1     # a good setting still counts
    config, ignored = PluginConfig.lenient_from_env({"MARCONI_VLLM_ALPHA": "x", "MARCONI_VLLM_MAMBA2_CPU_FIX": "of"})
    assert config == PluginConfig() and len(ignored) == 2
    env.setenv("MARCONI_VLLM_POLICY", "marconi")   # a policy asked for: a bad value is an error
    env.setenv("MARCONI_VLLM_ALPHA", "x")
    plugin.reset_registration()
    with pytest.raises(ConfigError, match="MARCONI_VLLM_ALPHA='x'"):
        plugin.register()


# ====================================================================================== caching off


_POOL_SCRIPT = r"""
import json
from types import SimpleNamespace
from vllm.v1.core.block_pool import BlockPool
from marconi.core.model import get_model
from marconi.core.registry import ConfigError
from marconi.integrations.vllm.config import PluginConfig
from marconi.integrations.vllm.plugin import PoolHooks
from marconi.integrations.vllm.policy import ATTENTION, MAMBA

class Recorder:
    def __init__(self):
        self.calls = []
    def __getattr__(self, name):
        if not name.startswith("on_"):
            raise AttributeError(name)
        return lambda block, *args: self.calls.append([name, block.block_id])

def hooked(pool, config):
    kv = SimpleNamespace(block_pool=pool, record_prefix_cache_stats=lambda *a: None, allocate_slots=lambda *a, **k: None)
    return PoolHooks.for_pool(kv, (MAMBA, ATTENTION), get_model("paper-7b"), 16, config), SimpleNamespace(_free_request=print)

def run(policy):
    metrics = Recorder()
    pool = BlockPool(num_gpu_blocks=8, enable_caching=False, hash_block_size=16, metrics_collector=metrics)
    if policy:
        hooks, scheduler = hooked(pool, PluginConfig(policy=policy))
        hooks.install(scheduler)
    a = pool.get_new_blocks(5)
    pool.free_blocks(reversed(a))
    b = pool.get_new_blocks(7)
    pool.free_blocks(b[:3])
    c = pool.get_new_blocks(2)
    return {"ids": [[x.block_id for x in blocks] for blocks in (a, b, c)], "calls": metrics.calls,
            "free": pool.get_num_free_blocks()}

out = {policy or "stock": run(policy) for policy in (None, "lru", "marconi")}
pool = BlockPool(num_gpu_blocks=8, enable_caching=True, hash_block_size=16)
before = dict(vars(pool))
try:
    hooked(pool, PluginConfig(policy="marconi", alpha_source="json:loads"))
except ConfigError as exc:
    out["factory"] = [type(exc).__name__, str(exc)]
out["untouched"] = vars(pool) == before
tiny = BlockPool(num_gpu_blocks=3, enable_caching=True, hash_block_size=16)
try:
    hooked(tiny, PluginConfig(policy="marconi", alpha="adaptive"))
except ConfigError as exc:
    out["tiny_adaptive"] = [type(exc).__name__, str(exc)]
print("RESULT " + json.dumps(out))
"""


@pytest.mark.slow  # one vLLM import (~15 s)
def test_with_prefix_caching_off_the_plugin_changes_nothing() -> None:
    """In ``marconi`` mode with prefix caching off the plugin reported every reused block as a KV
    eviction (``metrics_collector.on_block_evicted``), which stock vLLM never does: there is no
    eviction choice, so the pool must behave, and report, exactly as stock. Also: a factory that
    raises while the hooks are built is the plugin's setting error, and the pool is left untouched; so is
    an adaptive α source whose shadow cannot be built for a pool this small."""
    require_vllm()
    base = {k: v for k, v in os.environ.items() if not k.startswith("MARCONI_VLLM_")}
    proc = subprocess.run([VLLM_PYTHON, "-c", _POOL_SCRIPT], capture_output=True, text=True, timeout=300,
                          env={**base, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("RESULT "))[7:])
    assert out["stock"]["calls"] and not any(c[0] == "on_block_evicted" for c in out["stock"]["calls"])
    assert out["lru"] == out["stock"] and out["marconi"] == out["stock"]
    assert out["factory"][0] == "PluginSettingError"
    assert out["factory"][1].startswith("MARCONI_VLLM_ALPHA_SOURCE='json:loads': loads(spec, config) raised TypeError")
    assert out["untouched"]
    # an adaptive source whose shadow cannot fit the pool is a setting error too, not "could not attach, run stock"
    assert out["tiny_adaptive"][0] == "PluginSettingError" and "cannot be built" in out["tiny_adaptive"][1]


# ====================================================================================== bug 14
def test_vllm_bench_checks_its_options_before_anything_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Bug 14 (vLLM half): ``--out`` unwritable, a bad ``--retention`` ... failed only after the
    servers had run. Each is refused first (before the vLLM python is even looked for)."""
    trace = tmp_path / "mine.jsonl"
    trace.write_text("")
    work = ["--vllm-python", str(tmp_path / "no-vllm" / "python"), "--work-dir", str(tmp_path / "work"),
            "--out", str(tmp_path / "o.jsonl"), "--plot", ""]
    cases = ((["--out", "/proc/nope/o.jsonl"], "--out /proc/nope/o.jsonl"),
             (["--plot", "/proc/nope/p.png"], "--plot /proc/nope/p.png"),
             (["--record-fixture", "/proc/nope/f.json"], "--record-fixture /proc/nope/f.json"),
             (["--out", str(trace), "--trace", str(trace)], "also an input"),
             (["--plot", str(tmp_path / "o.jsonl")], "is also --out"),
             # refused by argparse now (issue 31: numeric options are typed with their domains)
             (["--retention", "abc"], "argument --retention: must be an integer >= 0"),
             (["--retention=-384"], "argument --retention: must be an integer >= 0"),
             (["--retention", "100"], "argument --retention: must be an integer >= 0 and <= 16,777,216, a multiple of 128"),
             (["--retention", "128"], "--retention 128: must be 0, none or a multiple of the block"),
             (["--prefix-match-unit", "7"], "--prefix-match-unit 7: must divide the block"),
             (["--max-num-batched-tokens", "0"], "argument --max-num-batched-tokens: must be an integer >= 1"))
    for extra, message in cases:
        try:
            code = main(["vllm", "bench", *work, *extra])
        except SystemExit as exc:
            code = exc.code
        assert code == 2, extra
        err = capsys.readouterr().err
        assert message in err and "no vLLM python" not in err and "Traceback" not in err, (extra, err)


def test_vllm_bench_refuses_a_pool_too_small_before_any_server_starts(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Bug 14: the emulation of the trace's own outputs, which needs no server, runs first: a
    ``--blocks`` that cannot serve a request is refused before a server starts (vLLM would never
    schedule it), naming ``--blocks``."""
    def build_model(config: BenchConfig, progress: object) -> Path:
        model_dir = tmp_path / "model"
        model_dir.mkdir(exist_ok=True)
        (model_dir / "config.json").write_text(json.dumps(QWEN_TINY_CONFIG))
        return model_dir

    def serve_runs(*args: object, **kwargs: object) -> list[object]:
        pytest.fail("a server was started although the emulation cannot serve the trace")

    monkeypatch.setattr(bench, "build_model", build_model)
    monkeypatch.setattr(bench, "serve_runs", serve_runs)
    config = BenchConfig(vllm_python=sys.executable, num_requests=3, num_blocks=3, work_dir=str(tmp_path / "work"))
    with pytest.raises(ConfigError, match=r"--blocks 3 cannot serve this trace .*free blocks.*no server was started"):
        run_bench(config, progress=lambda msg: None)


# ====================================================================================== sweeps
def test_an_infeasible_vllm_align_point_keeps_the_finished_points() -> None:
    """One infeasible ``vllm-align`` point aborted the whole sweep. The sweep change ("a failed point
    keeps the finished ones", d99822e) covers vllm-align: here through the library, with an exact
    pool too small (``blocks=3``) beside a feasible one (tests/test_cli.py has the CLI's half)."""
    trace = build_workload("swe-sample").head(6)
    points = expand_points(["vllm-align:blocks=3", "vllm-align"], ["3GB"], ["paper-7b"])
    with pytest.raises(PointsFailed) as info:
        run_sweep(trace, "swe6", points, workers=1, per_request=False)
    failed = info.value
    assert [r["system"] for r in failed.records] == ["vllm-align"] and failed.total == 2
    assert [t.point.system for t, _ in failed.failures] == ["vllm-align:blocks=3"]
    assert "vllm-align:blocks=3 at 3GB" in str(failed) and "free blocks" in str(failed)
