"""The GPU suite's xdist workers over a host's GPUs (conftest.one_gpu_per_worker)."""

import pytest

from conftest import one_gpu_per_worker


@pytest.mark.parametrize("environ, visible", [
    ({"AUTOFLASH_TEST_GPUS": "4", "PYTEST_XDIST_WORKER": "gw5"}, "1"),
    ({"AUTOFLASH_TEST_GPUS": "4", "PYTEST_XDIST_WORKER": "gw0"}, "0"),
    ({"AUTOFLASH_TEST_GPUS": "4", "PYTEST_XDIST_WORKER": "gw14", "CUDA_VISIBLE_DEVICES": "4,5,6,7"}, "6"),
    ({"AUTOFLASH_TEST_GPUS": "2", "PYTEST_XDIST_WORKER": "gw3", "CUDA_VISIBLE_DEVICES": ""}, "1"),
    ({"AUTOFLASH_TEST_GPUS": "1", "PYTEST_XDIST_WORKER": "gw3"}, None),  # one GPU: every worker shares it
    ({"AUTOFLASH_TEST_GPUS": "4"}, None),  # not an xdist worker (the controller, or no -n)
    ({"PYTEST_XDIST_WORKER": "gw3", "CUDA_VISIBLE_DEVICES": "2,3"}, "2,3"),  # not asked: as the user set it
])
def test_each_worker_sees_one_gpu(environ, visible):
    environ = dict(environ)
    one_gpu_per_worker(environ)
    assert environ.get("CUDA_VISIBLE_DEVICES") == visible
