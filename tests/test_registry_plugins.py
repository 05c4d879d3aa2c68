"""Registries find the pieces above the core through entry points, on first read, and say which one broke."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
import types
from pathlib import Path

import pytest

from marconi.core.registry import ConfigError, Registry


def test_the_registries_load_their_plugins_on_first_read_only() -> None:
    """Importing the core imports no plugin; reading a registry imports its group's modules, whose
    names then resolve (the selectors, sparse-dp, the engine emulations)."""
    script = """
import sys
from marconi.core.admission import ADMISSION_POLICIES
from marconi.core.eviction import EVICTION_POLICIES
plugins = ("marconi.choosers", "marconi.sparse.admission", "marconi.integrations.vllm.system",
           "marconi.integrations.sglang.system")
assert not [m for m in plugins if m in sys.modules], [m for m in plugins if m in sys.modules]
assert {"worlds", "regret", "oracle"} <= set(EVICTION_POLICIES.names())
assert "marconi.choosers" in sys.modules and "marconi.sparse.admission" not in sys.modules
assert "sparse-dp" in ADMISSION_POLICIES.names()
from marconi.sim.systems import SYSTEMS
assert "marconi.integrations.vllm.system" not in sys.modules
assert {"vllm-align", "sglang-unified"} <= set(SYSTEMS.names())
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def _group(monkeypatch: pytest.MonkeyPatch, **modules: str) -> None:
    points = [importlib.metadata.EntryPoint(name, value, "marconi.test_plugins") for name, value in modules.items()]
    monkeypatch.setattr(importlib.metadata, "entry_points",
                        lambda group: [p for p in points if p.group == group])


def test_a_plugin_registers_itself_when_its_module_is_imported(monkeypatch: pytest.MonkeyPatch,
                                                                 tmp_path: Path) -> None:
    registry: Registry[str] = Registry("test piece", entry_points="marconi.test_plugins")
    home = types.ModuleType("marconi_test_home")
    home.REGISTRY = registry
    home.imports = 0
    monkeypatch.setitem(sys.modules, "marconi_test_home", home)
    (tmp_path / "marconi_test_plugin.py").write_text(
        "import marconi_test_home\n"
        "marconi_test_home.imports += 1\n"
        "@marconi_test_home.REGISTRY.register('echo', 'returns its word')\n"
        "def _echo(word: str = 'hi') -> str:\n"
        "    return word\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "marconi_test_plugin", raising=False)
    _group(monkeypatch, echo="marconi_test_plugin")
    assert "marconi_test_plugin" not in sys.modules        # nothing read yet: nothing imported
    assert registry.create("echo:word=ok") == "ok"
    assert registry.names() == ["echo"] and registry.describe() == {"echo": "returns its word"}
    assert home.imports == 1
    monkeypatch.delitem(sys.modules, "marconi_test_plugin")


def test_a_broken_plugin_is_named_on_every_read(monkeypatch: pytest.MonkeyPatch) -> None:
    registry: Registry[str] = Registry("test piece", entry_points="marconi.test_plugins")
    _group(monkeypatch, broken="marconi_no_such_module_anywhere")
    for _ in range(2):      # not silently incomplete after the first failure
        with pytest.raises(ConfigError, match="'broken'.*marconi_no_such_module_anywhere.*marconi.test_plugins"):
            registry.names()


def test_an_unknown_name_with_no_plugin_installed_says_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    registry: Registry[str] = Registry("test piece", entry_points="marconi.test_plugins")
    _group(monkeypatch)
    with pytest.raises(ConfigError, match="no 'marconi.test_plugins' entry point is installed"):
        registry.create("anything")
