"""autoflash: generated, tuned and dispatched FlashAttention kernels in Triton."""

__version__ = "0.1.0"

from autoflash.api import attention, explain  # noqa: E402

__all__ = ["attention", "explain", "__version__"]
