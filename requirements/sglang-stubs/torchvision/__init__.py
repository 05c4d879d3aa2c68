"""Stand-in for `torchvision` (requirements/sglang-stubs/README.md): names import, any use raises RuntimeError."""

from torchvision._unavailable import STUB as __marconi_stub__, module_getattr

__version__ = "0.0.0+unavailable"

__getattr__ = module_getattr("torchvision")
