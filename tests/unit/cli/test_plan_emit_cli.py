"""One path from a trace to a deployment: `hbmserve plan --trace T --emit-config F` writes a cluster
config that `autoscale evaluate --config F --trace T` runs without --allow-slo-miss and `up` takes
as is (cli/plan_emit.py). Black box through typer's CliRunner, on a two-minute prompt-heavy trace
where the TPOT target, not the grid, caps the 70B model's engine budget."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from hbmserve.capacity.perf.slo_cap import SloCheck
from hbmserve.cli import autoscale, capacity, serve
from hbmserve.cli.plan_emit import BudgetChecks
from hbmserve.core.config import load_cluster_spec
from hbmserve.core.engine_settings import EngineKind
from hbmserve.capacity.traces.code_trace import CodeTraceSpec, code_arrivals

SOURCE = "meta-llama/Llama-3.1-70B-Instruct"
PLAN = ["plan", "--model", "llama-3.1-70b", "--slo-ttft-p95", "2", "--slo-tpot-p95", "0.1", "--gpus", "h100",
        "--confirm-top", "1", "--top", "1"]


def _app() -> typer.Typer:
    app = typer.Typer()
    for area in (capacity, autoscale, serve):
        area.register(app)
    return app


@pytest.fixture(scope="module")
def emitted(tmp_path_factory) -> tuple[Path, Path, dict]:
    folder = tmp_path_factory.mktemp("emit")
    arr = code_arrivals(CodeTraceSpec(duration_s=120, base_rps=2, peak_rps=4, spikes=0), seed=1)
    trace = folder / "trace.csv"
    trace.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n"
                     + "".join(f"{t:.6f},{p},{o}\n" for t, p, o in zip(arr.t, arr.prompt, arr.output)))
    out = folder / "out.yaml"
    r = CliRunner().invoke(_app(), [*PLAN, "--trace", str(trace), "--emit-config", str(out), "--source", SOURCE,
                                    "--json"])
    assert r.exit_code == 0, r.output
    assert f"config written to {out}" in r.stderr  # stdout holds only the JSON
    return trace, out, json.loads(r.stdout)[0]


def test_the_file_is_the_first_plan_with_a_header_naming_the_command_and_the_trace(emitted):
    trace, out, first = emitted
    header = " ".join(line[2:] for line in out.read_text().splitlines() if line.startswith("# "))
    assert header.startswith(f"Written by `hbmserve plan --model llama-3.1-70b --trace {trace} --slo-ttft-p95 2 "
                             f"--slo-tpot-p95 0.1 --gpus h100 --emit-config {out}`.")
    m = load_cluster_spec(out).models[0]
    es = m.engine_settings
    assert (m.hardware.gpu, m.parallelism.tp, m.parallelism.pp, m.engine) == \
        (first["gpu"], first["tp"], first["pp"], EngineKind.VLLM_GPU)
    assert (es.max_num_seqs, es.enable_chunked_prefill, es.max_model_len) == \
        (first["max_num_seqs"], first["chunked_prefill"], first["max_model_len"])
    assert (m.source, m.sim.model_config_name, m.slo.tpot_p95_ms, m.slo.ttft_p95_ms) == \
        (SOURCE, "llama-3.1-70b", 100, 2000)
    assert m.autoscaling.model_dump(include={"min_replicas", "max_replicas"}) == \
        {k: first["autoscaling"][k] for k in ("min_replicas", "max_replicas")}
    assert m.autoscaling.replica_capacity_rps == pytest.approx(first["autoscaling"]["replica_capacity_rps"], 1e-3)
    assert "startup_s" in m.autoscaling.model_fields_set
    # Both checks agreed with the plan's budget here, so the file keeps it.
    assert es.max_num_batched_tokens == first["max_num_batched_tokens"]


def test_autoscale_evaluate_runs_the_file_without_allow_slo_miss_and_its_budget_fits(emitted):
    trace, out, _ = emitted
    r = CliRunner().invoke(_app(), ["autoscale", "evaluate", "--config", str(out), "--trace", str(trace),
                                    "--policy", "hbmserve", "--no-frontier", "--json"])
    assert r.exit_code == 0, r.output
    got = json.loads(r.stdout)
    budget = load_cluster_spec(out).models[0].engine_settings.max_num_batched_tokens
    assert got["chunk_step_s"] <= 0.1 and budget <= got["max_num_batched_tokens_for_tpot"]


def test_up_takes_the_file_as_is(emitted, started):
    # vLLM's own parser reads the argument list here (cluster/checks.py load_deployable); the steps
    # that would start a head and deploy are recorders (conftest.py).
    r = CliRunner().invoke(_app(), ["up", "--detach", str(emitted[1])])
    assert r.exit_code == 0, r.output
    assert "warning:" not in r.output and "error:" not in r.output
    assert started == ["models", "head", "connect", "deploy"]


def test_a_file_that_cannot_or_should_not_be_written_is_refused_before_planning(tmp_path):
    def emit(path: Path, *more: str):
        return CliRunner().invoke(_app(), [*PLAN, "--rate", "1", "--emit-config", str(path), *more])

    r = emit(tmp_path / "nowhere" / "out.yaml", "--source", SOURCE)
    assert r.exit_code == 2 and f"--emit-config {tmp_path / 'nowhere' / 'out.yaml'}: no folder" in r.output
    (tmp_path / "out.yaml").write_text("edited by hand\n")
    r = emit(tmp_path / "out.yaml", "--source", SOURCE)
    assert r.exit_code == 2 and "the file exists; pass --force to replace it" in r.output
    assert (tmp_path / "out.yaml").read_text() == "edited by hand\n"
    r = emit(tmp_path / "new.yaml")
    assert r.exit_code == 2 and "--model llama-3.1-70b is a shape, not the model's folder" in r.output
    assert "plans for" not in r.output and not (tmp_path / "new.yaml").exists()
    r = emit(tmp_path / "out.yaml", "--source", SOURCE, "--duration", "30", "--force")
    assert r.exit_code == 0, r.output
    assert load_cluster_spec(tmp_path / "out.yaml").models[0].source == SOURCE


def _check(step_s: float, fits: int) -> SloCheck:
    return SloCheck(feasible=True, blocker=None, advice=None, lightest_rps=1e-3, ttft_floor_s=0.1,
                    tpot_floor_s=0.01, chunk_step_s=step_s, budget_for_tpot=fits, tpot_target_s=0.1,
                    max_num_batched_tokens=1600)


def test_the_budget_is_lowered_to_what_every_refusing_check_accepts():
    assert BudgetChecks(_check(0.09, 1664), _check(0.099, 1600), None).fitting(1600) == 1600
    assert BudgetChecks(_check(0.09, 1664), _check(0.11, 1536), None).fitting(1600) == 1536
    assert BudgetChecks(_check(0.12, 1472), _check(0.11, 1536), None).fitting(1600) == 1472
    assert BudgetChecks(_check(0.12, 1472), None, None).fitting(1600) == 1472
    both = BudgetChecks(_check(0.09, 1664), _check(0.11, 1536), None)
    assert both.refusal("f").startswith("f: a decode step carrying a full 1,600-token chunk takes 0.11 s")
