"""autoflash: generated, tuned and dispatched FlashAttention kernels in Triton."""

from autoflash._version import __version__
from autoflash.api import attention, explain

__all__ = ["attention", "explain", "__version__"]
