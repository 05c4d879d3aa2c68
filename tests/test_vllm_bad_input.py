"""Bad input to ``marconi vllm replay`` and ``marconi vllm diagnose``: refused before any work, exit 2,
one line naming the flag to change, nothing written. No test here starts vLLM: each check runs on
the host before a worker would (the ``--vllm-python`` given is a path that does not exist, so a
check that came after the probe would name ``--vllm-python`` instead). The one exception, marked
slow, runs vLLM to show that the least ``--cpu-tier`` the host accepts is one chunk of vLLM's tier.
"""

from __future__ import annotations

import json
import math
import re
import time
from pathlib import Path

import pytest

from marconi.cli import build_parser
from marconi.core.registry import ConfigError
from marconi.integrations.common.bench import select_requests
from marconi.integrations.vllm.commands import setting_error
from marconi.integrations.vllm.diagnose import DiagnoseConfig
from marconi.integrations.vllm.replay.gpu_memory import BUNDLED_NUM_PARAMS, available_kv_bytes
from marconi.integrations.vllm.replay.configs import CONFIGS_DIR, VLLM_BLOCK_SIZES
from marconi.integrations.vllm.replay.pool_floor import minimum_pool
from marconi.integrations.vllm.replay.tiers import check_tier_size, parse_bandwidth, tier_chunk_bytes
from marconi.units import format_bytes

from cli_run import run_cli
from marks import slow
from vllm_env import vllm_python

MODEL = "nemotron-h-8b"      # 32 attention heads, 8 KV heads and groups, 128 Mamba heads


def _trace(path: Path, lengths: dict[int, list[int]]) -> str:
    """A token-id trace: session -> its turns' input lengths (each turn extends the previous one)."""
    lines = []
    for session, turns in lengths.items():
        for turn, n in enumerate(turns):
            lines.append(json.dumps({"session_id": session, "turn_id": turn, "ts": float(len(lines)),
                                     "num_input_tokens": n, "num_output_tokens": 4,
                                     "input_tokens": [(7 * session + i) % 30000 + 1 for i in range(n)],
                                     "output_tokens": [5, 6, 7, 8]}))
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """(exit code, stderr) of ``marconi ARGV`` (:func:`cli_run.run_cli`: no traceback, asserted)."""
    return run_cli(argv, capsys)[:2]


@pytest.fixture
def trace(tmp_path: Path) -> str:
    return _trace(tmp_path / "good.jsonl", {s: [200, 270, 340] for s in range(3)})


def _replay(tmp_path: Path, trace: str, *extra: str) -> list[str]:
    return ["vllm", "replay", "--vllm-python", str(tmp_path / "no-vllm" / "python"), "--trace", trace,
            "--concurrency", "4", "--num-requests", "5", "--out", str(tmp_path / "r.jsonl"), *extra]


# ----------------------------------------------------------------------- --gpu-memory too small
def test_replay_refuses_a_gpu_too_small_for_the_weights_before_the_worker_starts(
        tmp_path: Path, trace: str, capsys: pytest.CaptureFixture[str]) -> None:
    """It used to start the worker, which failed with a traceback (host and worker, exit 1) whose last
    line never named --gpu-memory. Now the host refuses it first, a sweep's point as well, naming the
    flags that fix it; with FP8 weights the same GPU passes (the probe of --vllm-python comes next)."""
    for memory in ("1GB", "80GB,1GB"):
        code, err = _run(_replay(tmp_path, trace, "--gpu-memory", memory), capsys)
        assert code == 2, err
        line = err.strip().splitlines()[-1]
        assert line.startswith("marconi vllm: error: --gpu-memory 1GB per GPU: "), err
        assert "--tensor-parallel" in line and "--weight-bytes 1" in line and "give --gpu-memory 23GB" in line
        assert "Traceback" not in err and "--vllm-python" not in err and not (tmp_path / "r.jsonl").exists()
    code, err = _run(_replay(tmp_path, trace, "--gpu-memory", "20GB", "--weight-bytes", "1"), capsys)
    assert code == 2 and "--vllm-python" in err and "--gpu-memory" not in err, err
    code, err = _run(_replay(tmp_path, trace, "--gpu-memory", "0.5x"), capsys)
    assert code == 2 and "error: --gpu-memory: cannot read '0.5x' as a size" in err, err


def test_diagnose_and_replay_refuse_a_small_gpu_by_one_check(
        tmp_path: Path, trace: str, capsys: pytest.CaptureFixture[str]) -> None:
    """One arithmetic, every caller: diagnose's refusal is the replay's, less the flag it does not have."""
    code, err = _run(["vllm", "diagnose", "--trace", trace, "--gpu-memory", "1GB", "--out", str(tmp_path / "d")],
                     capsys)
    assert code == 2 and not (tmp_path / "d").exists(), err
    with pytest.raises(ConfigError) as replay_refusal:
        available_kv_bytes(10**9, BUNDLED_NUM_PARAMS[MODEL], 2)
    shared = str(replay_refusal.value).split(", or FP8")[0]
    assert err.strip() == f"marconi vllm: error: {shared}"
    assert "--weight-bytes" not in err


def test_the_workers_refusal_of_gpu_memory_is_named_for_a_model_directory() -> None:
    """A model directory's parameters only vLLM counts, so the worker checks them; its failure (the
    log's tail in a RuntimeError) comes back as the same one line naming --gpu-memory."""
    with pytest.raises(ConfigError) as refusal:
        available_kv_bytes(10**9, 7 * 10**9, 2)
    message = str(refusal.value)
    tail = ("replay worker for 'lru' failed (exit 1); log /tmp/w/out-lru.log (kept only with --work-dir):\n"
            "[rank0]: Traceback (most recent call last):\n"
            '[rank0]:     raise ConfigError(f"--gpu-memory {format_bytes(gpu_memory_bytes)} per GPU: "\n'
            f"[rank0]: marconi.core.registry.ConfigError: {message}\n")
    named = setting_error(RuntimeError(tail))
    assert isinstance(named, ConfigError) and str(named) == message and message.startswith("--gpu-memory 1GB")
    assert setting_error(RuntimeError("replay worker for 'lru' failed (exit -9)")) is None


# ----------------------------------------------------------------------- --cpu-tiers
def test_diagnose_refuses_a_bad_cpu_tiers_at_parse_time(tmp_path: Path, trace: str,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """It used to become a progress note ("lever cpu-tier abc: skipped", exit 0), or with no
    --vllm-python to be ignored. Now argparse reads it as replay's --cpu-tier is read."""
    base = ["vllm", "diagnose", "--trace", trace, "--gpu-memory", "80GB", "--out", str(tmp_path / "d")]
    for vllm in ([], ["--vllm-python", str(tmp_path / "no-vllm" / "python")]):
        for bad, says in (("abc", "cannot read 'abc' as a size"), ("0.5x,0", "'0' is 0 bytes"),
                          ("0.5x,,1x", "expected a comma list")):
            code, err = _run([*base, *vllm, "--cpu-tiers", bad], capsys)
            assert code == 2 and f"error: argument --cpu-tiers: {says}" in err, (bad, err)
            assert "Traceback" not in err and not (tmp_path / "d").exists()
    parser = build_parser()
    assert parser.parse_args([*base, "--cpu-tiers", ""]).cpu_tiers == ()
    assert parser.parse_args([*base, "--cpu-tiers", "0.5x, 256GB"]).cpu_tiers == ("0.5x", "256GB")
    assert parser.parse_args(base).cpu_tiers == ("0.5x",)
    with pytest.raises(ConfigError, match=r"^--cpu-tiers: cannot read 'abc' as a size"):
        DiagnoseConfig(trace=trace, model=MODEL, cpu_tiers=("abc",))


# ----------------------------------------------------------------------- a CPU tier under one chunk
#: One chunk of vLLM's CPU tier for nemotron-h-8b: a block of every KV cache group, vLLM's 1152-token
#: block x 4,096 bytes of K and V per token and layer x 4 layers per group (vLLM's own page, 4,718,592
#: bytes, times the group's layers), already a multiple of vLLM's 4 KiB alignment.
CHUNK = 1152 * 4096 * 4


def _refusal(flag: str, size: str, given: int, fix: str) -> str:
    return (f"marconi vllm: error: {flag} {size}: a tier of {given:,} byte{'s' if given != 1 else ''} holds no "
            f"chunk (one chunk, a block of every KV cache group, is {CHUNK:,} bytes for this model): give at "
            f"least {CHUNK:,} bytes, or {fix}")


def test_replay_refuses_a_cpu_tier_under_one_chunk_before_any_arm(
        tmp_path: Path, trace: str, capsys: pytest.CaptureFixture[str]) -> None:
    """It used to run every arm through vLLM and refuse only then, from the records (19 s for
    swe-sample's first 10 requests, one arm). Now the options' check refuses it, before the trace is
    read and before --vllm-python (here a path that does not exist) is probed: no work folder, no
    --out. The least size it names passes, and the probe comes next."""
    assert tier_chunk_bytes(MODEL) == CHUNK
    out, work = tmp_path / "r.jsonl", tmp_path / "work"
    tier = ["--capacity", "0.5x", "--policies", "lru,marconi", "--tier-policies", "lru,marconi", "--work-dir", str(work)]
    for size, given in (("1", 1), ("1KB", 1000), (str(CHUNK - 1), CHUNK - 1)):
        started = time.monotonic()
        code, err = _run(_replay(tmp_path, trace, *tier, "--cpu-tier", size), capsys)
        assert code == 2 and time.monotonic() - started < 30, err
        assert err.strip() == _refusal("--cpu-tier", size, given, "drop --cpu-tier for no tier"), err
        assert not out.exists() and not work.exists()
    code, err = _run(_replay(tmp_path, trace, *tier, "--cpu-tier", str(CHUNK)), capsys)
    assert code == 2 and "--vllm-python" in err and "--cpu-tier" not in err, err
    assert not out.exists() and not work.exists()


def test_replay_refuses_a_cpu_tier_fraction_under_one_chunk_once_the_trace_is_read(
        tmp_path: Path, trace: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A fraction of the working set is refused as soon as the working set is measured, before
    --vllm-python is probed: one point, and a sweep before any of its points. The refusal names the
    working set and the least fraction that holds a chunk, which passes."""
    out = tmp_path / "r.jsonl"
    least = ""
    for capacity in ("0.5x", "0.5x,1x"):
        code, err = _run(_replay(tmp_path, trace, "--capacity", capacity, "--cpu-tier", "0.001x"), capsys)
        line = err.strip().splitlines()[-1]
        assert code == 2 and line.startswith("marconi vllm: error: --cpu-tier 0.001x: a tier of "), err
        assert f"is {CHUNK:,} bytes for this model): give at least {CHUNK:,} bytes, or drop --cpu-tier" in line
        found = re.search(r"\(0\.001x is of this trace's working set, ([0-9,]+) bytes: give at least ([0-9.e-]+)x\)$",
                          line)
        assert found is not None, line
        assert "--vllm-python" not in err and not out.exists()
        working_set, least = int(found[1].replace(",", "")), found[2]
        assert check_tier_size(f"{least}x", MODEL, working_set) == int(float(least) * working_set) >= CHUNK
        less = float(least) - 10.0 ** (math.floor(math.log10(float(least))) - 2)     # one in the third figure
        with pytest.raises(ConfigError, match=r"^--cpu-tier .*: a tier of .* holds no chunk"):
            check_tier_size(f"{less!r}x", MODEL, working_set)
    code, err = _run(_replay(tmp_path, trace, "--capacity", "0.5x", "--cpu-tier", f"{least}x"), capsys)
    assert code == 2 and "--vllm-python" in err and "--cpu-tier" not in err, err
    # a fraction that rounds to 0 bytes asked for a tier all the same: refused, saying 0 bytes
    with pytest.raises(ConfigError, match=r"^--cpu-tier 1e-12x: a tier of 0 bytes holds no chunk .*"
                                          r"\(1e-12x is of this trace's working set"):
        check_tier_size("1e-12x", MODEL, working_set)


def test_diagnose_refuses_cpu_tiers_under_one_chunk_by_the_replays_check(
        tmp_path: Path, trace: str, capsys: pytest.CaptureFixture[str]) -> None:
    """It used to replay such a tier through vLLM (after the emulated runs) and report a lever of a
    tier of no chunk. Now a size is refused with the other options, naming --cpu-tiers; a fraction
    once the trace is read, before any run (no progress bar) and before --vllm-python is probed."""
    out = tmp_path / "d"
    base = ["vllm", "diagnose", "--trace", trace, "--gpu-memory", "80GB", "--out", str(out)]
    fix = "leave it out of --cpu-tiers ('' for none)"
    code, err = _run([*base, "--cpu-tiers", "256GB,1"], capsys)
    assert code == 2 and err.strip() == _refusal("--cpu-tiers", "1", 1, fix), err
    assert not out.exists()
    code, replay_err = _run(_replay(tmp_path, trace, "--capacity", "0.5x", "--cpu-tier", "1"), capsys)
    assert replay_err.strip() == _refusal("--cpu-tier", "1", 1, "drop --cpu-tier for no tier")    # the same check
    missing = str(tmp_path / "no-vllm" / "python")
    code, err = _run([*base, "--vllm-python", missing, "--cpu-tiers", "0.5x,0.001x"], capsys)
    line = err.strip().splitlines()[-1]
    assert code == 2 and line.startswith("marconi vllm: error: --cpu-tiers 0.001x: a tier of "), err
    assert f"or {fix} (0.001x is of this trace's working set" in line
    assert "--vllm-python" not in err and "stock" not in err and not out.exists()
    with pytest.raises(ConfigError, match=r"^--cpu-tiers 1MB: a tier of 1,000,000 bytes holds no chunk"):
        DiagnoseConfig(trace=str(tmp_path / "not-read.jsonl"), model=MODEL, cpu_tiers=("1MB",))


def test_a_model_directorys_tier_is_left_to_vllms_block(tmp_path: Path) -> None:
    """vLLM's block is known here for the bundled configs only; a model directory's tier is checked
    against the block vLLM reports, after the run (the command's check of the records)."""
    model = tmp_path / "my-model"
    model.mkdir()
    (model / "config.json").write_text((CONFIGS_DIR / MODEL / "config.json").read_text())
    assert tier_chunk_bytes(str(model)) is None and check_tier_size("1", str(model)) == 1
    assert set(VLLM_BLOCK_SIZES) == {p.parent.name for p in CONFIGS_DIR.glob("*/config.json")}


@slow
@pytest.mark.parametrize("model", sorted(VLLM_BLOCK_SIZES))
def test_the_least_cpu_tier_the_host_accepts_is_one_chunk_in_vllm(
        model: str, tmp_path: Path, trace: str, capsys: pytest.CaptureFixture[str]) -> None:
    """The host's chunk is vLLM's: the size the refusal names builds a tier of exactly one chunk in
    vLLM, on vLLM's block for the model (VLLM_BLOCK_SIZES)."""
    python = vllm_python()
    argv = ["vllm", "replay", "--vllm-python", python, "--model", model, "--trace", trace, "--capacity", "0.5x",
            "--concurrency", "1", "--num-requests", "2", "--policies", "lru", "--tier-policies", "lru",
            "--no-emulation", "--out", str(tmp_path / "r.jsonl"), "--plot", ""]
    code, err = _run([*argv, "--cpu-tier", "1"], capsys)
    found = re.search(r"give at least ([0-9,]+) bytes", err)
    assert code == 2 and found is not None, err
    least = int(found[1].replace(",", ""))
    code, err = _run([*argv, "--cpu-tier", str(least)], capsys)
    assert code == 0, err
    (rec,) = [json.loads(line) for line in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert rec["block_size"] == VLLM_BLOCK_SIZES[model] and rec["tier_num_chunks"] == 1, rec


# ----------------------------------------------------------------------- --tensor-parallel
def test_diagnose_refuses_a_tensor_parallel_that_splits_heads_before_any_work(
        tmp_path: Path, trace: str, capsys: pytest.CaptureFixture[str]) -> None:
    """It used to run (exit 0) where the replay refuses the same TP. Now diagnose calls the replay's
    check before the trace is read: the same line from both commands."""
    out = tmp_path / "d"
    code, diagnose_err = _run(["vllm", "diagnose", "--trace", trace, "--gpu-memory", "80GB", "--out", str(out),
                               "--tensor-parallel", "3"], capsys)
    assert code == 2 and not out.exists(), diagnose_err
    assert diagnose_err.startswith("marconi vllm: error: --tensor-parallel 3 does not divide num_attention_heads=32")
    assert "give --tensor-parallel 1, 2, 4 or 8" in diagnose_err
    code, replay_err = _run(_replay(tmp_path, trace, "--gpu-memory", "80GB", "--tensor-parallel", "3"), capsys)
    assert code == 2 and replay_err == diagnose_err
    with pytest.raises(ConfigError, match="--tensor-parallel 3"):
        DiagnoseConfig(trace=str(tmp_path / "not-read.jsonl"), model=MODEL, tensor_parallel=3)


# ----------------------------------------------------------------------- --host-bandwidth
def test_replay_refuses_a_bad_host_bandwidth_at_parse_time_naming_it(
        tmp_path: Path, trace: str, capsys: pytest.CaptureFixture[str]) -> None:
    """It used to say "cannot read 'abc' as a size" without naming the flag; now argparse refuses it as
    it does the size options, and the library's parser names it too."""
    tier = ["--cpu-tier", "0.5x"]
    # under a byte a second reads as 0 bytes ("must be > 0" of 1e-3 contradicted itself); above 1 EB/s
    # the size's own limit is said
    for bad, says in (("abc", "cannot read 'abc' as a bandwidth"), ("0", "must be at least 1 byte/s"),
                      ("1e-3", "must be at least 1 byte/s, got '1e-3'"),
                      ("1e30GB/s", "cannot read '1e30GB/s' as a bandwidth (above 1 EB/s)"),
                      ("-5GB/s", "cannot read '-5GB/s'"), ("nan", "cannot read 'nan'")):
        code, err = _run(_replay(tmp_path, trace, *tier, "--capacity", "0.5x", f"--host-bandwidth={bad}"), capsys)
        last = err.strip().splitlines()[-1]
        assert code == 2 and f"error: argument --host-bandwidth: {says}" in last and "Traceback" not in err, (bad, err)
    with pytest.raises(ConfigError, match=r"^--host-bandwidth: cannot read 'abc' as a bandwidth"):
        parse_bandwidth("abc")
    args = build_parser().parse_args(_replay(tmp_path, trace, *tier, "--capacity", "0.5x", "--host-bandwidth", "25GB/s"))
    assert args.host_bandwidth == 25e9


# ----------------------------------------------------------------------- --max-input-len
def test_a_cap_that_ends_sessions_says_so_once_and_selects_the_same_requests(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A session ends before its first input over --max-input-len; that used to happen silently. Now
    one note says how many requests and sessions were left out and which flag keeps them; the
    selection is what it was (benchmarks compare it record for record)."""
    path = _trace(tmp_path / "t.jsonl", {0: [200, 270, 340], 1: [200, 600, 300], 2: [900, 100], 3: [100]})
    notes: list[str] = []
    sel = select_requests(path, max_input_len=500, notice=notes.append)
    assert [(r.session_id, r.input_len) for r in sel.requests] == [(0, 200), (0, 270), (0, 340), (1, 200), (3, 100)]
    assert sel.indices == [0, 1, 2, 3, 4] and sel.trace_info["trace_params"] == {"max_input_len": 500}
    assert len(notes) == 1, notes
    assert "4 of 9 requests left out: 2 with an input longer than --max-input-len 500 tokens and the 2 later " \
           "turn(s) of their sessions" in notes[0] and "raise --max-input-len to keep them" in notes[0]
    notes.clear()                        # one request per session (Mooncake): no later turns to name
    single = _trace(tmp_path / "s.jsonl", {0: [200], 1: [900], 2: [100]})
    select_requests(single, max_input_len=500, notice=notes.append)
    assert "1 of 3 requests left out: 1 with an input longer than --max-input-len 500 tokens;" in notes[0], notes
    assert "--max-input-len 500 tokens" in notes[0]
    # the default: one NOTE line on stderr; nothing when the cap cuts nothing
    select_requests(path, max_input_len=500, num_requests=2)
    err = capsys.readouterr().err
    assert err.count("NOTE:") == 1 and "--max-input-len" in err
    notes.clear()
    assert len(select_requests(path, max_input_len=900, notice=notes.append).requests) == 9 and notes == []


# ----------------------------------------------------------------------- --max-num-batched-tokens under --max-num-seqs
STEP_REFUSAL = ("marconi vllm: error: --max-num-batched-tokens 100 must be >= --max-num-seqs (256): raise it or "
                "lower --max-num-seqs")


def test_replay_refuses_a_step_budget_under_max_num_seqs_before_the_worker_starts(
        tmp_path: Path, trace: str, capsys: pytest.CaptureFixture[str]) -> None:
    """It used to start the worker, which failed as vLLM built its config (pydantic's "max_num_batched_tokens
    (100) must be greater than or equal to max_num_seqs (256)", two tracebacks). Now the options' check
    refuses it, one line naming both flags, a sweep as well; either fix passes (the probe of
    --vllm-python comes next)."""
    for load in ("4", "4,8"):
        argv = _replay(tmp_path, trace, "--blocks", "64", "--max-num-batched-tokens", "100")
        argv[argv.index("--concurrency") + 1] = load
        code, err = _run(argv, capsys)
        assert code == 2 and err.strip() == STEP_REFUSAL, err
        assert not (tmp_path / "r.jsonl").exists()
    for fixed in (["--max-num-batched-tokens", "100", "--max-num-seqs", "100"], ["--max-num-batched-tokens", "256"]):
        code, err = _run(_replay(tmp_path, trace, "--blocks", "64", *fixed), capsys)
        assert code == 2 and "--vllm-python" in err and "--max-num" not in err, (fixed, err)


def test_diagnose_refuses_max_num_seqs_over_its_step_budget_before_any_run(
        tmp_path: Path, trace: str, capsys: pytest.CaptureFixture[str]) -> None:
    """diagnose shares --max-num-seqs (not --max-num-batched-tokens: its budget is a recording's or
    8192): it used to emulate a configuration vLLM refuses to start with (exit 0), and with
    --vllm-python to fail in the worker. Now the replay's check refuses it before anything runs."""
    out = tmp_path / "d"
    base = ["vllm", "diagnose", "--trace", trace, "--gpu-memory", "80GB", "--out", str(out)]
    for vllm in ([], ["--vllm-python", str(tmp_path / "no-vllm" / "python")]):
        code, err = _run([*base, *vllm, "--max-num-seqs", "10000"], capsys)
        assert code == 2 and err.strip() == ("marconi vllm: error: --max-num-seqs 10000 must be <= vLLM's "
                                             "max_num_batched_tokens (8192, the default): give --max-num-seqs "
                                             "8192 or less"), err
        assert not out.exists()


# ----------------------------------------------------------------------- --blocks under vLLM's least pool
#: vLLM 0.32's least pool for nemotron-h-8b at the replay's least max_model_len (2,048 tokens, every
#: request of the ``trace`` fixture being shorter): 2 attention blocks of 1,152 tokens, 3 blocks in
#: each of the 6 Mamba groups, and the null block (test_vllms_floor_is_the_hosts_least_pool runs vLLM).
LEAST_BLOCKS = 21


def _blocks_refusal(blocks: int, least: int, tokens: str, fix: str = "") -> str:
    return (f"marconi vllm: error: --blocks {blocks} is below vLLM's minimum of {least} blocks for one "
            f"{tokens}-token request: give --blocks >= {least}{fix}")


def test_replay_and_diagnose_refuse_blocks_under_vllms_least_pool_by_one_check(
        tmp_path: Path, trace: str, capsys: pytest.CaptureFixture[str]) -> None:
    """It used to start the worker, which failed in vLLM ("To serve at least one request with the
    model's max seq len (7214) ... Try increasing gpu_memory_utilization", a traceback), and diagnose
    ran (or failed in its emulation, mid-run, without naming --blocks). Now both refuse it once the
    trace is read, before --vllm-python is probed, by one check: the same line (the replay also names
    --max-input-len where the longest request, not the 2,048-token least, sets vLLM's max_model_len).
    The least passes."""
    out, report = tmp_path / "r.jsonl", tmp_path / "d"
    line = _blocks_refusal(LEAST_BLOCKS - 1, LEAST_BLOCKS, "2,048")
    for blocks in (str(LEAST_BLOCKS - 1), f"64,{LEAST_BLOCKS - 1}"):
        code, err = _run(_replay(tmp_path, trace, "--blocks", blocks), capsys)
        assert code == 2 and err.strip().splitlines()[-1] == line, err
        assert "--vllm-python" not in err and not out.exists()
    code, err = _run(_replay(tmp_path, trace, "--blocks", str(LEAST_BLOCKS)), capsys)
    assert code == 2 and "--vllm-python" in err and "--blocks" not in err, err
    diagnose = ["vllm", "diagnose", "--out", str(report)]
    code, err = _run([*diagnose, "--trace", trace, "--blocks", str(LEAST_BLOCKS - 1)], capsys)
    assert code == 2 and err.strip() == line and not report.exists(), err
    # a 3,000-token prompt and its 4 output tokens: 3 attention blocks
    long = _trace(tmp_path / "long.jsonl", {0: [3000]})
    code, err = _run(_replay(tmp_path, long, "--blocks", str(LEAST_BLOCKS)), capsys)
    assert code == 2 and err.strip() == _blocks_refusal(LEAST_BLOCKS, LEAST_BLOCKS + 1, "3,004",
                                                        " or lower --max-input-len"), err
    code, err = _run([*diagnose, "--trace", long, "--blocks", str(LEAST_BLOCKS)], capsys)
    assert code == 2 and err.strip() == _blocks_refusal(LEAST_BLOCKS, LEAST_BLOCKS + 1, "3,004"), err
    assert not report.exists() and not out.exists()


def test_the_workers_refusal_of_a_small_pool_is_named_for_a_model_directory() -> None:
    """A model directory's block only vLLM knows, so vLLM refuses its --blocks; that failure (the
    log's tail in a RuntimeError) comes back as one line naming --blocks and --max-input-len."""
    tail = ("replay worker for 'lru' failed (exit 1); log /tmp/w/out-lru.log (kept only with --work-dir):\n"
            "[rank0]: Traceback (most recent call last):\n"
            "ValueError: To serve at least one request with the model's max seq len (7214), (0.44 GiB KV cache "
            "is needed, which is larger than the available KV cache memory (0.42 GiB). Based on the available "
            "memory, the estimated maximum model length is 6912. Try increasing `gpu_memory_utilization`\n")
    named = setting_error(RuntimeError(tail))
    assert isinstance(named, ConfigError)
    assert str(named) == ("--blocks: vLLM's pool holds 0.42 GiB of KV cache less its null block, under the 0.44 GiB "
                          "one 7,214-token request needs: give more --blocks or lower --max-input-len")


# ----------------------------------------------------------------------- --capacity raised to vLLM's least pool
def _floor_note(capacity: str) -> re.Pattern[str]:
    least = minimum_pool(MODEL, 2048)
    assert least is not None and least.num_blocks == LEAST_BLOCKS
    # at a line's start, or after the \r with which the sweep's progress bar clears its line
    return re.compile(rf"(?:^|\r)NOTE: --capacity {re.escape(capacity)} \([0-9.]+[KMG]?B\) raised to vLLM's "
                      rf"minimum pool of {LEAST_BLOCKS} blocks \({re.escape(format_bytes(least.pool_bytes))}\) for "
                      r"one 2,048-token request: every point under it replays that pool \(records: kv_floor_applied\)$",
                      re.MULTILINE)


def test_replay_notes_each_capacity_raised_to_vllms_least_pool_once_before_any_worker(
        tmp_path: Path, trace: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A --capacity under vLLM's least pool used to be raised to it in silence (the records' kv_floor_applied),
    so two sweep points ran the same pool under two labels. Now one NOTE per raised pool, on stderr,
    before --vllm-python is probed: once per pool whatever the loads and policies; none for a pool
    that holds the least (1GB here, the least being 21 blocks of 18.9 MB)."""
    argv = ["vllm", "replay", "--vllm-python", str(tmp_path / "no-vllm" / "python"), "--trace", trace,
            "--num-requests", "5", "--policies", "lru,marconi", "--out", str(tmp_path / "r.jsonl")]
    code, err = _run([*argv, "--capacity", "0.02x,0.1x,1GB", "--concurrency", "4,8"], capsys)
    assert code == 2 and err.strip().splitlines()[-1].startswith("marconi vllm: error: --vllm-python"), err
    for capacity in ("0.02x", "0.1x"):
        assert len(_floor_note(capacity).findall(err)) == 1 and err.count(f"--capacity {capacity} ") == 1, err
    raised = "raised to vLLM's minimum pool"       # (the trace's short inputs also get the no-hit note)
    assert "--capacity 1GB" not in err and err.count(raised) == 2
    code, err = _run([*argv, "--capacity", "0.5x", "--concurrency", "4"], capsys)
    assert code == 2 and len(_floor_note("0.5x").findall(err)) == 1 and err.count(raised) == 1, err
    assert err.index(raised) < err.index("--vllm-python")
    code, err = _run([*argv, "--capacity", "1GB", "--concurrency", "4"], capsys)
    assert code == 2 and raised not in err and "--vllm-python" in err, err
    assert not (tmp_path / "r.jsonl").exists()


@slow
@pytest.mark.parametrize("model", sorted(VLLM_BLOCK_SIZES))
def test_vllms_floor_is_the_hosts_least_pool(
        model: str, tmp_path: Path, trace: str, capsys: pytest.CaptureFixture[str]) -> None:
    """The host's least pool is vLLM's: a 1-byte --capacity is raised, in vLLM, to exactly the pool
    the host's note and --blocks refusal name, for every bundled model (vLLM's own block for each)."""
    least = minimum_pool(model, 2048)
    assert least is not None
    argv = ["vllm", "replay", "--vllm-python", vllm_python(), "--model", model, "--trace", trace,
            "--capacity", "1", "--concurrency", "1", "--num-requests", "2", "--policies", "lru",
            "--no-emulation", "--out", str(tmp_path / "r.jsonl"), "--plot", ""]
    code, err = _run(argv, capsys)
    assert code == 0 and f"raised to vLLM's minimum pool of {least.num_blocks} blocks" in err, err
    (rec,) = [json.loads(line) for line in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert rec["kv_floor_applied"] and (rec["num_blocks"], rec["pool_bytes"]) == (least.num_blocks, least.pool_bytes)


def test_a_sweep_tells_the_requests_its_cap_left_out_once_not_once_per_point(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Old: each sweep point printed the selection's "N of M requests left out ... --max-input-len"
    NOTE as it ran (3 points, 3 NOTEs). The sweep's check of every point, before any runs, tells it
    once, and the points leave it untold."""
    argv = ["vllm", "replay", "--vllm-python", str(tmp_path / "no-vllm" / "python"), "--trace", "mooncake-sample",
            "--max-input-len", "4000", "--num-requests", "5", "--policies", "lru", "--out", str(tmp_path / "r.jsonl"),
            "--capacity", "0.3x,0.5x", "--concurrency", "4,8"]
    code, err = _run(argv, capsys)
    assert code == 2 and err.strip().splitlines()[-1].startswith("marconi vllm: error: --vllm-python"), err
    assert err.count("requests left out") == 1 and "raise --max-input-len to keep them" in err, err
    assert err.index("requests left out") < err.index("--vllm-python")


def test_a_replay_where_no_input_is_longer_than_vllms_block_says_no_hit_is_possible(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Old: Falcon-H1 (vLLM's block 3,200 tokens) on short requests read 0.0% hits, 0 B loaded and
    stored, with nothing saying that no request could ever hit."""
    argv = ["vllm", "replay", "--vllm-python", str(tmp_path / "no-vllm" / "python"), "--trace", "chat-synthetic",
            "--max-input-len", "3000", "--num-requests", "60", "--policies", "lru", "--concurrency", "2",
            "--out", str(tmp_path / "r.jsonl")]
    code, err = _run([*argv, "--model", "falcon-h1-7b", "--capacity", "1GB"], capsys)
    assert code == 2 and "--vllm-python" in err.strip().splitlines()[-1], err
    assert re.search(r"NOTE: no input of the 60 replayed is longer than vLLM's block for falcon-h1-7b \(3,200 "
                     r"tokens; the longest has [\d,]+\): vLLM caches whole blocks, so no request can hit", err), err
    code, err = _run([*argv, "--model", "falcon-h1-7b", "--capacity", "1GB,2GB"], capsys)    # a sweep: once
    assert code == 2 and err.count("no request can hit") == 1, err
    code, err = _run([*argv, "--model", "nemotron-h-8b", "--capacity", "1GB"], capsys)   # 1,152-token blocks: some
    assert code == 2 and "no request can hit" not in err, err
