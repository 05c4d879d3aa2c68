"""Marconi inside serving engines: :mod:`~marconi.integrations.common` (what no engine owns: the
α-source contract, the shadow α source, server processes, the client, the paired-replay bench) and
one package per engine (:mod:`~marconi.integrations.vllm`, :mod:`~marconi.integrations.sglang`).

Dependencies point one way: an engine package builds on ``common``, ``common`` on the core, the
choosers and the workloads. Importing this package imports no engine.
"""
