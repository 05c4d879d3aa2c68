"""Command-line options declared once: numeric ``type=`` objects hold their
:class:`~marconi.core.registry.Domain` (exit 2 naming the option), and :func:`add_output` marks every
written path for ``marconi.cli``'s guard (``tests/test_cli_guards.py`` enforces both)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Sequence

from marconi.core.registry import ConfigError, Domain

__all__ = ["Number", "NumberList", "NameList", "CapacityList", "add_output", "add_reread", "output_kind", "is_reread",
           "chosen_actions", "values_of", "OUTPUT_KINDS", "COUNT", "TOKENS", "SEED", "CHECKPOINT_BUDGET",
           "MAX_CHECKPOINT_BUDGET", "MAX_TOKENS", "MAX_BLOCKS", "MAX_COUNT"]

# Bounds a typo cannot reach but no real run needs to: 16M tokens is past every model's context;
# 1G blocks is past every GPU's pool (an H200 at 16-token blocks of a 7B model holds ~2M);
# 1G requests is past every trace we read.
MAX_TOKENS = 1 << 24
MAX_BLOCKS = 1 << 30
MAX_COUNT = 10**9
# States placed per sequence by the sparse DP (sparse-dp's m, vllm-align's budget,
# --retention-budget, frontier's --budgets, MARCONI_VLLM_RETENTION_BUDGET): each is a full SSM
# state (megabytes), so 1,024 per sequence is already gigabytes of one request's states, and the
# DP's time grows with the budget (issue 31, bug 4: 10^9 ran out of memory, 10^5 took minutes).
MAX_CHECKPOINT_BUDGET = 1024

COUNT = Domain(1, MAX_COUNT, integer=True)
TOKENS = Domain(1, MAX_TOKENS, integer=True)
SEED = Domain(0, 2**32 - 1, integer=True)
CHECKPOINT_BUDGET = Domain(0, MAX_CHECKPOINT_BUDGET, integer=True,
                           hint=f"states per sequence; more than {MAX_CHECKPOINT_BUDGET:,} is never useful")


class Number:
    """argparse ``type=`` for one number in ``domain`` (ArgumentTypeError otherwise); a domain word comes
    back lower-cased; ``text``: return the checked text."""

    def __init__(self, domain: Domain, *, text: bool = False) -> None:
        self.domain, self.text = domain, text
        self.__name__ = "integer" if domain.integer else "number"   # argparse's name for the type

    def __call__(self, text: str) -> Any:
        try:
            value = self.domain.parse(text)
        except ConfigError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        return str(text).strip() if self.text else value

    def __repr__(self) -> str:
        return f"Number({self.domain.describe()})"


class NumberList:
    """argparse ``type=`` for a comma list of numbers in ``domain``; ``unique`` refuses repeats."""

    def __init__(self, domain: Domain, *, unique: bool = True) -> None:
        self.domain, self.unique = domain, unique
        self.__name__ = "list"

    def __call__(self, text: str) -> list[Any]:
        items = [s.strip() for s in str(text).split(",")]
        if not any(items) or not all(items):
            raise argparse.ArgumentTypeError(f"expected a comma list of {self.domain.describe()} (e.g. 1,2,4), "
                                             f"got {text!r}")
        values = []
        for item in items:
            try:
                values.append(self.domain.parse(item))
            except ConfigError as exc:
                raise argparse.ArgumentTypeError(f"{item!r}: {exc}" if len(items) > 1 else str(exc)) from None
        if self.unique and len(set(values)) < len(values):
            twice = sorted({str(v) for v in values if values.count(v) > 1})
            raise argparse.ArgumentTypeError(f"{', '.join(twice)} given twice: give each value once")
        return values

    def __repr__(self) -> str:
        return f"NumberList({self.domain.describe()})"


class NameList:
    """argparse ``type=`` for a comma list of names; returns the text, with no empty or repeated item."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.__name__ = f"{what} list"

    def __call__(self, text: str) -> str:
        from marconi.core.registry import split_name_list, split_top_level

        try:
            items = split_name_list(str(text))
        except ConfigError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        if not items:
            raise argparse.ArgumentTypeError(f"give at least one {self.what} (a comma list), got {text!r}")
        if any(not item.strip() for item in split_top_level(str(text))):
            raise argparse.ArgumentTypeError(f"{text!r} has an empty item: write names separated by single commas")
        twice = sorted({i for i in items if items.count(i) > 1})
        if twice:
            raise argparse.ArgumentTypeError(f"{', '.join(twice)} given twice (it would run twice under one "
                                             f"label): give each {self.what} once")
        return str(text)


class CapacityList:
    """argparse ``type=`` for a comma list of capacities (:func:`marconi.units.parse_capacity`); returns
    the text. ``allow_zero``: whether ``0`` bytes is allowed; ``single``: one capacity only (a
    command that runs one pool)."""

    def __init__(self, *, allow_zero: bool = True, single: bool = False) -> None:
        self.allow_zero, self.single = allow_zero, single
        self.__name__ = "capacity"

    def __call__(self, text: str) -> str:
        from marconi.units import parse_capacity

        items = [s.strip() for s in str(text).split(",")]
        if self.single and len(items) > 1:
            raise argparse.ArgumentTypeError(f"one capacity, got {len(items)} ({text!r}): this command replays one "
                                             "pool; run it once per capacity")
        if not all(items):
            raise argparse.ArgumentTypeError(f"expected a comma list of sizes (10GB) or fractions of the working "
                                             f"set (0.05x), got {text!r}")
        seen: dict[tuple[Any, Any], str] = {}
        for item in items:
            try:
                capacity = parse_capacity(item)
            except ConfigError as exc:
                raise argparse.ArgumentTypeError(str(exc)) from None
            if not self.allow_zero and capacity.absolute == 0:
                raise argparse.ArgumentTypeError(f"{item!r} is 0 bytes: give a size > 0 (10GB) or a fraction of "
                                                 "the working set (0.05x)")
            key = (capacity.absolute, capacity.fraction)
            if key in seen:              # 80GB and "80 GB" too: the points would run twice under one label
                same = f"{item!r}" if seen[key] == item else f"{seen[key]!r} and {item!r}"
                raise argparse.ArgumentTypeError(f"{same} given twice (the same size): give each capacity once")
            seen[key] = item
        return str(text)


OUTPUT_KINDS = ("file", "dir", "workdir")
#: The ``suffixes`` of a plot output: plots are written as PNG whatever their name says
#: (:func:`marconi.report.save_figure`).
PLOT_SUFFIXES = (".png",)
_OUTPUT_ATTR = "marconi_output"
_REREAD_ATTR = "marconi_reread"
_BESIDE_ATTR = "marconi_beside"
_SUFFIXES_ATTR = "marconi_suffixes"


def _dash_is_stdout(value: str) -> str:
    """An output file named ``-`` is standard output, as for most command-line tools (it was written as a
    file named ``-`` in the current directory)."""
    return "/dev/stdout" if value == "-" else value


def add_output(parser: argparse.ArgumentParser, *flags: str, kind: str = "file",
               beside: tuple[str, str] | None = None, suffixes: tuple[str, ...] = (), **kwargs: Any) -> argparse.Action:
    """``parser.add_argument`` for a written path, marked for the guard. ``kind``: ``file``, ``dir``
    (replaced whole) or ``workdir`` (scratch); an empty value means "skip"; a file named ``-`` is
    standard output. ``beside=(dest, suffix)``: when the option is not given, :func:`fill_beside`
    names it after the output ``dest`` with ``suffix`` (``--plot`` beside ``--out R.jsonl`` is
    ``R.png``), so a run's files stay together."""
    if kind not in OUTPUT_KINDS:
        raise ValueError(f"add_output: kind must be one of {OUTPUT_KINDS}, got {kind!r}")
    if beside is not None:
        kwargs.setdefault("default", None)
    if kind == "file":
        kwargs.setdefault("type", _dash_is_stdout)
    action = parser.add_argument(*flags, **kwargs)
    setattr(action, _OUTPUT_ATTR, kind)
    setattr(action, _SUFFIXES_ATTR, tuple(suffixes))
    if beside is not None:
        setattr(action, _BESIDE_ATTR, beside)
    return action


def fill_beside(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Give each chosen ``add_output(..., beside=(dest, suffix))`` option left unset its path: the
    output ``dest`` with ``suffix`` in place of its own (empty, i.e. skipped, when that output is
    skipped or is a stream such as ``/dev/stdout``). Changes ``args`` only; run before the guard,
    which then checks the named paths like any other output."""
    from marconi.io import is_stream

    for action in chosen_actions(parser, args):
        beside = getattr(action, _BESIDE_ATTR, None)
        if beside is None or getattr(args, action.dest, None) is not None:
            continue
        dest, suffix = beside
        other = getattr(args, dest, None)
        named = bool(other) and other != "-" and not is_stream(other)
        setattr(args, action.dest, str(Path(other).with_suffix(suffix)) if named else "")


def add_reread(parser: argparse.ArgumentParser, *flags: str, **kwargs: Any) -> argparse.Action:
    """An input read whole before anything is written (``--from-records``), so it may lie inside the
    command's output directory."""
    action = parser.add_argument(*flags, **kwargs)
    setattr(action, _REREAD_ATTR, True)
    return action


def output_kind(action: argparse.Action) -> str | None:
    """The :func:`add_output` kind of ``action``, or None for an option that is not an output."""
    return getattr(action, _OUTPUT_ATTR, None)


def output_suffixes(action: argparse.Action) -> tuple[str, ...]:
    """The :func:`add_output` ``suffixes`` of ``action``: the only formats it is written in (empty: any)."""
    return getattr(action, _SUFFIXES_ATTR, ())


def is_reread(action: argparse.Action) -> bool:
    return bool(getattr(action, _REREAD_ATTR, False))


def chosen_actions(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[argparse.Action]:
    """The actions of ``parser`` and of every sub-command ``args`` chose (the path to the leaf)."""
    actions: list[argparse.Action] = []
    current: argparse.ArgumentParser | None = parser
    while current is not None:
        nxt = None
        for action in current._actions:
            if isinstance(action, argparse._SubParsersAction):
                chosen = getattr(args, action.dest, None)
                nxt = action.choices.get(chosen) if chosen is not None else None
            else:
                actions.append(action)
        current = nxt
    return actions


def values_of(value: Any) -> Sequence[str]:
    """The strings an option's parsed value holds (a str, or a list of them)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, (list, tuple)):
        return [v for v in value if isinstance(v, str)]
    return []
