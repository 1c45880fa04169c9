"""Without a GPU, kernels run in Triton's interpreter on CPU tensors (TRITON_INTERPRET=1)."""

import os
import tempfile

import pytest
import torch


def one_gpu_per_worker(environ=os.environ) -> None:
    """With AUTOFLASH_TEST_GPUS=N (N > 1; benchmarks/gpu_suite.sh sets it on a host of N GPUs), xdist worker gwK
    sees the (K mod N)-th visible GPU alone: the suite spreads over the host's GPUs. It must run before anything
    asks CUDA for its devices (CUDA reads CUDA_VISIBLE_DEVICES once)."""
    count, worker = int(environ.get("AUTOFLASH_TEST_GPUS", "1")), environ.get("PYTEST_XDIST_WORKER", "")
    if count > 1 and worker.startswith("gw"):
        visible = (environ.get("CUDA_VISIBLE_DEVICES") or ",".join(map(str, range(count)))).split(",")
        environ["CUDA_VISIBLE_DEVICES"] = visible[int(worker[2:]) % len(visible)]


one_gpu_per_worker()
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


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """This process's on-miss state and user database as a new process has them, the database in tmp_path (tests of
    tuning on first use)."""
    from autoflash.api import DISPATCHER
    from autoflash.db import urls
    from autoflash.gpu import INTERPRETER
    from autoflash.tune import on_miss

    monkeypatch.setattr(on_miss, "_settings", None)
    monkeypatch.setattr(on_miss, "_outcomes", {})
    monkeypatch.setattr(on_miss, "_warned", set())
    monkeypatch.setattr(urls, "_configured", None)
    monkeypatch.delenv(on_miss.TUNE_ENV, raising=False)
    monkeypatch.delenv(urls.DB_ENV, raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    yield tmp_path / "autoflash" / "tuning.db"
    for direction in ("fwd", "bwd"):  # what this test's databases held is no other test's
        DISPATCHER.forget(INTERPRETER.family, direction)
