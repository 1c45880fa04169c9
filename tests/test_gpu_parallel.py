"""benchmarks/gpu_parallel.sh on a host of four GPUs, faked: an `nvidia-smi` that lists them (NOTES 111)."""

import os
import subprocess
import tarfile
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_parallel.sh"
FAKE_SMI = """#!/bin/sh
[ "$1" = "-L" ] && for i in 0 1 2 3; do echo "GPU $i: Fake GPU (UUID: GPU-$i)"; done
exit 0
"""


@pytest.fixture
def four_gpus(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text(FAKE_SMI)
    (bin_dir / "nvidia-smi").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return tmp_path


def run(out, seconds, *jobs):
    return subprocess.run(["bash", str(SCRIPT), str(out), str(seconds), *jobs], capture_output=True, text=True,
                          timeout=60)


def logs(out) -> dict[str, str]:
    with tarfile.open(out / "parallel.tgz") as archive:
        return {Path(m.name).parent.name: archive.extractfile(m).read().decode()
                for m in archive.getmembers() if m.name.endswith("job.log")}


def test_each_job_sees_its_own_gpus_and_folder_and_a_slow_one_is_stopped_alone(four_gpus):
    out = four_gpus / "out"
    result = run(out, 3, 'echo "gpus=$CUDA_VISIBLE_DEVICES"; echo kept > $out/kept.txt',
                 '@1,3 echo "gpus=$CUDA_VISIBLE_DEVICES"; sleep 30; echo late-$((1 + 1))',
                 'echo "gpus=$CUDA_VISIBLE_DEVICES"')
    assert result.returncode == 0, result.stderr
    job_logs = logs(out)
    assert sorted(job_logs) == ["job0", "job1", "job2"]
    assert "gpus=0" in job_logs["job0"] and "job 0 rc 0" in job_logs["job0"]
    assert "gpus=1,3" in job_logs["job1"] and "job 1 rc 124" in job_logs["job1"] and "late-2" not in job_logs["job1"]
    assert "gpus=2" in job_logs["job2"] and "job 2 rc 0" in job_logs["job2"]
    with tarfile.open(out / "parallel.tgz") as archive:
        assert "gpu_parallel/job0/kept.txt" in archive.getnames()


def test_a_job_asking_a_gpu_the_host_lacks_is_refused(four_gpus):
    result = run(four_gpus / "out", 3, "@4 echo hi")
    assert result.returncode == 2 and "asks GPU 4; this host has 4" in result.stdout


def test_a_job_without_gpus_named_takes_one_that_no_other_job_names(four_gpus):
    out = four_gpus / "out"
    result = run(out, 5, '@1,2,3 echo "gpus=$CUDA_VISIBLE_DEVICES"', 'echo "gpus=$CUDA_VISIBLE_DEVICES"')
    assert result.returncode == 0, result.stderr
    job_logs = logs(out)
    assert "gpus=1,2,3" in job_logs["job0"] and "gpus=0" in job_logs["job1"]
    refused = run(four_gpus / "again", 5, "@0,1,2,3 true", "true")
    assert refused.returncode == 2 and "no GPU left" in refused.stdout
