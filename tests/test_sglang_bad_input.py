"""Bad input to the SGLang plugin's config and the ``sglang-unified`` system: a ConfigError naming the
setting, checked when the config is read (not later, when a strategy or a point is built). No SGLang
needed."""

from __future__ import annotations

import json

import pytest

from marconi.core.registry import ConfigError
from marconi.integrations.sglang.policy import MarconiStrategy, parse_config
from marconi.lab.sglang_bench import parse_policy
from marconi.sim.systems import make_system
from marks import slow
from sglang_env import sglang_python

MAMBA = 1


@pytest.mark.parametrize("text", ["garbage", "{", '{"alpha": 0.5,}', "{'alpha': 0.5}"])
def test_a_config_that_is_not_json_names_the_flag(text: str) -> None:
    with pytest.raises(ConfigError, match=r"--radix-eviction-policy-config.*not JSON.*line 1 column"):
        parse_config(text)


def test_a_key_given_twice_in_json_is_refused() -> None:
    with pytest.raises(ConfigError, match="'alpha' given twice"):
        parse_config('{"alpha": 0.5, "alpha": 2}')


@pytest.mark.parametrize("alpha", [float("inf"), "Infinity", 1e400, 10**400],
                         ids=["inf", "json-Infinity", "1e400", "int-10**400"])
def test_alpha_must_be_finite(alpha) -> None:
    config = f'{{"alpha": {alpha}}}' if isinstance(alpha, str) else {"alpha": alpha}
    with pytest.raises(ConfigError, match="alpha must be a finite number >= 0"):
        parse_config(config)


@pytest.mark.parametrize("rules, match", [
    ("bogus", r"rules 'bogus': rule 'bogus'"),
    ("a2m/a2m", r"rules 'a2m/a2m': .*twice"),
    ("lru/lru", r"rules 'lru/lru': .*twice"),
    ("a2m/a-1", r"rules 'a2m/a-1': rule 'a-1'"),
    ("//", r"rules '//': .*empty"),
    ("lru/a0.5mt", r"rules 'lru/a0.5mt': .*dead tails"),
])
def test_rules_are_checked_when_the_config_is_read(rules: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        parse_config({"rules": rules})


def test_regret_rules_are_checked_as_its_shadow_applies_them() -> None:
    parse_config({"rules": "a1lp"})                        # the worlds apply any rule (the generic path)
    with pytest.raises(ConfigError, match=r"rules 'a1lp': .*no counterpart"):
        parse_config({"selector": "regret", "rules": "a1lp"})


def test_efficiency_goes_with_a_fixed_alpha_only() -> None:
    assert parse_config({"alpha": 1, "efficiency": "marginal"})["efficiency"] == "marginal"
    with pytest.raises(ConfigError, match="'efficiency' goes with a number for alpha"):
        parse_config({"efficiency": "marginal"})
    with pytest.raises(ConfigError, match="'efficiency' goes with a number for alpha"):
        parse_config({"alpha": "adaptive", "efficiency": "total"})


@pytest.mark.parametrize("model", [5, "", "  ", ["paper-7b"], True])
def test_model_must_be_a_name_or_path(model) -> None:
    with pytest.raises(ConfigError, match="model must be a preset name or a path"):
        parse_config({"model": model})


def test_an_unknown_model_is_a_config_error_naming_the_key() -> None:
    with pytest.raises(ConfigError, match="marconi eviction config: model: unknown model 'nosuch'"):
        MarconiStrategy.from_config({"model": "nosuch", "alpha": 0.5}, mamba_index=MAMBA)
    with pytest.raises(ConfigError, match="served model .*set 'model' in --radix-eviction-policy-config"):
        MarconiStrategy.from_config({"alpha": 0.5}, mamba_index=MAMBA, default_model="/nonexistent/model")


def test_good_configs_still_parse_as_before() -> None:
    assert parse_config(None) == parse_config("") == parse_config(json.dumps({}))
    assert parse_config({"alpha": 0, "model": "paper-7b"})["alpha"] == 0.0
    cfg = parse_config({"selector": "regret", "rules": "default"})
    assert (cfg["selector"], cfg["rules"]) == ("regret", "default")


@pytest.mark.parametrize("system, match", [
    ("sglang-unified:eviction=marconi(alpha=1;alpha=2)", "alpha given twice"),
    ("sglang-unified:eviction=marconi(alpha)", "'alpha' is not key=value"),
    ("sglang-unified:eviction=marconi(alpha=)", "'alpha=' is not key=value"),
    ("sglang-unified:eviction=marconi(=1)", "'=1' is not key=value"),
    ("sglang-unified:eviction=marconi(alpha=inf)", "alpha must be a finite number"),
    ("sglang-unified:eviction=marconi(alpha=1e400)", "alpha must be a finite number"),
    ("sglang-unified:eviction=marconi,rules=bogus", "rules 'bogus'"),
    ("sglang-unified:eviction=marconi,rules=a2m/a2m", "rules 'a2m/a2m'"),
    ("sglang-unified:eviction=marconi,selector=regret,rules=a1lp", "rules 'a1lp'"),
    ("sglang-unified:eviction=marconi,efficiency=marginal", "'efficiency' goes with a number for alpha"),
])
def test_sglang_unified_refuses_bad_eviction_parameters_when_named(system: str, match: str) -> None:
    # refused when the system string is read, not as an infeasible point when the cache is built
    with pytest.raises(ConfigError, match=match):
        make_system(system)


def test_sglang_unified_good_eviction_parameters_still_work() -> None:
    for system in ("sglang-unified:eviction=marconi( alpha = 1 ;efficiency=marginal)",
                   "sglang-unified:eviction=marconi(;alpha=0.5;)",
                   "sglang-unified:eviction=marconi(alpha=adaptive;selector=regret;rules=lru/a2m)"):
        make_system(system)


@pytest.mark.parametrize("alpha", ["x", "inf", "-1", "nan", ""])
def test_the_benchs_policy_names_are_judged_by_the_plugins_parser(alpha) -> None:
    """``marconi sglang bench --policies marconi:alpha=X`` has no alpha rule of its own: what the
    plugin's config refuses, the bench refuses with the plugin's words, naming the policy."""
    with pytest.raises(ConfigError, match=rf"policy 'marconi:alpha={alpha}': marconi eviction config: alpha must be "
                                          r"a finite number >= 0 or 'adaptive'"):
        parse_policy(f"marconi:alpha={alpha}", "paper-7b")
    assert parse_policy("marconi:alpha=2", "paper-7b") == ("marconi", {"model": "paper-7b", "alpha": 2.0})


def test_sglang_unified_refuses_a_model_without_recurrent_state_naming_sglang_plus() -> None:
    """Old: a pure transformer got its pool split for Mamba slots of 0 bytes (2.78 GB of 5.28 GB used)
    and reported 15.3% 'unusable' hits, which a transformer cannot have."""
    with pytest.raises(ConfigError, match="transformer-7b has no recurrent state.*use sglang\\+"):
        make_system("sglang-unified").build("transformer-7b", 5e9)


def test_the_bench_refuses_a_pure_transformer_before_sglang_starts() -> None:
    """``marconi sglang bench --model transformer-7b`` sized SGLang's Mamba pool for 0-byte states
    (~10^9 slots a GB): the SGLang side grew to 24 GB and was killed, and the command printed nothing
    (audit). Refused now by name, before anything is spawned, as ``sglang-unified`` refuses it."""
    from marconi.lab.sglang_bench_command import check_bench_inputs

    with pytest.raises(ConfigError, match=r"^--model transformer-7b: no recurrent state; .*sglang\+"):
        check_bench_inputs("/nonexistent/python", "swe-sample", "transformer-7b", None)


@slow  # one SGLang import (~20 s)
def test_the_bench_says_a_pool_too_small_in_one_line(tmp_path) -> None:
    """A capacity whose Mamba pool cannot hold a request's states ended in SGLang's side with a
    traceback (RuntimeError, exit 1); now one line naming --capacity, exit 2, as simulate says it."""
    import subprocess
    import sys

    python = sglang_python()
    trace = tmp_path / "t.jsonl"
    rows = [{"session_id": 0, "turn_id": t, "ts": float(t), "input_tokens": list(range(1, 100 * (t + 1))),
             "output_tokens": [7, 8]} for t in range(3)]
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    proc = subprocess.run([sys.executable, "-m", "marconi.cli", "sglang", "bench", "--sglang-python", python,
                           "--trace", str(trace), "--capacity", "1B", "--policies", "lru", "--out",
                           str(tmp_path / "new" / "o.jsonl")], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert not (tmp_path / "new").exists()      # a failed run left an empty --out and its folder (audit)
    assert "Traceback" not in proc.stderr and "raise --capacity" in proc.stderr.strip().splitlines()[-1]
    assert "NOTE: --capacity 1B (1 bytes) is below the least pools SGLang can replay" in proc.stderr


def test_the_benchs_sglang_side_names_an_empty_trace(tmp_path) -> None:
    """Old: 'error: max() arg is an empty sequence' (audit). Checked before SGLang is imported."""
    import subprocess
    import sys

    trace = tmp_path / "empty.jsonl"
    trace.write_text("")
    proc = subprocess.run([sys.executable, "-m", "marconi.lab.sglang_bench", "--trace", str(trace), "--capacity",
                           "0.05x", "--model", "paper-7b", "--policies", "lru", "--out", str(tmp_path / "o.jsonl")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "has no requests: nothing to replay" in proc.stderr, proc.stderr[-2000:]


def test_the_bench_takes_one_capacity_and_says_so_at_parse_time(capsys) -> None:
    """Old: a list passed the flag's type, then the SGLang side said 'cannot read capacity' (audit)."""
    from marconi.cli import main

    with pytest.raises(SystemExit):
        main(["sglang", "bench", "--capacity", "0.05x,0.1x"])
    assert "one capacity, got 2 ('0.05x,0.1x')" in capsys.readouterr().err


def test_the_bench_never_appends_to_a_file_that_is_not_its_records(tmp_path, capsys) -> None:
    """``sglang bench --out`` appended a record to whatever file it named, a trace included (audit)."""
    from marconi.cli import main

    notes = tmp_path / "notes.jsonl"
    notes.write_text('{"input_tokens": [1, 2], "output_tokens": [3]}\n')
    assert main(["sglang", "bench", "--trace", "swe-sample", "--out", str(notes)]) == 2
    err = capsys.readouterr().err
    assert f"--out {notes} exists and is not result records" in err and "'policy'" in err
    assert notes.read_text() == '{"input_tokens": [1, 2], "output_tokens": [3]}\n'


def test_the_bench_refuses_a_policy_parameter_given_twice() -> None:
    """``--policies marconi:alpha=1,alpha=2`` is refused, as the system string refuses a key twice
    (it ran alpha=2, the last word, silently)."""
    with pytest.raises(ConfigError, match=r"policy 'marconi:alpha=1,alpha=2': alpha given twice"):
        parse_policy("marconi:alpha=1,alpha=2", "paper-7b")


@pytest.mark.parametrize("words", ["alpha=1,efficiency=marginal", "alpha=adaptive,selector=regret,rules=lru/a2m",
                                   "alpha=0"])
def test_the_bench_and_the_system_string_read_the_same_words_alike(words) -> None:
    """The bench's ``marconi:k=v,…`` and ``sglang-unified:eviction=marconi(k=v;…)`` are one reading
    (``config_from_words``): the same words give the same plugin config."""
    _, bench = parse_policy(f"marconi:{words}", "paper-7b")
    system = make_system(f"sglang-unified:eviction=marconi({words.replace(',', ';')})")
    assert {k: v for k, v in bench.items() if k != "model"} == dict(system.policy_config)
