"""The vLLM commands' policy arms and retention words, shared by the replay and the real-server bench.

An arm is one engine (or server): ``lru`` (stock vLLM, plugin not loaded), ``marconi`` (the plugin,
the command's α) or ``marconi:alpha=X`` (X a number >= 0 or ``adaptive``).
"""

from __future__ import annotations

from marconi.core.registry import ConfigError, parse_name, split_name_list
from marconi.integrations.vllm.config import ADAPTIVE, parse_alpha
from marconi.integrations.vllm.policy import DEFAULT_ALPHA

__all__ = ["policy_arm", "parse_policies", "parse_retention"]


def policy_arm(text: str, default_alpha: float | str = DEFAULT_ALPHA) -> tuple[str, float | str | None]:
    """``"lru"`` -> ("lru", None); ``"marconi"`` -> ("marconi", ``default_alpha``);
    ``"marconi:alpha=adaptive"`` -> ("marconi", "adaptive"). ConfigError for anything else."""
    parsed = parse_name(text)
    if parsed.name == "lru" and not parsed.params:
        return "lru", None
    if parsed.name != "marconi" or set(parsed.params) - {"alpha"}:
        raise ConfigError(f"policy {text!r}: write lru, marconi or marconi:alpha=X (X a number or {ADAPTIVE})")
    return "marconi", parse_alpha(parsed.params.get("alpha", default_alpha), f"{text}: alpha")


def parse_policies(text: str) -> tuple[str, ...]:
    """``--policies``: a comma list (``lru,marconi:alpha=0.5,marconi:alpha=adaptive``); each item is
    checked by :func:`policy_arm` where it is used."""
    return tuple(split_name_list(text))


def parse_retention(text: str) -> int | None:
    """``--retention``: ``none`` (None: a state at every block) or a whole number of tokens;
    ConfigError naming ``--retention`` for anything else."""
    if text.strip().lower() == "none":
        return None
    try:
        return int(text)
    except ValueError:
        raise ConfigError(f"--retention {text!r}: write 0, none or a number of tokens (a multiple of the block)") from None
