"""Build script for the compiled pieces; everything else is in ``pyproject.toml``.

* ``_blockcore.c``: the block pool's eviction core. ``-ffp-contract=off``: no fused multiply-adds,
  so scores round as the Python index's do.
* ``_ids.c``: token ids as int32 bytes, for the adaptive shadow's replay (4x ``struct.pack``).

Both are optional: without a C compiler or Python's headers the install succeeds, and
``marconi.integrations.vllm.blockcore`` and ``marconi.integrations.common.prefix_delta`` fall back to
their pure-Python twins, which give the same results (``tests/test_vllm_block_core.py``,
``tests/test_int32_bytes.py``).
"""

from setuptools import Extension, setup

setup(ext_modules=[
    Extension(
        "marconi.integrations.vllm._blockcore",
        sources=["src/marconi/integrations/vllm/_blockcore.c"],
        extra_compile_args=["-O2", "-ffp-contract=off", "-fno-strict-aliasing", "-Wall"],
        optional=True,
    ),
    Extension(
        "marconi.integrations.common._ids",
        sources=["src/marconi/integrations/common/_ids.c"],
        extra_compile_args=["-O2", "-Wall"],
        optional=True,
    ),
])
