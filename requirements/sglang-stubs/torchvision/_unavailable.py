"""The stand-in's placeholder: importable names that fail when used (see requirements/sglang-stubs/README.md)."""

from __future__ import annotations

import types

REASON = ("torchvision is not installed in this environment (a stand-in from requirements/sglang-stubs lets "
          "SGLang's modules import; no CPU torchvision for torch 2.13 exists)")


class Unavailable:
    """Any attribute of it is another placeholder; calling it raises RuntimeError."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> "Unavailable":
        if attr.startswith("__"):
            raise AttributeError(attr)
        return Unavailable(f"{self._name}.{attr}")

    def __call__(self, *args: object, **kwargs: object) -> None:
        raise RuntimeError(f"{self._name}: {REASON}")

    def __repr__(self) -> str:
        return f"<unavailable {self._name}>"


def module_getattr(module: str):
    def __getattr__(attr: str) -> Unavailable:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return Unavailable(f"{module}.{attr}")
    return __getattr__


STUB = types.SimpleNamespace(is_stub=True, reason=REASON)
