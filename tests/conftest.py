import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("MARCONI_SHARED_DATA", ROOT.parent / "shared" / "data"))


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The larger real datasets in ../shared/data; tests using it skip where it is absent."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"../shared/data not found at {SHARED_DATA} (set MARCONI_SHARED_DATA); CI always has it")
    return SHARED_DATA


@pytest.fixture(scope="module")
def one_torch_thread():
    """One intra-op thread for the engine tests: tiny tensors gain nothing from two, and OpenMP
    spin-waits badly when the machine's other core is busy (a 10x slowdown was seen)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
