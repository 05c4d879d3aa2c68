"""The replay's models: the bundled ``config.json`` directories, and the block vLLM picks for each.

Both are read by the host before any vLLM process starts (:mod:`~marconi.integrations.vllm.replay.run`,
:mod:`~marconi.integrations.vllm.replay.tiers`, ``marconi vllm diagnose``). Imports nothing from vLLM.
"""

from __future__ import annotations

from pathlib import Path

from marconi.core.registry import ConfigError

__all__ = ["CONFIGS_DIR", "model_dir", "VLLM_BLOCK_SIZES"]

CONFIGS_DIR = Path(__file__).resolve().parents[3] / "data" / "configs"

#: vLLM 0.32's block (tokens) for the bundled configs, as the replay's worker reports it (a record's
#: ``block_size``): the attention block inflated to the Mamba page. vLLM chooses it only once it has
#: built the model, in the worker; this is what the host knows of it before then, so that a tier under
#: one chunk is refused before any arm runs (:func:`~marconi.integrations.vllm.replay.tiers.check_tier_size`).
#: A model directory is not here: its tier is checked against vLLM's own block after the run.
VLLM_BLOCK_SIZES: dict[str, int] = {"nemotron-h-8b": 1152, "qwen3-next-80b-a3b": 1152, "falcon-h1-7b": 3200}


def model_dir(model: str) -> Path:
    """A bundled config's directory (``nemotron-h-8b``) or a directory holding a ``config.json``;
    ConfigError naming the bundled ones otherwise."""
    for path in (CONFIGS_DIR / model, Path(model)):
        if (path / "config.json").is_file():
            return path
    bundled = sorted(p.name for p in CONFIGS_DIR.iterdir() if (p / "config.json").is_file())
    raise ConfigError(f"model {model!r}: not a bundled config ({', '.join(bundled)}) nor a directory with config.json")
