"""autoflash: generated, tuned and dispatched FlashAttention kernels in Triton."""

from autoflash._version import __version__
from autoflash.api import attention, explain
from autoflash.kvcache import attention_with_kvcache
from autoflash.mask_mod import MaskMod
from autoflash.score_mod import ScoreMod
from autoflash.integrations import torch_ops  # noqa: F401  (registers the custom ops torch.compile traces)
from autoflash.integrations.sdpa import install as install_sdpa, uninstall as uninstall_sdpa
from autoflash.tune.on_miss import configure
from autoflash.varlen import attention_varlen

__all__ = ["MaskMod", "ScoreMod", "attention", "attention_varlen", "attention_with_kvcache", "configure", "explain", "install_sdpa",
           "uninstall_sdpa", "__version__"]
