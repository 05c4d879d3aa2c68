from pathlib import Path

import pytest

from marconi.workloads.paths import shared_data_dir


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The larger real data sets, found exactly as the package finds them (``shared_data_dir``:
    ``$MARCONI_SHARED_DATA``, else ``../shared/data`` beside the repository); tests using it skip
    where it is absent."""
    path = shared_data_dir()
    if path is None:
        pytest.skip("the shared data set was not found ($MARCONI_SHARED_DATA, or ../shared/data beside the "
                    "repository); CI always has it")
    return path


@pytest.fixture(scope="module")
def one_torch_thread():
    """One intra-op thread for the engine tests: tiny tensors gain nothing from two, and OpenMP
    spin-waits badly when the machine's other core is busy (a 10x slowdown was seen)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
