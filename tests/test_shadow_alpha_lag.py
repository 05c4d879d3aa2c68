"""The shadow α source's lag (issue 33): a rule switch takes effect ``lag`` requests later, nothing else
changes, and a worker thread's replay gives exactly the inline replay's rules at every request."""

from __future__ import annotations

import pytest

from marconi.core.model import ModelSpec
from marconi.core.registry import ConfigError
from marconi.integrations.common.alpha import RequestObservation
from marconi.integrations.vllm.config import ENV_ADAPTIVE_LAG, PluginConfig
from marconi.integrations.vllm.models import PRESETS
from marconi.integrations.vllm.policy import ATTENTION, MAMBA, BlockEvictionState
from marconi.integrations.vllm.shadow import PoolShadowAlpha

LAG = 3


def _spec() -> ModelSpec:
    return ModelSpec.from_hf_config({"model_type": "qwen3_next", **PRESETS["qwen3_next-tiny"][1],
                                     "torch_dtype": "bfloat16"}, name="qwen3_next-tiny")


def _rules_in_force(lag: int, background: bool, requests: list) -> tuple[list[tuple[float, str | None]], dict]:
    """``(alpha, efficiency)`` in force after each finished request, and the shadow's tuning record."""
    source = PoolShadowAlpha(lag=lag)
    BlockEvictionState(_spec(), (MAMBA, MAMBA, MAMBA, ATTENTION), 100, 384, source)
    if background:
        source.run_in_background()
    seen = []
    for req in requests:
        source.observe(RequestObservation(req.input_tokens, req.output_tokens, 0, 0))
        seen.append((source.alpha(), source.efficiency()))
    return seen, source.tuning_record()


def test_lag_delays_each_switch_by_lag_requests_and_the_worker_thread_agrees() -> None:
    from marconi.workloads import build_workload

    requests = list(build_workload("swe-sample:max_input_len=8192"))[:60]
    now, record = _rules_in_force(0, False, requests)
    assert len(set(now)) >= 2, "the shadow never switched: the test trace is not contended enough"
    lagged, lagged_record = _rules_in_force(LAG, False, requests)
    first = (0.0, None)                                   # lru, the family's first, until request LAG + 1
    assert lagged == [first] * LAG + now[:-LAG]
    assert lagged_record == record                        # the shadow itself saw the same requests
    threaded, threaded_record = _rules_in_force(LAG, True, requests)
    assert threaded == lagged and threaded_record == record


def test_lag_is_configured_and_checked() -> None:
    assert PluginConfig.from_env({"MARCONI_VLLM_POLICY": "marconi", "MARCONI_VLLM_ALPHA": "adaptive",
                                  ENV_ADAPTIVE_LAG: "4"}).adaptive_lag == 4
    config = PluginConfig(policy="marconi", alpha="adaptive", adaptive_lag=4)
    assert PluginConfig.from_env(config.to_env()) == config
    assert config.make_alpha_source(_spec()).lag == 4
    with pytest.raises(ConfigError, match=ENV_ADAPTIVE_LAG):
        PluginConfig.from_env({"MARCONI_VLLM_POLICY": "marconi", "MARCONI_VLLM_ALPHA": "adaptive",
                               ENV_ADAPTIVE_LAG: "-1"})
    with pytest.raises(ConfigError, match=ENV_ADAPTIVE_LAG):
        PluginConfig.from_env({"MARCONI_VLLM_POLICY": "marconi", ENV_ADAPTIVE_LAG: "2"})     # α fixed: no shadow
    with pytest.raises(ConfigError, match="lag >= 1"):
        source = PoolShadowAlpha()
        BlockEvictionState(_spec(), (MAMBA, ATTENTION), 100, 384, source)
        source.run_in_background()
