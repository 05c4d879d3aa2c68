"""Marconi inside SGLang (0.5.23): the ``--radix-eviction-policy marconi`` plugin, its CPU bench, its emulation.

:mod:`~marconi.integrations.sglang.policy` (Marconi's utility over SGLang's radix nodes),
:mod:`~marconi.integrations.sglang.plugin` (the entry point), :mod:`~marconi.integrations.sglang.replay`
/ :mod:`~marconi.integrations.sglang.bench` (SGLang's own cache on CPU, in ``.venv-sglang``),
:mod:`~marconi.integrations.sglang.emulate` / :mod:`~marconi.integrations.sglang.system`
(``sglang-unified``, without SGLang). See docs/sglang.md. Importing this package imports no SGLang.
"""
