"""benchmarks/gpu_check.sh (issue 44, item 6): without an NVIDIA GPU it stops at once, says why
and writes nothing. (On a GPU machine it is run by hand: `make gpu-check`.)"""
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_gpu_check_without_a_gpu_fails_clearly_and_writes_nothing(tmp_path):
    path = os.pathsep.join(d for d in ("/usr/bin", "/bin") if os.path.isdir(d))
    if shutil.which("nvidia-smi", path=path):
        pytest.skip("this machine has nvidia-smi: run `make gpu-check` instead")
    report = ROOT / "benchmarks" / "RESULTS-gpu.md"
    before = report.read_bytes() if report.exists() else None
    result = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_check.sh")], cwd=tmp_path, capture_output=True,
                            text=True, timeout=60, env={"PATH": path, "HOME": str(tmp_path), "VENV": str(tmp_path / "venv")})
    assert result.returncode == 3, result.stdout + result.stderr
    assert "no NVIDIA GPU here" in result.stderr and "Nothing was run or written" in result.stderr
    assert (report.read_bytes() if report.exists() else None) == before
    assert not (tmp_path / "venv").exists()
