"""Without a GPU, kernels run in Triton's interpreter on CPU tensors (TRITON_INTERPRET=1)."""

import os
import tempfile

import pytest
import torch

HAS_GPU = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") in ("", "0")
if not HAS_GPU:
    os.environ["TRITON_INTERPRET"] = "1"
# Rendered kernels of this test session go to a fresh folder, never the user's cache.
os.environ.setdefault("AUTOFLASH_CACHE_DIR", tempfile.mkdtemp(prefix="autoflash-test-kernels-"))

DEVICE = "cuda" if HAS_GPU else "cpu"


def pytest_collection_modifyitems(config, items):
    for item in items:  # `-m reliability` runs tests/reliability/ alone
        if item.path.parent.name == "reliability":
            item.add_marker(pytest.mark.reliability)
    if HAS_GPU:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _release_gpu_cache(request):
    """After a GPU test, the caching allocator's free blocks go back to the GPU: 16 xdist workers each keeping
    ~5 GB cached after their largest test ran an 80 GB H100 out of memory (NOTES G-bwd11)."""
    yield
    if HAS_GPU and "gpu" in request.keywords:
        torch.cuda.empty_cache()
