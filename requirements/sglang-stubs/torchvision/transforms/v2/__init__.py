"""Stand-in for `torchvision.transforms.v2` (requirements/sglang-stubs/README.md): names import, any use raises RuntimeError."""

from torchvision._unavailable import STUB as __marconi_stub__, module_getattr

__getattr__ = module_getattr("torchvision.transforms.v2")
