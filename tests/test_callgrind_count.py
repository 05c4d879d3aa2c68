"""``benchmarks/callgrind_count.py``: the overhead bench's counting mode (issue 33: the scheduler's
work counted, not timed, so that a ratio does not move with the machine's load)."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

_BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, _BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module              # the overhead bench imports it by name where it counts
    spec.loader.exec_module(module)
    return module


cg = _load("callgrind_count")
bench = _load("vllm_sched_overhead")


def _cache(folder: Path, level: int, kind: str, size: str, ways: int, line: int = 64) -> None:
    folder.mkdir(parents=True)
    for name, value in (("level", level), ("type", kind), ("size", size), ("ways_of_associativity", ways),
                        ("coherency_line_size", line)):
        (folder / name).write_text(f"{value}\n")


def test_the_simulated_caches_are_this_machines_l1_and_last_level(tmp_path):
    _cache(tmp_path / "index0", 1, "Data", "48K", 12)
    _cache(tmp_path / "index1", 1, "Instruction", "32K", 8)
    _cache(tmp_path / "index2", 2, "Unified", "1024K", 8)
    _cache(tmp_path / "index3", 3, "Unified", "32768K", 16)
    assert cg.cache_options(tmp_path) == ["--I1=32768,8,64", "--D1=49152,12,64", "--LL=33554432,16,64"]
    # no last level, an unreadable field, no folder: valgrind's own detection (no options)
    (tmp_path / "index3" / "size").write_text("big\n")
    assert cg.cache_options(tmp_path) == []
    assert cg.cache_options(tmp_path / "absent") == []


def _dump(path: Path, trigger: str, totals: str, events: str = "Ir Dr Dw I1mr D1mr D1mw ILmr DLmr DLmw") -> None:
    path.write_text(f"# callgrind format\nversion: 1\ncreator: callgrind-3.19.0\ndesc: Trigger: {trigger}\n"
                    f"events: {events}\nsummary: 0\nfl=(1) x.c\nfn=(1) f\n3 5 0 0\ntotals: {totals}\n")


def test_each_named_dump_is_read_and_the_programs_end_is_not(tmp_path):
    _dump(tmp_path / "callgrind.7.out", "Program termination", "0 0 0 0 0 0 0 0 0")
    _dump(tmp_path / "callgrind.7.out.1", "Client Request: stock#0", "1000 300 200 40 30 20 3 2 1")
    _dump(tmp_path / "callgrind.7.out.2", "Client Request: marconi#0", "1100 300 200 40 30 20 3 2 1")
    got = cg.read_dumps(tmp_path)
    assert set(got) == {"stock#0", "marconi#0"}
    assert got["stock#0"] == dict(zip(cg.EVENTS, [1000, 300, 200, 40, 30, 20, 3, 2, 1]))
    # Ir + 10 * (I1mr + D1mr + D1mw) + 100 * (ILmr + DLmr + DLmw)
    assert cg.cycles_est(got["stock#0"]) == 1000 + 10 * 90 + 100 * 6
    assert cg.cycles_est({"Ir": 5}) == 5


def test_a_broken_or_repeated_dump_is_named(tmp_path):
    (tmp_path / "callgrind.1.out.1").write_text("desc: Trigger: Client Request: stock#0\nevents: Ir\n")
    with pytest.raises(ValueError, match=r"callgrind\.1\.out\.1: callgrind dump 'stock#0' has no"):
        cg.read_dumps(tmp_path)
    _dump(tmp_path / "callgrind.1.out.1", "Client Request: stock#0", "5 0 0 0 0 0 0 0 0")
    _dump(tmp_path / "callgrind.1.out.2", "Client Request: stock#0", "6 0 0 0 0 0 0 0 0")
    with pytest.raises(ValueError, match="appears twice"):
        cg.read_dumps(tmp_path)


def _run(ir: int, l1: int, steps: int) -> dict:
    return {"num_steps": steps, "evicted": 10, "counted": {"Ir": ir, "D1mr": l1}}


def test_the_counted_ratios_are_per_step_against_the_reference():
    runs = {"stock": [_run(1000, 10, 10), _run(1000, 10, 10)],
            "marconi": [_run(1100, 10, 10), _run(1100, 10, 10)],
            "adaptive": [_run(1200, 20, 8), _run(1300, 20, 8)],
            "stock@base": [_run(2000, 0, 10)], "marconi@base": [_run(2200, 0, 10)]}
    rows, ratios = bench.count_rows(runs, "stock")
    assert ratios["stock"] == (1.0, 1.0)
    # per step: 110 against 100 instructions; estimated cycles (1100 + 100) / (1000 + 100)
    assert ratios["marconi"] == pytest.approx((1.1, 1200 / 1100))
    # fewer steps: per step 1250 / 8 (the median of the two rounds) against 100
    assert ratios["adaptive"][0] == pytest.approx(1250 / 8 / 100)
    assert ratios["marconi@base"] == pytest.approx((1.1, 1.1))             # against stock@base, not stock
    adaptive = next(r for r in rows if r["config"] == "adaptive")
    assert adaptive["spread"] == f"{100 * (1500 / 1400 - 1):.2f}%"           # the rounds' counts differ by 7%


def _buildable() -> bool:
    return (shutil.which("valgrind") is not None and (shutil.which("gcc") or shutil.which("cc")) is not None
            and Path("/usr/include/valgrind/callgrind.h").exists())


needs_valgrind = pytest.mark.skipif(not _buildable(), reason="valgrind, its headers or a C compiler missing")


@needs_valgrind
def test_outside_valgrind_the_counter_refuses(tmp_path):
    lib = cg.build_lib(tmp_path)
    with pytest.raises(RuntimeError, match="not running under valgrind"):
        cg.Counter(lib)


@needs_valgrind
@pytest.mark.slow
def test_only_the_bracketed_calls_are_counted(tmp_path):
    """A Python process under the bench's valgrind command counts a loop once in its first run and
    twice in its second, and nothing of the same loop run outside the brackets."""
    lib = cg.build_lib(tmp_path)
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    script = tmp_path / "counted.py"
    script.write_text(f"""import sys
sys.path.insert(0, {str(_BENCH)!r})
import callgrind_count
counter = callgrind_count.Counter({str(lib)!r})
def work():
    return sum(i * i for i in range(20000))
for name, times in (("once", 1), ("twice", 2)):
    counter.begin()
    work()                                   # instrumented, not collected
    for _ in range(times):
        counter.toggle(); work(); counter.toggle()
    work()
    counter.end(name)
""")
    proc = subprocess.run([*cg.command(dumps), sys.executable, str(script)], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = cg.read_dumps(dumps)
    assert set(got) == {"once", "twice"}
    once, twice = got["once"]["Ir"], got["twice"]["Ir"]
    assert once > 20000 * 10                                # the loop's 20,000 iterations were counted
    assert twice == pytest.approx(2 * once, rel=0.02)       # twice the bracketed work, none of the rest
