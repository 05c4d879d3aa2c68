"""An operator's bad configuration of the vLLM integration: refused as one ConfigError naming the
variable or key to change and what it must be, or named in a warning; never a traceback from deep
inside, never a silent fallback to a default.

Found by an audit of every ``MARCONI_VLLM_*`` variable (the block-pool plugin), every
``kv_connector_extra_config`` ``marconi_*`` key and ``MARCONI_TIER_*`` variable (the CPU tier's
policy), each given empty, blank, of the wrong type, negative, zero, NaN, infinite, huge, misspelt,
and twice (key and variable) with different values. What these tests pin down:

* a ``MARCONI_VLLM_*`` variable no part of the plugin reads (``MARCONI_VLLM_ALPA=2``) was ignored, so
  the default α ran; ``MARCONI_VLLM_POLIC=marconi`` ran stock vLLM without a word;
* ``MARCONI_VLLM_MAMBA2_CPU_FIX=`` (empty) was refused, where every other empty variable is unset;
* ``MARCONI_VLLM_ADAPTIVE_LAG=99999999999999999999`` was taken: a lag no trace reaches never switches;
* ``MARCONI_VLLM_RECORD_MAX_BYTES`` without ``MARCONI_VLLM_RECORD`` was ignored;
* ``marconi-rule``, ``marconirule``, `` marconi_rule`` were ignored as vLLM's keys, the default rule running;
* ``MARCONI_TIER_RUL`` (and ``MARCONI_TIER_HOST_GBPS``, a key with no variable) were ignored;
* ``marconi_host_gbps`` as a JSON integer past a float raised OverflowError; ``1e-300`` GB/s, or
  ``marconi_gpu_tflops: 1e308``, made the load's cost per byte infinite (every chunk worth nothing);
* a ``tokens_per_chunk`` of the wrong type raised TypeError or was taken;
* a ``MARCONI_TIER_*`` variable outranked by its key (or by vLLM) and saying otherwise was silent.

The plugin's and the settings' cases run without vLLM; the one through the policy vLLM loads runs
in the vLLM environment (skipped where it is absent, failed under ``MARCONI_REQUIRE_VLLM=1``).
"""

from __future__ import annotations

import json
import logging
import os

import pytest

from marconi.integrations.vllm import plugin
from marconi.integrations.vllm.config import PluginConfig
from marconi.integrations.vllm.tier_settings import (ENV_COLD_INSERT, ENV_GROUP_KINDS, ENV_MODEL, ENV_RULE,
                                                     TierSettings)

from refusals import refused
from vllm_env import connector_answers

POLICY = {"MARCONI_VLLM_POLICY": "marconi"}
EXTRA = {"marconi_group_kinds": ["attention", "mamba"], "marconi_model": "nemotron-h-8b"}
ENV = {ENV_GROUP_KINDS: "attention,mamba", ENV_MODEL: "nemotron-h-8b"}
LOGGER = "marconi.integrations.vllm"


# ====================================================================== the plugin's variables
@pytest.mark.parametrize("name, meant", [("MARCONI_VLLM_ALPA", "MARCONI_VLLM_ALPHA"),
                                         ("MARCONI_VLLM_POLICIES", "MARCONI_VLLM_POLICY"),
                                         ("MARCONI_VLLM_RETENTION_BUDGETS", "MARCONI_VLLM_RETENTION_BUDGET"),
                                         ("marconi_vllm_alpha", "MARCONI_VLLM_ALPHA")])
def test_an_unknown_plugin_variable_with_a_policy_is_refused_naming_it(name, meant) -> None:
    """``MARCONI_VLLM_ALPA=2`` ran the default α 0.5. Refused by name, with the name meant; every
    name the project reads (the test suite's ``MARCONI_VLLM_PYTHON`` too) still passes."""
    message = refused(lambda: PluginConfig.from_env({**POLICY, name: "2"}), name, f"did you mean {meant}?",
                       "rename or unset it")
    assert message.startswith(name)
    fine = {**POLICY, "MARCONI_VLLM_PYTHON": "/usr/bin/python3", "MARCONI_VLLM_RECORD": "rec.jsonl",
            "MARCONI_VLLM_RECORD_MAX_BYTES": "4096", "MARCONI_VLLM_ALPHA": "1"}
    assert PluginConfig.from_env(fine).alpha == 1.0


def test_a_misspelt_policy_variable_is_named_not_silently_stock(monkeypatch: pytest.MonkeyPatch,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    """``MARCONI_VLLM_POLIC=marconi`` served stock vLLM with nothing in the log. With no policy the
    plugin still never stops vLLM: the name is a problem it ignores, logged at registration."""
    config, ignored = PluginConfig.lenient_from_env({"MARCONI_VLLM_POLIC": "marconi"})
    assert config == PluginConfig()
    assert len(ignored) == 1 and ignored[0].startswith("MARCONI_VLLM_POLIC:"), ignored
    assert "did you mean MARCONI_VLLM_POLICY?" in ignored[0]
    for name in [k for k in os.environ if k.upper().startswith("MARCONI_VLLM")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("MARCONI_VLLM_MAMBA2_CPU_FIX", "off")       # registration then never imports vLLM
    monkeypatch.setenv("MARCONI_VLLM_POLIC", "marconi")
    plugin.reset_registration()
    try:
        with caplog.at_level(logging.WARNING, logger=LOGGER):
            plugin.register()
    finally:
        plugin.reset_registration()
    assert "MARCONI_VLLM_POLIC:" in caplog.text and "MARCONI_VLLM_POLICY" in caplog.text, caplog.text


@pytest.mark.parametrize("value", ["", "  "])
def test_an_empty_mamba2_cpu_fix_is_unset_like_every_other_variable(value) -> None:
    """``MARCONI_VLLM_MAMBA2_CPU_FIX=`` was refused ('' : choose auto or off) where an empty
    ``MARCONI_VLLM_ALPHA`` or ``MARCONI_VLLM_RETENTION`` is unset: now it is unset too, the default ``auto``."""
    assert PluginConfig.from_env({**POLICY, "MARCONI_VLLM_MAMBA2_CPU_FIX": value}).mamba2_cpu_fix is True
    assert PluginConfig.lenient_from_env({"MARCONI_VLLM_MAMBA2_CPU_FIX": value}) == (PluginConfig(), [])
    refused(lambda: PluginConfig.from_env({**POLICY, "MARCONI_VLLM_MAMBA2_CPU_FIX": "on"}),
             "MARCONI_VLLM_MAMBA2_CPU_FIX='on'", "auto or off")


@pytest.mark.parametrize("lag", ["1000000001", "99999999999999999999"])
def test_an_adaptive_lag_no_trace_reaches_is_refused_with_its_bound(lag) -> None:
    """A lag past every trace never switches the rule (adaptive α silently stays on its first rule)
    and keeps an entry per request: refused above 10^9 requests, the project's count bound."""
    env = {**POLICY, "MARCONI_VLLM_ALPHA": "adaptive", "MARCONI_VLLM_ADAPTIVE_LAG": lag}
    refused(lambda: PluginConfig.from_env(env), "MARCONI_VLLM_ADAPTIVE_LAG", lag, "<= 1,000,000,000")
    refused(lambda: PluginConfig(policy="marconi", alpha="adaptive", adaptive_lag=int(lag)),
             "MARCONI_VLLM_ADAPTIVE_LAG", "<= 1,000,000,000")
    assert PluginConfig.from_env({**env, "MARCONI_VLLM_ADAPTIVE_LAG": "1000000000"}).adaptive_lag == 10**9


def test_a_recording_cap_without_a_recording_is_refused_not_ignored() -> None:
    """``MARCONI_VLLM_RECORD_MAX_BYTES`` alone capped nothing, without a word (as the retention
    budget without retention is refused)."""
    refused(lambda: PluginConfig.from_env({**POLICY, "MARCONI_VLLM_RECORD_MAX_BYTES": "4096"}),
             "MARCONI_VLLM_RECORD_MAX_BYTES='4096'", "needs MARCONI_VLLM_RECORD")
    _, ignored = PluginConfig.lenient_from_env({"MARCONI_VLLM_RECORD_MAX_BYTES": "4096"})
    assert len(ignored) == 1 and "needs MARCONI_VLLM_RECORD" in ignored[0], ignored


# ====================================================================== the tier's keys
@pytest.mark.parametrize("key", ["marconi-rule", "marconirule", " marconi_rule", "MARCONI-RULE"])
def test_a_rule_key_misspelt_past_the_underscore_is_refused_not_ignored(key) -> None:
    """Only keys starting ``marconi_`` were checked: ``marconi-rule: a2m`` passed as one of vLLM's
    keys and the default rule (adaptive) ran."""
    message = refused(lambda: TierSettings.from_extra_config({**EXTRA, key: "a2m"}),
                       "kv_connector_extra_config", "unknown key", repr(key), "did you mean 'marconi_rule'?")
    assert "marconi_second_chance" in message          # the known keys are listed


@pytest.mark.parametrize("key, value", [("marconi_host_gbps", 10**400), ("marconi_gpu_tflops", -10**400)],
                         ids=["host_gbps_1e400", "gpu_tflops_-1e400"])
def test_an_integer_past_a_float_is_refused_naming_the_key_not_an_overflow(key, value) -> None:
    """``{"marconi_host_gbps": 1000...0}`` (JSON reads it as an int) raised OverflowError."""
    parsed = json.loads(json.dumps({key: value}))
    refused(lambda: TierSettings.from_extra_config({**EXTRA, **parsed}), f"kv_connector_extra_config {key!r}",
             "a positive number")


@pytest.mark.parametrize("numbers, words", [
    ({"marconi_host_gbps": 1e-300}, ("marconi_host_gbps", "1e-09", "1e+09")),
    ({"marconi_host_gbps": "2e9"}, ("marconi_host_gbps", "1 EB/s")),
    ({"marconi_gpu_tflops": 1e308}, ("marconi_gpu_tflops", "marconi_host_gbps", "FLOPs per byte"))])
def test_a_load_cost_out_of_a_floats_range_isrefused(numbers, words) -> None:
    """A bandwidth of 1e-300 GB/s, or 1e308 TFLOP/s, was taken: the load's FLOPs per byte became
    infinite (or 4e305), and every chunk's efficiency less that cost 0, so the rule ranked by
    recency alone. The bandwidth takes what the replay's ``--host-bandwidth`` does (1 B/s to 1 EB/s)."""
    refused(lambda: TierSettings.from_extra_config({**EXTRA, **numbers}), *words)
    for fine in ({"marconi_host_gbps": 1e-9}, {"marconi_host_gbps": 1e9}, {"marconi_gpu_tflops": 2250}):
        assert TierSettings.from_extra_config({**EXTRA, **fine}).load_flops_per_byte > 0


@pytest.mark.parametrize("tpc", ["8", 1.5, True, float("nan")])
def test_tokens_per_chunk_of_a_wrong_type_is_a_config_error(tpc) -> None:
    """``tokens_per_chunk='8'`` raised TypeError ('<=' between str and int); 1.5, True and NaN were taken."""
    refused(lambda: TierSettings.from_extra_config(EXTRA, tokens_per_chunk=tpc), "tokens_per_chunk",
             "positive whole number", repr(tpc))


# ====================================================================== the tier's variables
@pytest.mark.parametrize("name, meant", [("MARCONI_TIER_RUL", "MARCONI_TIER_RULE"),
                                         ("MARCONI_TIER_SECOND_CHANCES", "MARCONI_TIER_SECOND_CHANCE"),
                                         ("MARCONI_TIER_HOST_GBPS", None)])
def test_an_unknown_tier_variable_is_refused_naming_it(name, meant) -> None:
    """``MARCONI_TIER_RUL=a2m`` ran the default rule; ``MARCONI_TIER_HOST_GBPS`` (a setting with a key
    only) was ignored. Both where the policy reads the environment: built outside vLLM's connector
    (``from_env``) and through it (``from_extra_config(..., env=...)``)."""
    words = [name, "no such variable", "rename or unset it", ENV_RULE]
    if meant:
        words.append(f"did you mean {meant}?")
    refused(lambda: TierSettings.from_env({**ENV, name: "a2m"}), *words)
    message = refused(lambda: TierSettings.from_extra_config(EXTRA, env={name: "1"}), *words)
    assert message.startswith(name)
    assert TierSettings.from_extra_config({**EXTRA, "marconi_rule": "a2m"}, env={ENV_COLD_INSERT: "0"}).alpha == 2


def test_a_variable_its_key_outranks_is_named_when_they_disagree(caplog: pytest.LogCaptureFixture) -> None:
    """``marconi_rule: a2m`` with ``MARCONI_TIER_RULE=lru`` ran a2m (the key wins, as documented) and
    said nothing of the variable. Now a warning names both and the value in effect; a variable
    that agrees (as text or as the setting it means) is not named, and the key still wins."""
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        got = TierSettings.from_extra_config({**EXTRA, "marconi_rule": "a2m", "marconi_cold_insert": True},
                                             env={ENV_RULE: "lru", ENV_COLD_INSERT: "off"})
    assert got.alpha == 2.0 and got.cold_insert is True
    assert f"{ENV_RULE}='lru' is not in effect" in caplog.text and "'marconi_rule'='a2m'" in caplog.text
    assert f"{ENV_COLD_INSERT}='off' is not in effect" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        TierSettings.from_extra_config({**EXTRA, "marconi_rule": "a2m", "marconi_cold_insert": True},
                                       env={ENV_RULE: " a2m ", ENV_COLD_INSERT: "on"})
        TierSettings.from_extra_config({"marconi_model": "nemotron-h-8b"}, group_kinds=["attention", "mamba"],
                                       env={ENV_GROUP_KINDS: "attention,mamba"})
    assert "not in effect" not in caplog.text, caplog.text
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        TierSettings.from_extra_config({"marconi_model": "nemotron-h-8b"}, group_kinds=["attention", "mamba"],
                                       env={ENV_GROUP_KINDS: "mamba,attention"})
    assert f"{ENV_GROUP_KINDS}='mamba,attention' is not in effect" in caplog.text, caplog.text


# ====================================================================== through the policy vLLM loads


def test_the_policy_vllm_loads_refuses_a_misspelt_key_or_variable() -> None:
    """Through the connector's path (``MarconiCachePolicy(capacity)`` under an ``OffloadingSpec``):
    ``marconi-rule`` and ``MARCONI_TIER_RUL`` let the engine start on the default rule."""
    base = {**EXTRA, "marconi_group_kinds": "attention,mamba"}
    cases = [({}, {**base, "marconi-rule": "a2m"}), ({"MARCONI_TIER_RUL": "a2m"}, base),
             ({}, {**base, "marconi_host_gbps": 1e-300}), ({ENV_RULE: "a2m"}, base)]
    said = connector_answers(cases)
    assert said[0].startswith("ConfigError: kv_connector_extra_config: unknown key(s) ['marconi-rule']"), said[0]
    assert said[1].startswith("ConfigError: MARCONI_TIER_RUL: no such variable"), said[1]
    assert said[2].startswith("ConfigError: marconi_host_gbps: "), said[2]
    assert said[3] == "accepted", said[3]
