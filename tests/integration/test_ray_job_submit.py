"""`ray job submit --working-dir . -- hbmserve deploy CONFIG` against a real local head."""

from __future__ import annotations

import shutil
import subprocess

import httpx
import pytest

pytestmark = pytest.mark.integration


def test_job_submit_deploys_config_from_working_dir(served, tmp_path, venv_bin):
    workdir = tmp_path / "job"
    workdir.mkdir()
    shutil.copy(served["config"], workdir / "cluster.yaml")
    r = subprocess.run(
        [str(venv_bin / "ray"), "job", "submit", "--address", "http://127.0.0.1:8265",
         "--working-dir", str(workdir), "--", "hbmserve", "deploy", "cluster.yaml"],
        capture_output=True, text=True, timeout=600,
    )
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert "succeeded" in out.lower()
    assert f"serving tiny-llama at {served['url']}/v1" in out
    # The deployment the job made serves on the same endpoint.
    resp = httpx.post(f"{served['url']}/v1/completions", timeout=60,
                      json={"model": "tiny-llama", "prompt": "hello", "max_tokens": 3, "ignore_eos": True})
    assert resp.status_code == 200 and resp.json()["usage"]["completion_tokens"] == 3
