"""`hbmserve topology`, `hbmserve placement plan` and `hbmserve node-bootstrap` via CliRunner."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pynvml
import pytest
import typer
from typer.testing import CliRunner

import hbmserve.placement as placement_pkg
import hbmserve.placement.io.nvml_discovery as nvml_discovery
from hbmserve.cli.placement import register

DATA = Path(placement_pkg.__file__).parent / "data"
PAIRS = str(DATA / "cluster_nvlink_pairs_x2.yaml")
runner = CliRunner()


@pytest.fixture(scope="module")
def app():
    application = typer.Typer(pretty_exceptions_enable=False, add_completion=False)
    register(application)
    return application


def test_plan_json_contract_and_exit_zero(app):
    result = runner.invoke(app, ["placement", "plan", "--topology", PAIRS, "--tp", "2", "--replicas", "2", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["feasible"] is True and isinstance(doc["reason"], str)
    stages = [(s["node"], s["gpus"], s["island"]) for r in doc["replicas"] for s in r["stages"]]
    assert stages == [("pairs-a", [0, 1], "pairs-a-0"), ("pairs-b", [0, 1], "pairs-b-0")]
    assert isinstance(doc["predicted_allreduce_us"], float) and doc["alternatives"] == []


def test_plan_infeasible_exits_three_with_reason_and_alternatives(app):
    result = runner.invoke(app, ["placement", "plan", "--topology", PAIRS, "--tp", "8", "--json"])
    assert result.exit_code == 3
    doc = json.loads(result.stdout)
    assert doc["feasible"] is False
    assert doc["reason"] == "TP=8 needs an 8-GPU NVLink island; the largest here is 2"
    assert {(a["kind"], a["tp"], a["pp"]) for a in doc["alternatives"]} == {
        ("smaller_tp_more_pp", 2, 4), ("quantize", 2, 1)}


def test_plan_table_output(app):
    result = runner.invoke(app, ["placement", "plan", "--topology", str(DATA / "cluster_mixed_racks.json"),
                                 "--tp", "4", "--pp", "2", "--replicas", "2"])
    assert result.exit_code == 0
    assert "feasible" in result.stdout and "dgx-b2" in result.stdout and "NV18" in result.stdout


@pytest.mark.parametrize("args,needle", [
    (["--tp", "0"], "--tp"),
    (["--tp", "2", "--pp", "x"], "--pp"),
])
def test_plan_bad_numbers_name_the_option(app, args, needle):
    result = runner.invoke(app, ["placement", "plan", "--topology", PAIRS, *args])
    assert result.exit_code == 2 and needle in result.output
    assert "Traceback" not in result.output


def test_plan_missing_file_is_one_line(app, tmp_path):
    result = runner.invoke(app, ["placement", "plan", "--topology", str(tmp_path / "none.yaml"), "--tp", "1"])
    assert result.exit_code == 2
    assert result.stderr.strip().startswith("error:") and "cannot read" in result.stderr
    assert "Traceback" not in result.output


def test_plan_bad_file_names_the_field(app, tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("nodes:\n  - name: a\n")
    result = runner.invoke(app, ["placement", "plan", "--topology", str(path), "--tp", "1"])
    assert result.exit_code == 2 and "nodes.0.nvidia_smi_topo" in result.stderr


def test_topology_json(app):
    result = runner.invoke(app, ["topology", "--file", PAIRS, "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert [(i["id"], i["size"]) for i in doc["islands"]] == [
        ("pairs-a-0", 2), ("pairs-a-1", 2), ("pairs-b-0", 2), ("pairs-b-1", 2)]
    assert doc["nodes"][0]["matrix"][0] == ["X", "NV4", "SYS", "SYS"]


def test_topology_tables_show_islands_and_matrix(app):
    result = runner.invoke(app, ["topology", "--file", str(DATA / "cluster_nvl72.yaml")])
    assert result.exit_code == 0
    assert "island domain-nvl72-a: GPUs 0-3 (4 of 72 across 18 nodes)" in result.stdout
    assert "NV18" in result.stdout


def test_node_bootstrap_prints_ray_start_arguments(app):
    result = runner.invoke(app, ["node-bootstrap", "--file", PAIRS, "--node", "pairs-b"])
    assert result.exit_code == 0, result.output
    args = shlex.split(result.stdout)
    assert args[0] == "--labels" and "hbmserve.io/node=pairs-b" in args[1].split(",")
    assert json.loads(args[3]) == {"nvlink_island:pairs-b-0": 2.0, "nvlink_island:pairs-b-1": 2.0}


def test_node_bootstrap_json(app):
    result = runner.invoke(app, ["node-bootstrap", "--file", str(DATA / "cluster_nvl72.yaml"),
                                 "--node", "gb200-t03", "--json"])
    doc = json.loads(result.stdout)
    assert doc["resources"] == {"nvlink_island:gb200-t03-0": 4.0, "nvlink_domain:nvl72-a": 4.0}


def test_node_bootstrap_single_node_text_needs_no_node(app):
    result = runner.invoke(app, ["node-bootstrap", "--file", str(DATA / "dgx_h100.topo.txt"), "--json"])
    assert json.loads(result.stdout)["resources"] == {"nvlink_island:dgx_h100-0": 8.0}


@pytest.mark.parametrize("args,needle", [
    ([], "--node is required"),
    (["--node", "nobody"], "no node 'nobody'"),
    (["--node", "pairs-a", "--rack", "r1"], "--rack apply to NVML discovery"),
])
def test_node_bootstrap_input_errors(app, args, needle):
    result = runner.invoke(app, ["node-bootstrap", "--file", PAIRS, *args])
    assert result.exit_code == 2 and needle in result.stderr


class _NoDriver:
    NVMLError = pynvml.NVMLError

    def nvmlInit(self):
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)


@pytest.mark.parametrize("command", [["node-bootstrap"], ["topology"]])
def test_without_gpu_and_without_file_errors_clearly(app, monkeypatch, command):
    monkeypatch.setattr(nvml_discovery, "load_pynvml", lambda: _NoDriver())
    result = runner.invoke(app, command)
    assert result.exit_code == 1
    assert "no GPU topology on this machine" in result.stderr and "--file" in result.stderr
    assert "Traceback" not in result.output


def test_real_no_gpu_machine_errors_clearly(app):
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        result = runner.invoke(app, ["node-bootstrap"])
        assert result.exit_code == 1 and "no GPU topology" in result.stderr
        return
    pynvml.nvmlShutdown()
    pytest.skip("this machine has a GPU: the no-GPU error path is covered by the monkeypatched test")
