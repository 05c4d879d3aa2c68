import os
from pathlib import Path

import pytest
from hypothesis import settings

from marconi.workloads.paths import shared_data_dir

# The property tests draw the same examples on every run unless asked otherwise: a rare draw that
# fails must not turn an unrelated change's CI red (a subnormal weight once did), and a failure seen
# once reproduces. `MARCONI_HYPOTHESIS_PROFILE=explore` draws fresh examples (a developer hunting for
# new counterexamples); a failure it finds belongs in an @example of its test.
settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
settings.register_profile("explore", derandomize=False, print_blob=True)
_PROFILE = os.environ.get("MARCONI_HYPOTHESIS_PROFILE", "ci")
if _PROFILE not in ("ci", "explore"):
    raise pytest.UsageError(f"MARCONI_HYPOTHESIS_PROFILE={_PROFILE!r}: choose ci (the default) or explore")
settings.load_profile(_PROFILE)


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
