"""Name-based registries of pluggable pieces, with parameters given on the name.

Policies and systems are looked up by name, optionally followed by parameters:
``"every-block:block=16"``, ``"marconi:alpha=1.0,multiplier=15"``. Each registered factory declares its
parameters with types and defaults, so a typo is an error that lists the valid ones instead of a
silent default (libCacheSim-style CLI sweeps depend on that).
"""

from __future__ import annotations

import importlib
import inspect
import math
from dataclasses import dataclass
from typing import Any, Callable, Generic, TypeVar

__all__ = ["Registry", "ParsedName", "parse_name", "split_name_list", "ConfigError"]

T = TypeVar("T")


class ConfigError(ValueError):
    """An impossible or misspelt configuration; the message says what to change."""


@dataclass(frozen=True, slots=True)
class ParsedName:
    name: str
    params: dict[str, str]

    def __str__(self) -> str:
        if not self.params:
            return self.name
        return self.name + ":" + ",".join(f"{k}={v}" for k, v in self.params.items())


def parse_name(text: str) -> ParsedName:
    """Split ``"name:k=v,k2=v2"`` into the name and a dict of raw string values."""
    text = text.strip()
    if not text:
        raise ConfigError("empty name")
    name, _, rest = text.partition(":")
    params: dict[str, str] = {}
    for item in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise ConfigError(f"{text!r}: parameter {item!r} is not of the form key=value")
        if key.strip() in params:
            raise ConfigError(f"{text!r}: parameter {key.strip()!r} is given twice; give it once")
        params[key.strip()] = value.strip()
    return ParsedName(name.strip(), params)


def split_name_list(text: str) -> list[str]:
    """Split a comma list of names whose items may carry comma-separated parameters.

    ``"vanilla,marconi:alpha=1,multiplier=15,vllm+"`` -> ``["vanilla", "marconi:alpha=1,multiplier=15",
    "vllm+"]``: an item that starts as ``key=`` (its first ``=`` before any ``:``) continues the
    previous item's parameters, so a value may hold a colon (``alpha_source=module:factory``);
    a new item names itself before its parameters (``name:key=value``).
    """
    items: list[str] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        eq, colon = part.find("="), part.find(":")
        continues = eq >= 0 and (colon < 0 or eq < colon)
        if continues and items and ":" in items[-1]:
            items[-1] += "," + part
        else:
            items.append(part)
    return items


def _convert(raw: str, annotation: Any, default: Any, where: str) -> Any:
    kind = annotation if isinstance(annotation, type) else type(default) if default is not None else str
    if isinstance(annotation, str):  # postponed annotations: "float", "int | None", ...
        kind = {"int": int, "float": float, "bool": bool, "str": str}.get(annotation.split("|")[0].strip(), str)
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
    """Factories by name; ``create("name:k=v")`` validates and converts the parameters.

    ``providers``: modules that register entries here and are imported the first time the registry
    is read (listed, described or asked for a name). Pieces defined beside the core — the sparse
    policies, the vLLM emulation — register themselves when ``marconi.sim.systems`` (where systems are
    assembled) or their own module is imported; naming them as providers lets a registry be complete
    without importing them itself, so no module imports in a circle.
    """

    def __init__(self, kind: str, providers: tuple[str, ...] = ()) -> None:
        self.kind = kind
        self.providers = providers
        self._factories: dict[str, Callable[..., T]] = {}
        self._docs: dict[str, str] = {}
        self._loaded = not providers

    def _load_providers(self) -> None:
        if not self._loaded:
            self._loaded = True  # first: a provider's own lookups must not import it again
            for module in self.providers:
                importlib.import_module(module)

    def register(self, name: str, doc: str = "") -> Callable[[Callable[..., T]], Callable[..., T]]:
        def decorator(factory: Callable[..., T]) -> Callable[..., T]:
            if name in self._factories:
                raise ValueError(f"{self.kind} {name!r} registered twice")
            self._factories[name] = factory
            self._docs[name] = doc or (inspect.getdoc(factory) or "").split("\n")[0]
            return factory
        return decorator

    def names(self) -> list[str]:
        self._load_providers()
        return list(self._factories)

    def describe(self) -> dict[str, str]:
        self._load_providers()
        return dict(self._docs)

    def params_of(self, name: str) -> dict[str, Any]:
        self._load_providers()
        sig = inspect.signature(self._factories[name])
        return {p.name: p.default for p in sig.parameters.values()
                if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}

    def create(self, spec: str | ParsedName, **overrides: Any) -> T:
        parsed = spec if isinstance(spec, ParsedName) else parse_name(spec)
        self._load_providers()
        factory = self._factories.get(parsed.name)
        if factory is None:
            raise ConfigError(f"unknown {self.kind} {parsed.name!r}; choose one of: {', '.join(self._factories)}")
        sig = inspect.signature(factory)
        valid = {p.name: p for p in sig.parameters.values() if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}
        kwargs: dict[str, Any] = {}
        for key, raw in parsed.params.items():
            if key not in valid:
                listing = ", ".join(valid) or "none"
                raise ConfigError(f"{self.kind} {parsed.name!r} has no parameter {key!r}; valid parameters: {listing}")
            param = valid[key]
            kwargs[key] = _convert(raw, param.annotation, param.default, f"{parsed}: {key}")
        for key, value in overrides.items():
            if key in valid:
                kwargs.setdefault(key, value)
        return factory(**kwargs)
