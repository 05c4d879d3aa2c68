"""The ``marconi engine`` command group (``marconi engine info``); torch and transformers load when
it runs. The lab adds ``engine bench`` (:mod:`marconi.lab.engine_bench_command`)."""

from __future__ import annotations

import argparse
from typing import Any

from marconi.options import SEED, Number

__all__ = ["register"]


def register(subparsers: Any) -> Any:
    """Add the ``engine`` group to ``subparsers``; returns its own subparsers object (where the lab adds
    leaves)."""
    engine = subparsers.add_parser("engine", help="the real engine: transformers hybrids with the prefix cache")
    sub = engine.add_subparsers(dest="engine_command", required=True)

    info = sub.add_parser("info", help="load a model; show its cache layout and its checked ModelSpec")
    info.add_argument("--model", default="bamba-tiny", help="preset name or local checkpoint directory")
    info.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    info.add_argument("--seed", type=Number(SEED), default=0)
    info.set_defaults(func=_cmd_info)
    return sub


def _cmd_info(args: argparse.Namespace) -> int:
    from marconi.engine.models import EngineError, describe, is_model_source, load_model, unknown_model

    if not is_model_source(args.model):
        raise EngineError(f"--model: {unknown_model(args.model)}")
    model = load_model(args.model, dtype=args.dtype, seed=args.seed)
    for key, value in describe(model).items():
        print(f"{key:22s} {value}")
    print(f"{'attention layers':22s} {list(model.layout.attn_layers)}")
    print(f"{'recurrent layers':22s} {list(model.layout.ssm_layers)}")
    print("spec check             ok (KV bytes per token and checkpoint bytes equal the real cache tensors)")
    return 0
