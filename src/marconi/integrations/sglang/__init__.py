"""Marconi inside SGLang (0.5.23): the ``--radix-eviction-policy marconi`` plugin and its CPU bench.

* :mod:`~marconi.integrations.sglang.policy` — Marconi's utility over SGLang's radix-tree nodes
  (no SGLang import: the core's ``flop_efficiency`` on the served model's ``ModelSpec``);
* :mod:`~marconi.integrations.sglang.plugin` — the ``sglang.srt.plugins`` entry point ``marconi``;
* :mod:`~marconi.integrations.sglang.replay` / :mod:`~marconi.integrations.sglang.bench` — a trace
  replayed through SGLang's own ``UnifiedRadixCache`` on CPU (inside ``.venv-sglang``);
* :mod:`~marconi.integrations.sglang.emulate` / :mod:`~marconi.integrations.sglang.system` — ``sglang-unified``,
  the same cache emulated without SGLang, as a simulator system (it matches the bench request by request);
* :mod:`~marconi.integrations.sglang.commands` — ``marconi sglang bench``.

See docs/sglang.md. Importing this package imports nothing from SGLang.
"""
