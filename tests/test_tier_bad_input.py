"""Bad input to vLLM's CPU tier and the engine probe: refused as one ConfigError (or exit 2) that names
the key, variable or flag the user set, never a traceback, never a silent stand-in.

* ``kv_connector_extra_config`` values of the wrong type (``marconi_group_kinds: 5`` raised TypeError
  at engine start; ``marconi_host_gbps: true`` ran as 1 GB/s);
* ``MARCONI_TIER_*`` variables are refused under their own names, not a key the user never set;
* ``--vllm-python NAME``: a file of that name here is run, else PATH, and a refusal says which;
  two environments over one base interpreter are two probes;
* a CPU tier smaller than one chunk (``vllm-align:cpu_tier=1``, ``vllm replay --cpu-tier 1``);
* ``--retention``'s hint names a model's block only where the model is the command's default.
"""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pytest

from marks import slow
from marconi.integrations.common.probe import probe_python, python_command
from marconi.integrations.vllm.commands import RETENTION
from marconi.integrations.vllm.tier_settings import (ENV_COLD_INSERT, ENV_GROUP_KINDS, ENV_MODEL, ENV_RULE,
                                                     ENV_SECOND_CHANCE, TierSettings)
from marconi.sim.systems import make_system

from cli_run import run_cli
from refusals import refused
from vllm_env import connector_answers, vllm_python

EXTRA = {"marconi_group_kinds": ["attention", "mamba"], "marconi_model": "nemotron-h-8b"}
ENV = {ENV_GROUP_KINDS: "attention,mamba", ENV_MODEL: "nemotron-h-8b"}


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """(exit code, stderr) of ``marconi ARGV`` (:func:`cli_run.run_cli`: no traceback, asserted)."""
    return run_cli(argv, capsys)[:2]


# ====================================================================== types of the keys
@pytest.mark.parametrize("value", [5, 2.5, {"attention": 1}, [1, 2], None])
def test_group_kinds_of_a_wrong_type_is_refused_naming_the_key(value) -> None:
    """``marconi_group_kinds: 5`` raised ``TypeError: 'int' object is not iterable``; a dict ran as its keys."""
    message = refused(lambda: TierSettings.from_extra_config({**EXTRA, "marconi_group_kinds": value}),
                       "kv_connector_extra_config 'marconi_group_kinds'", "'attention'", "'mamba'")
    assert f"got {value!r}" in message


@pytest.mark.parametrize("key", ["marconi_host_gbps", "marconi_gpu_tflops"])
@pytest.mark.parametrize("value", [True, False, None, [1], "abc", "nan", -1, 0])
def test_numbers_refuse_bools_and_non_numbers_naming_the_key(key, value) -> None:
    """``marconi_host_gbps: true`` used to run as 1.0 GB/s."""
    refused(lambda: TierSettings.from_extra_config({**EXTRA, key: value}),
             f"kv_connector_extra_config {key!r}", "a positive number", f"got {value!r}")


def test_numbers_still_take_ints_floats_and_their_text() -> None:
    for value, expected in ((32, 32.0), (12.5, 12.5), ("16", 16.0)):
        assert TierSettings.from_extra_config({**EXTRA, "marconi_host_gbps": value}).host_gbps == expected


@pytest.mark.parametrize("key, value, expects", [("marconi_rule", 5, "rule's label"),
                                                 ("marconi_rule", None, "rule's label"),
                                                 ("marconi_model", 5, "preset"),
                                                 ("marconi_model", None, "preset")])
def test_rule_and_model_of_a_wrong_type_say_what_they_expect(key, value, expects) -> None:
    refused(lambda: TierSettings.from_extra_config({**EXTRA, key: value}),
             f"kv_connector_extra_config {key!r}", expects, f"got {value!r}")


@pytest.mark.parametrize("label", ["a1lp", "a1l", "a2mp"])
def test_a_rule_whose_candidates_or_touch_the_tier_would_ignore_isrefused(label) -> None:
    """docs/vllm-tiers.md names ``a1lp`` as a rule the tier cannot apply, yet it was taken and run
    as ``a1``: the tier ranks its own candidates and vLLM touches every chunk of a hit, so the l and p
    flags changed nothing but the label. ``lru`` (leaves and path touch by definition) still passes."""
    message = refused(lambda: TierSettings.from_extra_config({**EXTRA, "marconi_rule": label}),
                       "kv_connector_extra_config 'marconi_rule'", label, "drop the l and p")
    assert "leaf candidates" in message
    for fine in ("lru", "a1", "a0.5m", "a2mi", "adaptive", "arc-tree"):
        assert TierSettings.from_extra_config({**EXTRA, "marconi_rule": fine}) is not None


def test_a_key_that_is_not_a_string_is_refused_not_an_attribute_error() -> None:
    """JSON never gives one, but a Python caller's dict can: it raised AttributeError ('int' object
    has no attribute 'startswith')."""
    refused(lambda: TierSettings.from_extra_config({**EXTRA, 5: "x"}), "kv_connector_extra_config",
             "keys are strings", "[5]")


def test_a_key_of_this_policy_in_another_case_is_refused_not_ignored() -> None:
    """'Marconi_rule' was ignored without a word (audit), and the default rule ran."""
    refused(lambda: TierSettings.from_extra_config({**EXTRA, "Marconi_rule": "lru"}), "unknown key",
             "'Marconi_rule'", "marconi_rule")


def test_a_one_kind_group_list_names_the_key_that_gave_it() -> None:
    refused(lambda: TierSettings.from_extra_config({**EXTRA, "marconi_group_kinds": "attention"}),
             "kv_connector_extra_config 'marconi_group_kinds' gives ['attention']", "eviction_policy")


# ====================================================================== variables by name
@pytest.mark.parametrize("var, value", [(ENV_MODEL, "zz"), (ENV_GROUP_KINDS, "attention,zz"),
                                        (ENV_GROUP_KINDS, "attention"), (ENV_RULE, "zz"),
                                        (ENV_COLD_INSERT, "maybe"), (ENV_SECOND_CHANCE, "2")])
def test_from_env_refuses_each_variable_by_its_own_name(var, value) -> None:
    """MARCONI_TIER_MODEL=zz was reported as ``kv_connector_extra_config 'marconi_model'``, a key not set."""
    message = refused(lambda: TierSettings.from_env({**ENV, var: value}), var)
    assert "kv_connector_extra_config 'marconi_" not in message


@pytest.mark.parametrize("var, value", [(ENV_RULE, "zz"), (ENV_COLD_INSERT, "maybe"), (ENV_MODEL, "zz"),
                                        (ENV_GROUP_KINDS, "attention,zz")])
def test_from_extra_config_refuses_a_variable_it_reads_by_the_variable(var, value) -> None:
    extra = {k: v for k, v in EXTRA.items() if k != {ENV_MODEL: "marconi_model",
                                                      ENV_GROUP_KINDS: "marconi_group_kinds"}.get(var)}
    message = refused(lambda: TierSettings.from_extra_config(extra, env={var: value}), var)
    assert message.startswith(var), message


def test_a_key_outranks_its_variable_and_the_variable_means_what_the_key_means() -> None:
    """The policy's choices do not depend on where a value came from."""
    by_key = TierSettings.from_extra_config({**EXTRA, "marconi_rule": "a2m", "marconi_cold_insert": False})
    by_env = TierSettings.from_extra_config(EXTRA, env={ENV_RULE: "a2m", ENV_COLD_INSERT: "0"})
    assert by_key == by_env and by_env.alpha == 2.0 and by_env.cold_insert is False
    assert TierSettings.from_extra_config({**EXTRA, "marconi_rule": "lru"}, env={ENV_RULE: "zz"}).family == ()
    assert TierSettings.from_env({**ENV, ENV_RULE: "a2m", ENV_COLD_INSERT: "0"}) == by_env


def test_the_policy_vllm_loads_names_the_variable_or_key_given() -> None:
    """Through the connector's path (``MarconiCachePolicy(capacity)`` under an ``OffloadingSpec``):
    MARCONI_TIER_RULE=zz was refused as ``kv_connector_extra_config 'marconi_rule'`` and
    ``marconi_group_kinds: 5`` raised TypeError at engine start."""
    nemo, kinds = {"marconi_model": "nemotron-h-8b"}, {"marconi_group_kinds": "attention,mamba"}
    cases = [({ENV_RULE: "zz"}, {**nemo, **kinds}), ({ENV_COLD_INSERT: "maybe"}, {**nemo, **kinds}),
             ({ENV_MODEL: "zz"}, kinds), ({ENV_GROUP_KINDS: "attention,zz"}, nemo),
             ({}, {**nemo, "marconi_group_kinds": 5}), ({ENV_RULE: "a2m"}, {**nemo, **kinds})]
    said = connector_answers(cases)
    for name, answer in zip([ENV_RULE, ENV_COLD_INSERT, ENV_MODEL, ENV_GROUP_KINDS], said):
        assert answer.startswith(f"ConfigError: {name}: "), answer
    assert said[4].startswith("ConfigError: kv_connector_extra_config 'marconi_group_kinds': "), said[4]
    assert said[5] == "accepted", said[5]


# ====================================================================== --vllm-python NAME
def _fake_python(path: Path, engine_version: str = "0.32.0") -> Path:
    """A stand-in interpreter answering the probe: the engine's version when run by a path containing
    'with', none otherwise (so two links to it tell which path was run)."""
    path.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        case "$0" in
            *without*) echo "marconi-probe 3.11 - 1.0" ;;
            *) echo "marconi-probe 3.11 {engine_version} 1.0" ;;
        esac
        """))
    path.chmod(0o755)
    return path


def test_a_bare_name_that_is_a_file_here_is_run_as_that_file(tmp_path: Path, monkeypatch) -> None:
    """``--vllm-python afile`` with ./afile present said ``cannot run afile: No such file or directory``."""
    _fake_python(tmp_path / "fakevllm")
    monkeypatch.chdir(tmp_path)
    assert python_command("fakevllm") == str(tmp_path / "fakevllm")
    assert python_command("./fakevllm") == "./fakevllm" and python_command("python3") == "python3"
    assert probe_python("fakevllm", "vllm", option="--vllm-python", make_target="make vllm-env") == "0.32.0"


def test_a_bare_name_not_here_is_looked_up_on_path_and_the_refusal_says_so(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    refused(lambda: probe_python("no-such-python-here", "vllm", option="--vllm-python", make_target="make vllm-env"),
             "--vllm-python no-such-python-here: ", "current directory", "on PATH", "make vllm-env")
    (tmp_path / "bin").mkdir()
    _fake_python(tmp_path / "bin" / "onpath-without-vllm")
    monkeypatch.setenv("PATH", str(tmp_path / "bin") + os.pathsep + os.environ["PATH"])
    refused(lambda: probe_python("onpath-without-vllm", "vllm", option="--vllm-python", make_target="make vllm-env"),
             f"(on PATH: {tmp_path / 'bin' / 'onpath-without-vllm'})", "without vllm")


def test_the_default_environment_is_the_checkouts_from_any_folder(tmp_path: Path, monkeypatch) -> None:
    """``--vllm-python``'s default ``.venv-vllm/bin/python`` was read against the current directory:
    ``marconi vllm replay`` run from another folder said no such file, with the environment built in
    the checkout. Here first, else the checkout's (this test's own checkout, which builds them)."""
    from marconi.integrations.common import probe
    from marconi.integrations.common.probe import default_env_python

    checkout = Path(__file__).resolve().parents[1]
    if Path(probe.__file__).resolve().parents[4] != checkout:
        pytest.skip("marconi is not installed in place from this checkout")
    monkeypatch.chdir(tmp_path)
    assert default_env_python(".no-such-env") == os.path.join(".no-such-env", "bin", "python")
    (tmp_path / ".venv-vllm" / "bin").mkdir(parents=True)
    _fake_python(tmp_path / ".venv-vllm" / "bin" / "python")
    assert default_env_python(".venv-vllm") == os.path.join(".venv-vllm", "bin", "python")     # here first
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    (checkout / ".fake-env" / "bin").mkdir(parents=True, exist_ok=True)
    try:
        _fake_python(checkout / ".fake-env" / "bin" / "python")
        assert default_env_python(".fake-env") == str(checkout / ".fake-env" / "bin" / "python")
    finally:
        (checkout / ".fake-env" / "bin" / "python").unlink()
        (checkout / ".fake-env" / "bin").rmdir()
        (checkout / ".fake-env").rmdir()


def test_two_environments_over_one_interpreter_are_probed_apart(tmp_path: Path) -> None:
    """The probe cached by the resolved path: ``.venv/bin/python`` (no vLLM) passed once
    ``.venv-vllm/bin/python`` had, both links to one base interpreter."""
    base = _fake_python(tmp_path / "base-python")
    for name in ("with-vllm", "without-vllm"):
        (tmp_path / name).symlink_to(base)
    assert probe_python(tmp_path / "with-vllm", "vllm", option="--vllm-python", make_target="m") == "0.32.0"
    refused(lambda: probe_python(tmp_path / "without-vllm", "vllm", option="--vllm-python", make_target="m"),
             "--vllm-python", "without vllm")


def test_vllm_replay_runs_the_bare_name_given_here(tmp_path: Path, monkeypatch, capsys) -> None:
    """The replay probes and spawns the file here, not a PATH lookup of its name."""
    (tmp_path / "afile").write_text("hi\n")
    (tmp_path / "afile").chmod(0o755)
    monkeypatch.chdir(tmp_path)
    trace = tmp_path / "t.jsonl"
    trace.write_text(json.dumps({"session_id": 0, "turn_id": 0, "ts": 0.0, "num_input_tokens": 40,
                                 "num_output_tokens": 2, "input_tokens": list(range(1, 41)),
                                 "output_tokens": [1, 2]}) + "\n")
    code, err = _run(["vllm", "replay", "--vllm-python", "afile", "--trace", str(trace), "--blocks", "100",
                      "--concurrency", "1", "--out", str(tmp_path / "r.jsonl")], capsys)
    assert code == 2 and "Traceback" not in err, err
    assert f"--vllm-python {tmp_path / 'afile'}: " in err and "No such file" not in err, err
    assert not (tmp_path / "r.jsonl").exists()


# ====================================================================== a tier under one chunk
def test_vllm_align_refuses_a_cpu_tier_under_one_chunk() -> None:
    """``vllm-align:cpu_tier=1`` ran with a tier of 0 chunks and exit 0."""
    message = refused(lambda: make_system("vllm-align:cpu_tier=1").build("nemotron-h-8b", 1e9),
                       "vllm-align: cpu_tier", "a tier of 1 byte holds no chunk", "cpu_tier=0")
    assert "give at least" in message
    cache = make_system("vllm-align:cpu_tier=0").build("nemotron-h-8b", 1e9)     # 0: no tier, as documented
    assert cache.engine.tier is None


def test_simulate_with_a_cpu_tier_under_one_chunk_exits_2(tmp_path: Path, capsys) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text(json.dumps({"session_id": 0, "turn_id": 0, "ts": 0.0, "num_input_tokens": 40,
                                 "num_output_tokens": 2, "input_tokens": list(range(1, 41)),
                                 "output_tokens": [1, 2]}) + "\n")
    code, err = _run(["simulate", "--trace", str(trace), "--systems", "vllm-align:cpu_tier=1", "--capacity", "1GB",
                      "--model", "nemotron-h-8b", "--workers", "1", "--quiet"], capsys)
    assert code == 2 and "cpu_tier" in err and "holds no chunk" in err and "Traceback" not in err, err


@slow
def test_vllm_replay_refuses_a_cpu_tier_under_one_chunk(tmp_path: Path, capsys) -> None:
    """``vllm replay --cpu-tier 1`` wrote records of a 0-chunk tier; it is refused as simulate's is,
    naming ``--cpu-tier`` and the chunk vLLM built (nothing written)."""
    python = vllm_python()
    trace = tmp_path / "t.jsonl"
    trace.write_text(json.dumps({"session_id": 0, "turn_id": 0, "ts": 0.0, "num_input_tokens": 40,
                                 "num_output_tokens": 2, "input_tokens": list(range(1, 41)),
                                 "output_tokens": [1, 2]}) + "\n")
    out = tmp_path / "r.jsonl"
    code, err = _run(["vllm", "replay", "--vllm-python", python, "--trace", str(trace), "--blocks", "100",
                      "--concurrency", "1", "--cpu-tier", "1", "--policies", "lru", "--tier-policies", "lru",
                      "--out", str(out), "--plot", ""], capsys)
    assert code == 2 and "--cpu-tier 1: a tier of 1 byte holds no chunk" in err and "Traceback" not in err, err
    assert not out.exists()


# ====================================================================== the retention hint
def test_the_shared_retention_domain_names_no_models_block(capsys) -> None:
    """The public ``RETENTION`` domain said ``nemotron-h-8b: 1152`` to any command serving any model."""
    assert "nemotron" not in RETENTION.hint and "1152" not in RETENTION.hint
    code, err = _run(["vllm", "replay", "--retention", "17", "--blocks", "10", "--concurrency", "1"], capsys)
    assert code == 2 and "--retention" in err and "1152" in err and "default model, nemotron-h-8b" in err, err


def test_a_blank_variable_is_unset_as_the_plugins_are() -> None:
    """``MARCONI_TIER_RULE='  '`` was refused as a rule, where a blank ``MARCONI_VLLM_*`` variable
    counts as unset: an operator's ``VAR=`` line in an env file means the same for both."""
    assert TierSettings.from_extra_config(EXTRA, env={ENV_RULE: "  ", ENV_COLD_INSERT: ""}) == \
        TierSettings.from_extra_config(EXTRA)


@pytest.mark.parametrize("option", ["decay", "hysteresis"])
def test_the_tier_chooser_refuses_a_switch_for_a_number(option) -> None:
    """``TierRuleChooser(decay=True)`` ran as decay 1 (a bool is an int to Python)."""
    from marconi.integrations.vllm.tier_chooser import TierRuleChooser

    settings = TierSettings.from_extra_config(EXTRA)
    assert "got True" in refused(lambda: TierRuleChooser(8, settings, **{option: True}), f"tier chooser {option}")
