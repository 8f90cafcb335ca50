"""ops/bench/idle_cpu.py: process kinds, and a measurement of what runs (starting nothing)."""

from __future__ import annotations

import json

from hbmserve.ops.bench import idle_cpu


def test_process_kinds_from_command_lines():
    assert idle_cpu.kind_of("VLLM::EngineCore") == "engine core"
    assert idle_cpu.kind_of("ray::ServeReplica:hbmserve:FrontDoor") == "front door"
    assert idle_cpu.kind_of("ray::ServeReplica:m:engine-m") == "engine replica"
    assert idle_cpu.kind_of("ray::ServeController.listen_for_change") == "serve controller"
    assert idle_cpu.kind_of("/venv/lib/ray/core/src/ray/gcs/gcs_server --port=6379") == "gcs"
    assert idle_cpu.kind_of("/venv/ray/core/src/ray/raylet/raylet --node") == "raylet"
    assert idle_cpu.kind_of("python -m pytest") is None


def test_measuring_what_runs_starts_nothing(tmp_path):
    out = tmp_path / "idle.json"
    idle_cpu.main(["--no-up", "--seconds", "0.2", "--out", str(out)])
    got = json.loads(out.read_text())
    assert got["total"] == round(sum(got["shares"].values()), 4) and all(v >= 0 for v in got["shares"].values())
