"""Name-based registries of pluggable pieces, with parameters given on the name.

``"marconi:alpha=1.0,multiplier=15"``: each factory declares its parameters' types, defaults and
numeric :class:`Domain`, so a typo or an out-of-range value is a ConfigError listing the valid ones,
never a silent default. A nested policy's parameters ride in parentheses. Syntax:
``docs/simulator.md``.
"""

from __future__ import annotations

import difflib
import inspect
import math
from dataclasses import dataclass
from typing import Any, Callable, Generic, Sequence, TypeVar

__all__ = ["Registry", "ParsedName", "Domain", "parse_name", "split_name_list", "split_top_level", "ConfigError",
           "brief_repr", "did_you_mean"]

T = TypeVar("T")


class ConfigError(ValueError):
    """An impossible or misspelt configuration; the message says what to change."""


def brief_repr(value: object, limit: int = 60) -> str:
    """``repr(value)`` for an error message, cut to ``limit`` characters (``...`` marks a cut)."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def did_you_mean(name: str, known: Sequence[str], *, quote: bool = False) -> str:
    """`` (did you mean X?)`` naming the one of ``known`` closest to ``name`` (difflib's ratio at least
    0.85; ``X`` as ``repr`` with ``quote``), or ``""`` where none is that close: for an error
    naming a misspelt key or variable."""
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.85)
    if not close:
        return ""
    return f" (did you mean {close[0]!r}?)" if quote else f" (did you mean {close[0]}?)"


def _fmt(value: float) -> str:
    return f"{int(value):,}" if float(value).is_integer() and abs(value) < 1e13 else f"{value:g}"


@dataclass(frozen=True, slots=True)
class Domain:
    """The values a numeric name parameter or command-line option accepts: bounds ``lo``/``hi``
    (None: none; exclusive when ``*_open``), whole numbers only (``integer``; ``"1e3"`` is 1000),
    multiples of ``multiple_of`` (0: any), and case-insensitive ``words``; never NaN or infinities.
    ``hint`` is added to every refusal."""

    lo: float | None = None
    hi: float | None = None
    integer: bool = False
    lo_open: bool = False
    hi_open: bool = False
    multiple_of: int = 0
    words: tuple[str, ...] = ()
    hint: str = ""

    def describe(self) -> str:
        """``"an integer >= 1 and <= 1,024, or none"``."""
        text = "an integer" if self.integer else "a finite number"
        bounds = []
        if self.lo is not None:
            bounds.append(f"{'>' if self.lo_open else '>='} {_fmt(self.lo)}")
        if self.hi is not None:
            bounds.append(f"{'<' if self.hi_open else '<='} {_fmt(self.hi)}")
        text += " " + " and ".join(bounds) if bounds else ""
        text += f", a multiple of {self.multiple_of}" if self.multiple_of else ""
        return text + "".join(f", or {w}" for w in self.words)

    def interval(self) -> str:
        """``"[0, 1,024] integer"``, ``"(0, 1]"``, ``"[0, 1,000,000] or auto"``: the domain in brief."""
        lo = "(" if self.lo_open or self.lo is None else "["
        hi = ")" if self.hi_open or self.hi is None else "]"
        text = (f"{lo}{'-inf' if self.lo is None else _fmt(self.lo)}, {'inf' if self.hi is None else _fmt(self.hi)}{hi}"
                + (" integer" if self.integer else "") + (f" multiple of {self.multiple_of}" if self.multiple_of else ""))
        return text + "".join(f" or {w}" for w in self.words)

    def admits(self, value: float) -> bool:
        """Whether the number ``value`` lies in the domain (words aside)."""
        if not math.isfinite(value) or (self.integer and not float(value).is_integer()):
            return False
        if self.multiple_of and value % self.multiple_of:
            return False
        if self.lo is not None and (value <= self.lo if self.lo_open else value < self.lo):
            return False
        return self.hi is None or (value < self.hi if self.hi_open else value <= self.hi)

    def parse(self, text: str | float) -> Any:
        """``text`` as an int (``integer``) or float in the domain, or one of ``words`` (lower-cased);
        else ConfigError ``must be <describe()>, got '<text>'`` and the hint (callers prefix the name)."""
        if isinstance(text, str) and text.strip().lower() in self.words:
            return text.strip().lower()
        try:
            value = float(text)
        except (TypeError, ValueError):
            value = math.nan
        if isinstance(text, bool) or not self.admits(value):
            raise ConfigError(f"must be {self.describe()}, got {str(text)!r}" + (f" ({self.hint})" if self.hint else ""))
        return int(value) if self.integer else value


def split_top_level(text: str, where: str = "") -> list[str]:
    """``text`` split on commas outside parentheses; ConfigError naming ``where`` (or the text) for
    unbalanced ones."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth < 0:
                break
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth != 0:
        raise ConfigError(f"{where or repr(text)}: unbalanced parentheses; a policy's parameters go in one pair, "
                          "separated by ';' or ',': admission=uniform(m=8;paged=false)")
    parts.append(text[start:])
    return parts


@dataclass(frozen=True, slots=True)
class ParsedName:
    name: str
    params: dict[str, str]

    def __str__(self) -> str:
        if not self.params:
            return self.name
        return self.name + ":" + ",".join(f"{k}={v}" for k, v in self.params.items())


def parse_name(text: str) -> ParsedName:
    """Split ``"name:k=v,k2=v2"`` into the name and a dict of raw string values (commas inside
    parentheses do not split). ConfigError for an empty name or value, an item that is not
    ``key=value``, a key given twice, or unbalanced parentheses."""
    text = text.strip()
    if not text:
        raise ConfigError("empty name")
    name, _, rest = text.partition(":")
    params: dict[str, str] = {}
    for item in filter(None, (p.strip() for p in split_top_level(rest, repr(text)))):
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise ConfigError(f"{text!r}: parameter {item!r} is not of the form key=value")
        if key.strip() in params:
            raise ConfigError(f"{text!r}: parameter {key.strip()!r} is given twice; give it once")
        if not value.strip():
            raise ConfigError(f"{text!r}: parameter {key.strip()!r} is empty: give it a value, or drop it for "
                              "its default")
        params[key.strip()] = value.strip()
    return ParsedName(name.strip(), params)


def split_name_list(text: str) -> list[str]:
    """Split a comma list of names whose items may carry comma-separated parameters: an item that
    starts as ``key=`` (first ``=`` before any ``:``) continues the previous item's parameters;
    commas inside parentheses do not split."""
    items: list[str] = []
    for part in filter(None, (p.strip() for p in split_top_level(text))):
        eq, colon = part.find("="), part.find(":")
        continues = eq >= 0 and (colon < 0 or eq < colon)
        if continues and items and ":" in items[-1]:
            items[-1] += "," + part
        else:
            items.append(part)
    return items


def _kind(annotation: Any, default: Any) -> type:
    """The scalar type a parameter's raw text converts to (int, float, bool or str)."""
    kind = annotation if isinstance(annotation, type) else type(default) if default is not None else str
    if isinstance(annotation, str):  # postponed annotations: "float", "int | None", ...
        kind = {"int": int, "float": float, "bool": bool, "str": str}.get(annotation.split("|")[0].strip(), str)
    return kind


def _convert(raw: str, annotation: Any, default: Any, where: str, domain: Domain | None = None) -> Any:
    kind = _kind(annotation, default)
    if domain is not None:  # declared: its check, its message; a str parameter gets the text itself
        try:
            value = domain.parse(raw)
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None
        return raw if kind is str else value
    try:
        if kind is bool:
            lowered = raw.lower()
            if lowered not in {"1", "0", "true", "false", "yes", "no", "on", "off"}:
                raise ValueError(raw)
            return lowered in {"1", "true", "yes", "on"}
        if kind is int:
            value = float(raw)  # accepts "32" and "1e3"; rejects "1.5"
            if not math.isfinite(value) or not value.is_integer():
                raise ValueError(raw)
            return int(value)
        if kind is float:
            value = float(raw)
            if not math.isfinite(value):  # nan/inf are accepted by float() and break every policy later
                raise ValueError(raw)
            return value
    except ValueError:
        what = "finite number" if kind is float else kind.__name__
        raise ConfigError(f"{where}: {raw!r} is not a valid {what}") from None
    return raw


class Registry(Generic[T]):
    """Factories by name; ``create("name:k=v")`` validates and converts the parameters. The modules
    of the ``entry_points`` group are imported on the first read; ConfigError on a read when one
    fails (every later read tries again: never silently incomplete)."""

    def __init__(self, kind: str, entry_points: str = "") -> None:
        self.kind = kind
        self.entry_points = entry_points
        self._factories: dict[str, Callable[..., T]] = {}
        self._docs: dict[str, str] = {}
        self._domains: dict[str, dict[str, Domain]] = {}
        self._loaded = not entry_points
        self._plugins_found = 0

    def _load_plugins(self) -> None:
        if self._loaded:
            return
        import importlib.metadata  # here: reading installed metadata costs tens of ms, paid only when needed

        self._loaded = True  # first: a plugin's own lookups while it is imported must not import it again
        found = importlib.metadata.entry_points(group=self.entry_points)
        self._plugins_found = len(found)
        for name, module in sorted({(e.name, e.value) for e in found}):  # a set: a package seen twice on the path
            try:
                importlib.import_module(module)
            except Exception as exc:
                self._loaded = False
                raise ConfigError(f"{self.kind} plugin {name!r} (module {module!r}, entry point group "
                                  f"{self.entry_points!r}) failed to import: {type(exc).__name__}: {exc}") from exc

    def register(self, name: str, doc: str = "", domains: dict[str, Domain] | None = None
                 ) -> Callable[[Callable[..., T]], Callable[..., T]]:
        """Register a factory under ``name``. ``domains``: the :class:`Domain` of each numeric
        parameter (a str parameter that carries a number, such as ``alpha="auto"``, declares one
        with ``words``); an int or float parameter without one accepts any finite value of its type."""
        def decorator(factory: Callable[..., T]) -> Callable[..., T]:
            if name in self._factories:
                raise ValueError(f"{self.kind} {name!r} registered twice")
            params = inspect.signature(factory).parameters
            unknown = set(domains or ()) - set(params)
            if unknown:
                raise ValueError(f"{self.kind} {name!r}: domains for no parameter: {', '.join(sorted(unknown))}")
            self._domains[name] = dict(domains or {})
            self._factories[name] = factory
            self._docs[name] = doc or (inspect.getdoc(factory) or "").split("\n")[0]
            return factory
        return decorator

    def names(self) -> list[str]:
        self._load_plugins()
        return list(self._factories)

    def describe(self) -> dict[str, str]:
        self._load_plugins()
        return dict(self._docs)

    def params_of(self, name: str) -> dict[str, Any]:
        self._load_plugins()
        sig = inspect.signature(self._factories[name])
        return {p.name: p.default for p in sig.parameters.values()
                if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}

    def domains_of(self, name: str) -> dict[str, Domain]:
        """The declared :class:`Domain` of each of ``name``'s numeric parameters."""
        self._load_plugins()
        return dict(self._domains[name])

    def numeric_params_of(self, name: str) -> dict[str, type]:
        """``name``'s parameters whose values are numbers: int or float ones, and str ones with a domain."""
        self._load_plugins()
        domains = self._domains[name]
        out = {}
        for p in inspect.signature(self._factories[name]).parameters.values():
            kind = _kind(p.annotation, p.default)
            if kind in (int, float) or p.name in domains:
                out[p.name] = kind
        return out

    def create(self, spec: str | ParsedName, **overrides: Any) -> T:
        self._load_plugins()
        if isinstance(spec, str) and not spec.strip():
            raise ConfigError(f"empty {self.kind} name; choose one of: {', '.join(self._factories)}")
        parsed = spec if isinstance(spec, ParsedName) else parse_name(spec)
        factory = self._factories.get(parsed.name)
        if factory is None:
            hint = (f" (no {self.entry_points!r} entry point is installed, so no plugin registered here: install "
                    "the package, e.g. pip install -e .)" if self.entry_points and not self._plugins_found else "")
            raise ConfigError(f"unknown {self.kind} {parsed.name!r}; choose one of: {', '.join(self._factories)}"
                              + hint)
        sig = inspect.signature(factory)
        valid = {p.name: p for p in sig.parameters.values() if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}
        kwargs: dict[str, Any] = {}
        for key, raw in parsed.params.items():
            if key not in valid:
                listing = ", ".join(valid) or "none"
                raise ConfigError(f"{self.kind} {parsed.name!r} has no parameter {key!r}; valid parameters: {listing}")
            param = valid[key]
            kwargs[key] = _convert(raw, param.annotation, param.default, f"{parsed}: {key}",
                                   self._domains[parsed.name].get(key))
        for key, value in overrides.items():
            if key in valid:
                kwargs.setdefault(key, value)
        return factory(**kwargs)
