"""Issue 31, mechanisms 2 and 3: every numeric option and name parameter declares its domain once.

The walks below take every option from the parser itself (``build_parser()``) and every name
parameter from the registries (``SYSTEMS``, ``ADMISSION_POLICIES``, ``EVICTION_POLICIES``), and try
0, -1, nan, inf and 10^12 on each: a value is either in the declared domain (and accepted) or
refused with exit code 2 / a ConfigError naming the option or parameter, never a traceback. The
named tests after the walks are the issue's rows, one each.
"""

from __future__ import annotations

import argparse
import time
from typing import Any, Iterator

import pytest

from marconi.cli import build_parser
from marconi.core.admission import ADMISSION_POLICIES
from marconi.core.eviction import EVICTION_POLICIES
from marconi.core.registry import ConfigError, Domain, parse_name, split_name_list
from marconi.options import MAX_CHECKPOINT_BUDGET, CapacityList
from marconi.sim.backends import worker_count
from marconi.sim.systems import SYSTEMS, make_system, parse_systems

PROBES = ("0", "-1", "nan", "inf", "1e12")

# Options a command cannot parse without (the mutually exclusive groups of `vllm replay` included).
REQUIRED: dict[str, list[str]] = {
    "simulate": ["--trace", "t"], "mrc": ["--trace", "t"], "compare": ["r"],
    "trace build synthetic": ["chat", "--out", "o.jsonl"], "trace build bundled": ["swe-sample", "--out", "o.jsonl"],
    "trace build sharegpt": ["--out", "o.jsonl"], "trace build lmsys": ["f", "--out", "o.jsonl"],
    "trace build swe": ["--out", "o.jsonl"], "trace build mooncake": ["--out", "o.jsonl"],
    "trace build quality": ["--out", "o.jsonl"], "trace validate": ["f"], "trace stats": ["f"],
    "experiment sparse": ["--out", "o"], "experiment headroom": ["--out", "o"], "vllm frontier": ["--out", "o"],
}
REPLAY_GROUPS = (("--blocks", "100"), ("--concurrency", "1"))
REPLAY_EXCLUSIVE = {"--blocks": 0, "--capacity": 0, "--gpu-memory": 0, "--concurrency": 1, "--rate": 1,
                    "--trace-times": 1}


def _leaves(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield " ".join(path), parser
    for action in subs:
        for name, sub in action.choices.items():
            yield from _leaves(sub, path + (name,))


def _numeric_options() -> list[tuple[str, str, Any]]:
    out = []
    for command, leaf in _leaves(build_parser()):
        for action in leaf._actions:
            if action.option_strings and (hasattr(action.type, "domain") or isinstance(action.type, CapacityList)
                                          or action.type is worker_count):
                out.append((command, action.option_strings[-1], action.type))
    return out


NUMERIC = _numeric_options()


def _base(command: str, flag: str) -> list[str]:
    argv = command.split() + REQUIRED.get(command, [])
    if command == "vllm replay":
        for i, (option, value) in enumerate(REPLAY_GROUPS):
            if REPLAY_EXCLUSIVE.get(flag) != i:
                argv += [option, value]
    return argv


PARSER = build_parser()      # parse_args leaves the parser as it was: one for every case


def _parse(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, Any, str]:
    try:
        args = PARSER.parse_args(argv)
        code = 0
    except SystemExit as exc:
        args, code = None, int(exc.code or 0)
    return code, args, capsys.readouterr().err


def _admits(kind: Any, probe: str) -> bool:
    """Whether the option's own declaration says ``probe`` is a valid value."""
    if isinstance(kind, CapacityList):
        return probe in ("1e12",) or (probe == "0" and kind.allow_zero)
    if kind is worker_count:      # >= 1, read by int(): "1e12" is refused too (a count above the CPUs is capped)
        return False
    domain: Domain = kind.domain
    return domain.admits(float(probe))


def test_no_numeric_option_is_a_bare_int_or_float() -> None:
    """Mechanism 2: a numeric option declares its domain (marconi.options.Number and friends);
    ``type=int`` or ``type=float`` would take -1, nan and inf silently."""
    bare = [f"{c} {a.option_strings[-1]}" for c, leaf in _leaves(build_parser()) for a in leaf._actions
            if a.type in (int, float)]
    assert not bare, "declare a domain (marconi.options.Number) for: " + ", ".join(bare)
    flags = {(c, f) for c, f, _ in NUMERIC}
    assert {("vllm replay", "--blocks"), ("vllm replay", "--trace-times"), ("vllm replay", "--max-output-len"),
            ("vllm frontier", "--budgets"), ("sglang bench", "--num-requests"), ("mrc", "--lo")} <= flags


@pytest.mark.parametrize("command,flag,kind", NUMERIC, ids=[f"{c} {f}" for c, f, _ in NUMERIC])
def test_every_numeric_option_takes_its_domain_and_refuses_the_rest_at_parse_time(
        command: str, flag: str, kind: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """Mechanism 2: 0, -1, nan, inf and 10^12 on every numeric option of every command."""
    for probe in PROBES:
        code, args, err = _parse(_base(command, flag) + [f"{flag}={probe}"], capsys)
        if probe in ("nan", "inf"):
            assert code == 2, (flag, probe, "accepted")
        if code == 0:
            assert _admits(kind, probe), f"{command} {flag}={probe} accepted but outside its declared domain"
        else:
            assert code == 2 and f"argument {flag}" in err and "Traceback" not in err, (flag, probe, err)
            assert not _admits(kind, probe), f"{command} {flag}={probe} refused but inside its declared domain"


def _registry_params() -> list[tuple[Any, str, str]]:
    return [(reg, name, param) for reg in (SYSTEMS, ADMISSION_POLICIES, EVICTION_POLICIES) for name in reg.names()
            for param in reg.numeric_params_of(name)]


PARAMS = _registry_params()


def test_every_numeric_name_parameter_declares_its_domain() -> None:
    """Mechanism 3: a registered factory's numeric parameter has a Domain (``register(domains=)``)."""
    missing = [f"{reg.kind} {name}:{param}" for reg, name, param in PARAMS if param not in reg.domains_of(name)]
    assert not missing, "declare a Domain at registration for: " + ", ".join(missing)
    assert ("budget" in SYSTEMS.domains_of("vllm-align") and "m" in ADMISSION_POLICIES.domains_of("sparse-dp")
            and "alpha" in SYSTEMS.domains_of("marconi"))


@pytest.mark.parametrize("reg,name,param", PARAMS, ids=[f"{r.kind}:{n}:{p}" for r, n, p in PARAMS])
def test_every_numeric_name_parameter_takes_its_domain_and_refuses_the_rest(reg: Any, name: str, param: str) -> None:
    """Mechanism 3: 0, -1, nan, inf and 10^12 on every numeric name parameter of the registries.
    Outside the domain: a ConfigError naming the parameter. Inside: created, or refused by a rule
    that involves another parameter (still naming this one), never another exception."""
    domain = reg.domains_of(name)[param]
    context = "retention=sparse-dp," if (name, param) == ("vllm-align", "budget") else ""   # budget needs it
    for probe in PROBES:
        text = f"{name}:{context}{param}={probe}"
        try:
            make_system(text) if reg is SYSTEMS else reg.create(text)
        except ConfigError as exc:
            assert param in str(exc), (text, str(exc))
            continue
        assert probe not in ("nan", "inf"), f"{text} accepted"
        assert domain.admits(float(probe)), f"{text} accepted outside its declared domain {domain.describe()}"


# ------------------------------------------------------------------------- the rows, by name
def _refused(argv: list[str], capsys: pytest.CaptureFixture[str], flag: str) -> str:
    code, _, err = _parse(argv, capsys)
    assert code == 2 and f"argument {flag}" in err and "Traceback" not in err, (argv, err)
    return err


REPLAY = ["vllm", "replay", "--concurrency", "1"]


def test_bug5_vllm_replay_capacity_zero_is_refused_not_one_tebibyte(capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 31 bug 5: ``--capacity 0`` became 1 TiB through ``available_bytes or 1 << 40`` (the
    engine now refuses 0 bytes too: replay/engine.py)."""
    for zero in ("0", "0GB", "0B", "0,10GB"):
        assert "0 bytes" in _refused(REPLAY + ["--capacity", zero], capsys, "--capacity")
    for zero in ("0x", "0%"):
        assert "must be > 0" in _refused(REPLAY + ["--capacity", zero], capsys, "--capacity")
    assert "0 bytes" in _refused(REPLAY + ["--gpu-memory", "0"], capsys, "--gpu-memory")
    assert "0 bytes" in _refused(["sglang", "bench", "--capacity", "0"], capsys, "--capacity")
    code, args, _ = _parse(REPLAY + ["--capacity", "0.05x,10GB"], capsys)
    assert code == 0 and args.capacity == "0.05x,10GB"


def test_bug6_trace_times_inf_and_nan_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 31 bug 6: ``--trace-times inf`` hung (0 x inf = nan arrivals)."""
    for bad in ("inf", "nan", "-inf", "0", "-1", "1e400"):
        _refused(["vllm", "replay", "--blocks", "100", f"--trace-times={bad}"], capsys, "--trace-times")
    code, args, _ = _parse(["vllm", "replay", "--blocks", "100", "--trace-times"], capsys)
    assert code == 0 and args.trace_times == 1.0


def test_bug8_max_output_len_below_one_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 31 bug 8: ``--max-output-len -1`` dropped every request's last output token."""
    for command in (REPLAY + ["--blocks", "100"], ["vllm", "bench"]):
        for bad in ("-1", "0", "1.5", "nan"):
            _refused(command + [f"--max-output-len={bad}"], capsys, "--max-output-len")


def test_unclear_blocks_zero_negative_and_huge_are_refused_naming_blocks(capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 31 unclear row: ``--blocks 0``, ``-3``, ``1e10`` failed inside the worker."""
    for bad in ("0", "-3", "1e10", "1", "2.5"):
        err = _refused(REPLAY + [f"--blocks={bad}"], capsys, "--blocks")
        assert "integer >= 2" in err
        _refused(["vllm", "bench", f"--blocks={bad}"], capsys, "--blocks")
    code, args, _ = _parse(REPLAY + ["--blocks", "100,1e3"], capsys)
    assert code == 0 and args.blocks == [100, 1000]


def test_unclear_scheduler_limits_zero_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 31 unclear row: ``--max-num-batched-tokens 0``, ``--max-num-seqs 0`` (pydantic's text)."""
    for flag in ("--max-num-batched-tokens", "--max-num-seqs"):
        _refused(REPLAY + ["--blocks", "100", flag, "0"], capsys, flag)
    _refused(["vllm", "bench", "--max-num-batched-tokens", "0"], capsys, "--max-num-batched-tokens")
    _refused(["vllm", "frontier", "--out", "o", "--max-num-batched-tokens", "0"], capsys, "--max-num-batched-tokens")


def test_unclear_retention_not_a_block_multiple_is_refused_naming_retention(capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 31 unclear row: ``--retention 7``. vLLM requires ``prefix_cache_retention_interval`` >= 0
    and a multiple of the scheduler's block (vllm/v1/core/kv_cache_coordinator.py), and its blocks
    are multiples of 16 tokens."""
    for bad in ("7", "-16", "abc", "nan", "100"):
        err = _refused(REPLAY + ["--blocks", "100", f"--retention={bad}"], capsys, "--retention")
        assert "multiple of the model's block" in err
        _refused(["vllm", "bench", f"--retention={bad}"], capsys, "--retention")
    for good in ("0", "none", "sparse-dp", "2304", "NONE"):
        code, args, _ = _parse(REPLAY + ["--blocks", "100", "--retention", good], capsys)
        assert code == 0 and args.retention == good
    _refused(["vllm", "frontier", "--out", "o", "--intervals", "0,-512"], capsys, "--intervals")


def test_unclear_num_requests_zero_names_num_requests_not_max_input_len(capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 31 unclear row: ``--num-requests 0`` blamed ``--max-input-len``."""
    for command in (REPLAY + ["--blocks", "100"], ["vllm", "bench"], ["sglang", "bench"]):
        for bad in ("0", "-3"):
            error_line = _refused(command + [f"--num-requests={bad}"], capsys, "--num-requests").strip().splitlines()[-1]
            assert "--num-requests" in error_line and "--max-input-len" not in error_line


def test_unclear_duplicate_policies_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 31 unclear row: ``--policies lru,lru`` gave two identical records under one label."""
    for command in (REPLAY + ["--blocks", "100"], ["vllm", "bench"], ["sglang", "bench"]):
        err = _refused(command + ["--policies", "lru,lru"], capsys, "--policies")
        assert "lru given twice" in err
        _refused(command + ["--policies", "lru,,marconi"], capsys, "--policies")
    code, args, _ = _parse(["sglang", "bench", "--policies", "lru,marconi:alpha=1,marconi:alpha=adaptive"], capsys)
    assert code == 0


def test_unclear_frontier_empty_traces_is_refused_naming_traces(capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 31 unclear row: ``vllm frontier --traces ''`` said ".: unknown trace format"."""
    for bad in ("", ",", "quality,,swe-sample", "quality,quality"):
        err = _refused(["vllm", "frontier", "--out", "o", "--traces", bad], capsys, "--traces")
        assert "unknown trace format" not in err


def test_bug4_sparse_dp_budget_is_bounded_in_every_spelling(capsys: pytest.CaptureFixture[str],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 31 bug 4: a budget of 10^9 gave a MemoryError or an OOM kill, 10^5 took minutes. Every
    spelling is refused at once, naming its option, parameter or variable."""
    huge = "1000000000"
    _refused(REPLAY + ["--blocks", "100", "--retention", "sparse-dp", "--retention-budget", huge], capsys,
             "--retention-budget")
    _refused(["vllm", "frontier", "--out", "o", "--budgets", f"0,{huge}"], capsys, "--budgets")
    _refused(["experiment", "sparse", "--out", "o", "--budgets", huge], capsys, "--budgets")
    started = time.process_time()
    for text, name in ((f"vllm-align:retention=sparse-dp,budget={huge}", "budget"),
                       (f"custom:admission=sparse-dp(m={huge})", "m"), (f"vllm-align:retention=sparse-dp,budget=1e5", "budget")):
        with pytest.raises(ConfigError, match=f"{name}: must be an integer >= 0 and <= {MAX_CHECKPOINT_BUDGET:,}"):
            parse_systems(text)
    with pytest.raises(ConfigError, match="m: must be"):
        ADMISSION_POLICIES.create(f"sparse-dp:m={huge}")
    assert time.process_time() - started < 60   # refused, not attempted (a generous bound, not a timing test)
    from marconi.integrations.vllm.config import ENV_RETENTION_BUDGET, PluginConfig

    with pytest.raises(ConfigError, match=ENV_RETENTION_BUDGET):
        PluginConfig.from_env({"MARCONI_VLLM_POLICY": "lru", "MARCONI_VLLM_RETENTION": "sparse-dp",
                               ENV_RETENTION_BUDGET: huge})
    with pytest.raises(ConfigError, match=ENV_RETENTION_BUDGET):
        PluginConfig(policy="lru", retention="sparse-dp", retention_budget=10**9)
    assert make_system(f"vllm-align:retention=sparse-dp,budget={MAX_CHECKPOINT_BUDGET}") is not None


def test_unclear_commas_inside_parentheses_do_not_split_a_name() -> None:
    """Issue 31 unclear row: ``custom:admission=marconi(tails=reach),eviction=...`` was split at
    the comma inside the parentheses."""
    text = "vanilla,custom:admission=marconi(tails=reach),eviction=flop-aware(alpha=1;recency=linear),sglang+"
    assert split_name_list(text) == ["vanilla", "custom:admission=marconi(tails=reach),eviction=flop-aware(alpha=1;"
                                                "recency=linear)", "sglang+"]
    assert parse_name("custom:admission=uniform(m=8,paged=false),eviction=lru").params == {
        "admission": "uniform(m=8,paged=false)", "eviction": "lru"}
    systems = parse_systems("custom:admission=marconi(tails=reach),eviction=lru")
    assert len(systems) == 1 and systems[0].admission == "marconi:tails=reach" and systems[0].eviction == "lru"
    with pytest.raises(ConfigError, match="unbalanced parentheses.*separated by ';'"):
        parse_systems("custom:admission=marconi(tails=reach,eviction=lru")


def test_unclear_an_empty_name_parameter_is_an_error_naming_it() -> None:
    """Issue 31 unclear row: ``marconi:rules=`` silently meant the default family (``rules=/`` was an error)."""
    for text, param in (("marconi:rules=", "rules"), ("marconi:alpha=", "alpha"), ("vllm-align:budget= ", "budget"),
                        ("custom:admission=,eviction=lru", "admission")):
        with pytest.raises(ConfigError, match=f"parameter '{param}' is empty"):
            make_system(text)


def test_domain_describes_and_checks_what_it_declares() -> None:
    d = Domain(0, 1024, integer=True, multiple_of=16, words=("none",), hint="h")
    assert d.parse("32") == 32 and d.parse("1.024e3") == 1024 and d.parse(" NONE ") == "none"
    for bad in ("8", "2048", "-16", "nan", "inf", "1.5", "x", ""):
        with pytest.raises(ConfigError, match=r"must be an integer >= 0 and <= 1,024, a multiple of 16, or none.*\(h\)"):
            d.parse(bad)
    assert Domain(0, 1, lo_open=True, hi_open=True).describe() == "a finite number > 0 and < 1"
    assert d.interval() == "[0, 1,024] integer multiple of 16 or none"       # as `marconi systems` lists it
    assert Domain(0, 1, lo_open=True).interval() == "(0, 1]" and Domain().interval() == "(-inf, inf)"


_ZERO_BUDGET = """
from marconi.integrations.vllm.replay.engine import build_engine_core
from marconi.integrations.vllm.replay.run import model_dir
for budget in (0, -1):
    try:
        build_engine_core(str(model_dir("nemotron-h-8b")), available_bytes=budget)
    except ValueError as exc:
        print("REFUSED", exc)
    else:
        print("BUILT")
"""


@pytest.mark.slow  # one vLLM import (~15 s)
def test_bug5_the_replay_engine_refuses_a_zero_kv_budget_instead_of_one_tebibyte() -> None:
    """Issue 31 bug 5, the library half: ``build_engine_core(available_bytes=0)`` built a 1 TiB pool
    (``available_bytes or 1 << 40``); a capacity that resolves to 0 bytes (a fraction of an empty
    working set) must be an error."""
    import os
    import subprocess

    from vllm_env import VLLM_PYTHON, require_vllm

    require_vllm()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MARCONI_VLLM_")}
    proc = subprocess.run([VLLM_PYTHON, "-c", _ZERO_BUDGET], capture_output=True, text=True, timeout=300,
                          env={**env, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith(("REFUSED", "BUILT"))]
    assert len(lines) == 2 and all(line.startswith("REFUSED available_bytes must be > 0") for line in lines), lines


def test_engine_bench_lengths_are_bounded_before_the_model_loads() -> None:
    """``engine bench --lengths 1000000000000`` would have allocated a 10^12-token prefill; the
    list is read by the handler (``''`` skips the runs), so its bound is there, named."""
    from marconi.lab.engine_bench_command import parse_lengths

    assert parse_lengths("64,4096") == [64, 4096] and parse_lengths("") == []
    with pytest.raises(ConfigError, match="--lengths: every length must be <= 16,777,216 tokens"):
        parse_lengths("64,1000000000000")


def test_unclear_retention_vllm_refuses_in_its_worker_is_named_as_the_option() -> None:
    """Issue 31 unclear row, the rest of ``--retention``: a multiple of 16 that is not a multiple of
    the block vLLM chose (nemotron-h-8b: 1152 on vLLM 0.32) is refused by vLLM inside the worker,
    which reached the user as a traceback; it is a ConfigError naming ``--retention`` and the block.
    The text is vLLM 0.32's own (_validate_prefix_cache_retention_interval)."""
    from marconi.integrations.vllm.commands import setting_error

    worker = RuntimeError("replay worker for 'lru' failed (exit 1); log /tmp/x/out-lru.log:\n[rank0]: ValueError: "
                          "prefix_cache_retention_interval (32) must be non-negative and a multiple of "
                          "scheduler_block_size (1152).\n")
    named = setting_error(worker)
    assert isinstance(named, ConfigError)
    assert str(named).startswith("--retention 32: vLLM's block for this model is 1152 tokens") and "2304" in str(named)
    assert setting_error(RuntimeError("replay worker for 'lru' failed (exit 1): MemoryError")) is None


def test_a_capacity_given_twice_is_refused_wherever_capacities_are_listed(capsys) -> None:
    """``--gpu-memory 80GB,80GB`` ran both pools under one label and the report merged them; ``experiment
    sparse --capacities large,large`` wrote every record twice; ``0GB`` there failed only after the
    tasks were built, without naming the flag (audit). Budgets and traces refused repeats already."""
    sparse = ["experiment", "sparse", "--out", "o", "--capacities"]
    for argv, says in ((["vllm", "frontier", "--out", "o", "--gpu-memory", "80GB,80 GB"],
                        "'80GB' and '80 GB' given twice"),
                       (["simulate", "--capacity", "0.5x,0.5x"], "'0.5x' given twice"),
                       ([*sparse, "large,large"], "'large' given twice"),
                       ([*sparse, "0GB"], "argument --capacities: '0GB' is 0 bytes")):
        code, _, err = _parse(argv, capsys)
        assert code == 2 and says in err, (argv, err)
    assert CapacityList()("1GB,2GB,0.5x") == "1GB,2GB,0.5x"
