"""Count instead of time: the scheduler's work under valgrind's callgrind, for the overhead bench.

``vllm_sched_overhead.py --callgrind`` runs its configurations in one process under
``valgrind --tool=callgrind`` and counts only the calls it times (``Scheduler.schedule`` and
``Scheduler.update_from_output``): collection is toggled on and off around each by valgrind client
requests (``callgrind_ctl.c``, compiled here into a scratch folder and called through ``ctypes``),
and each configuration's run is dumped under its own name. On a shared 2-vCPU machine the timed
ratio moves by a tenth between runs; these counts are the same in every run of the same code and
inputs (``PYTHONHASHSEED`` is fixed), whatever else the machine does.

What is counted, per event (callgrind's names):

* ``Ir``: user-space instructions executed;
* ``I1mr``, ``D1mr``, ``D1mw``: first-level cache misses, and ``ILmr``, ``DLmr``, ``DLmw``
  last-level misses, in callgrind's simulation of a two-level cache with this machine's geometry
  (its L1 and its last level, read from ``/sys``; valgrind's own detection where that is unreadable).

:func:`cycles_est` combines them as KCachegrind's cycle estimation does: ``Ir + 10·L1 misses + 100·LL
misses``. It is a model, not a clock. Branches are left out: callgrind's predictor (last target per
branch) mispredicts half of the interpreter's indirect dispatches, which a current CPU's predictor does
not, and that term would then outweigh the caches'. Outside the count: the kernel (system calls, e.g.
the pipe write that hands a finished request to adaptive α's replay process and the wake-up it causes,
and page faults), the L2 and the TLB, and every other process (that replay process runs natively,
untraced). So a counted ratio is what the plugin's own code adds to the scheduler thread's work; the
timed ratio is still what a server pays.

Needs valgrind with its headers (Debian's ``valgrind`` package ships both) and a C compiler.
"""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import subprocess
from pathlib import Path

#: callgrind's events with ``--cache-sim=yes``, in its output's order.
EVENTS = ("Ir", "Dr", "Dw", "I1mr", "D1mr", "D1mw", "ILmr", "DLmr", "DLmw")
_SOURCE = Path(__file__).with_name("callgrind_ctl.c")
_CACHES = Path("/sys/devices/system/cpu/cpu0/cache")


def build_lib(out_dir: Path) -> Path:
    """Compile ``callgrind_ctl.c`` into ``out_dir``; the shared library's path. SystemExit, naming
    what to install, where valgrind, a C compiler or valgrind's headers are missing."""
    if shutil.which("valgrind") is None:
        raise SystemExit("--callgrind: valgrind not found on PATH (Debian: apt-get install valgrind)")
    cc = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        raise SystemExit("--callgrind: no C compiler found (set CC, or install gcc) to build callgrind_ctl.c")
    lib = Path(out_dir) / "libcallgrind_ctl.so"
    proc = subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", str(lib), str(_SOURCE)], capture_output=True, text=True)
    if proc.returncode != 0:
        hint = (" (valgrind's headers, valgrind/callgrind.h, are missing: Debian's valgrind package ships them)"
                if "callgrind.h" in proc.stderr else "")
        raise SystemExit(f"--callgrind: {cc} could not build {_SOURCE}{hint}:\n{proc.stderr.strip()}")
    return lib


def _size(text: str) -> int:
    """``32K`` / ``1024K`` / ``32M`` (sysfs's cache sizes) in bytes."""
    m = re.fullmatch(r"(\d+)([KMG]?)", text.strip())
    if m is None:
        raise ValueError(f"not a cache size: {text!r}")
    return int(m.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30}[m.group(2)]


def cache_options(caches: Path = _CACHES) -> list[str]:
    """``--I1``, ``--D1`` and ``--LL`` for this machine's first-level caches and its last level, from
    ``caches`` (sysfs's ``index*`` folders); [] where any is unreadable (valgrind then detects them,
    which under a hypervisor can be wrong: one machine here read a 256 MB direct-mapped LL)."""
    found: dict[tuple[int, str], str] = {}
    try:
        for index in sorted(caches.glob("index*")):
            read = lambda name: (index / name).read_text().strip()  # noqa: E731
            geometry = f"{_size(read('size'))},{int(read('ways_of_associativity'))},{int(read('coherency_line_size'))}"
            found[(int(read("level")), read("type"))] = geometry
    except (OSError, ValueError):
        return []
    last = max((level for level, kind in found if kind == "Unified"), default=None)
    if (1, "Instruction") not in found or (1, "Data") not in found or last is None:
        return []
    return [f"--I1={found[(1, 'Instruction')]}", f"--D1={found[(1, 'Data')]}", f"--LL={found[(last, 'Unified')]}"]


def command(out_dir: Path) -> list[str]:
    """The valgrind prefix for the counted process: nothing instrumented or collected until the process
    asks (:class:`Counter`), one output file per dump in ``out_dir``."""
    return ["valgrind", "--tool=callgrind", "--cache-sim=yes", *cache_options(),
            "--instr-atstart=no", "--collect-atstart=no", f"--callgrind-out-file={Path(out_dir) / 'callgrind.%p.out'}"]


class Counter:
    """Inside the counted process: ``begin()`` before a run, ``toggle()`` on entering and on leaving
    each counted call, ``end(name)`` after the run (its counts dumped under ``name``). RuntimeError
    where the process is not running under valgrind (nothing would be counted)."""

    def __init__(self, lib: str | os.PathLike[str]) -> None:
        self._lib = ctypes.CDLL(os.fspath(lib))
        if not self._lib.cg_running_on_valgrind():
            raise RuntimeError("callgrind_count.Counter: this process is not running under valgrind")
        self.toggle = self._lib.cg_toggle_collect

    def begin(self) -> None:
        self._lib.cg_zero_stats()
        self._lib.cg_start_instrumentation()

    def end(self, name: str) -> None:
        self._lib.cg_stop_instrumentation()
        self._lib.cg_dump_stats_at(name.encode())


def read_dumps(out_dir: Path) -> dict[str, dict[str, int]]:
    """Each named dump's totals in ``out_dir``: ``{name: {event: count}}`` (the dumps ``Counter.end``
    asked for; the one at the program's end is skipped). ValueError naming the file where a dump has
    no events or totals line, or a name twice."""
    counts: dict[str, dict[str, int]] = {}
    for path in sorted(Path(out_dir).glob("callgrind.*.out*")):
        name = events = totals = None
        for line in path.read_text(errors="replace").splitlines():
            if line.startswith("desc: Trigger: Client Request: "):
                name = line.removeprefix("desc: Trigger: Client Request: ").strip()
            elif line.startswith("events:"):
                events = line.split()[1:]
            elif line.startswith("totals:"):
                totals = [int(x) for x in line.split()[1:]]
        if name is None:
            continue
        if events is None or totals is None:
            raise ValueError(f"{path}: callgrind dump {name!r} has no 'events:' or 'totals:' line")
        if name in counts:
            raise ValueError(f"{path}: callgrind dump {name!r} appears twice in {out_dir}")
        counts[name] = dict(zip(events, totals + [0] * (len(events) - len(totals))))
    return counts


def l1_misses(counts: dict[str, int]) -> int:
    """First-level misses of one dump (instruction reads, data reads, data writes); a missing event counts 0."""
    return sum(counts.get(e, 0) for e in ("I1mr", "D1mr", "D1mw"))


def ll_misses(counts: dict[str, int]) -> int:
    """Last-level misses of one dump, as :func:`l1_misses`."""
    return sum(counts.get(e, 0) for e in ("ILmr", "DLmr", "DLmw"))


def cycles_est(counts: dict[str, int]) -> int:
    """The cycle estimation of one dump: ``Ir + 10·(I1mr + D1mr + D1mw) + 100·(ILmr + DLmr + DLmw)``;
    an event the dump lacks counts 0."""
    return counts.get("Ir", 0) + 10 * l1_misses(counts) + 100 * ll_misses(counts)
