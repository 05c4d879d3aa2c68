"""Build script for the one compiled piece: the block pool's eviction core (``_blockcore.c``).

Everything else is in ``pyproject.toml``. The extension is optional: without a C compiler or
Python's headers the install succeeds and ``marconi.integrations.vllm.blockcore`` falls back to
its pure-Python core, which makes the same choices (``tests/test_vllm_block_core.py``).
``-ffp-contract=off``: no fused multiply-adds, so scores round as the Python index's do.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension(
    "marconi.integrations.vllm._blockcore",
    sources=["src/marconi/integrations/vllm/_blockcore.c"],
    extra_compile_args=["-O2", "-ffp-contract=off", "-fno-strict-aliasing", "-Wall"],
    optional=True,
)])
