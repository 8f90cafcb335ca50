"""The scripts a lent GPU runs (tests/gpu/) still run: each with --smoke (tiny shapes on the CPU),
its predictions beside its measurements. Once the capacity folders moved, the roofline script
measured on and printed no prediction at all; this catches that before a GPU session is spent."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

GPU_SCRIPTS = Path(__file__).resolve().parents[3] / "gpu"


@pytest.mark.parametrize("script, rows", [("h200_roofline", "rows"), ("disagg_interference", "mixed")])
def test_each_gpu_script_runs_on_the_cpu_with_its_predictions(tmp_path, script, rows):
    pytest.importorskip("torch", reason="the GPU scripts measure with torch")
    done = subprocess.run([sys.executable, str(GPU_SCRIPTS / f"{script}.py"), "--smoke"], capture_output=True,
                          text=True, timeout=300, env={"OUT": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads((tmp_path / f"{script}.json").read_text())
    assert "predictions_error" not in out, out["predictions_error"]
    assert out[rows] and all(r.get("predicted_s", r.get("predicted_mixed_s")) for r in out[rows])
