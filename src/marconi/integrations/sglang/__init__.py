"""Marconi inside SGLang (0.5.23): the plugin (:mod:`~marconi.integrations.sglang.plugin`, its utility in
:mod:`~marconi.integrations.sglang.policy`), a trace through SGLang's own cache
(:mod:`~marconi.integrations.sglang.replay`) and the cache emulated without SGLang
(:mod:`~marconi.integrations.sglang.emulate`, the ``sglang-unified`` system). See docs/sglang.md.
Importing this package imports nothing from SGLang.
"""
