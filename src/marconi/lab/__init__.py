"""The lab: what studies the library, apart from it. The paper's reproduction (``marconi reproduce``),
the sparse study and headroom (``marconi experiment …``), the vLLM frontier (``marconi vllm
frontier``), the benches (``marconi engine bench``, ``marconi vllm bench``, ``marconi sglang bench``,
:mod:`~marconi.lab.vllm_overhead`) and the
per-group placement study (:mod:`~marconi.lab.sparse_groups`).

The lab imports the library; nothing in the library imports the lab. Its commands are wired by
:mod:`marconi.lab.commands`; the argparse checks several of them share are in :mod:`marconi.lab.option_types`.
"""
