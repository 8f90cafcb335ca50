"""`hbmserve bench` as a user runs it, against real servers on loopback: the front door's app
and hardened HTTP server in front of simulated-engine replicas (ops/sim_door.py, no Ray), with
API keys and a rate-limited tenant; and a raw socket server that fails in the ways a network
does (drop, stall, broken stream, SSE error event), to check each error kind with both clients."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from typer.testing import CliRunner

import hbmserve
from hbmserve.cli.main import build_app
from hbmserve.core.config import load_cluster_spec
from hbmserve.ops.sim_door import SimDoor

KEY = "bench-key-0123456789abcdef"
SLOW_KEY = "slow-key-0123456789abcdef-{}"  # one tenant a client, each allowed 2 requests a minute
PKG = Path(hbmserve.__file__).parent.parent  # the folder holding `hbmserve` (a symlink in a worktree)
CLIENTS = ["openai"] + (["vllm"] if importlib.util.find_spec("vllm") else [])


class Background:
    """An event loop in a thread, serving while the tests run in the main thread."""

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro, timeout: float = 30):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self):
        self.run(self._cancel_the_rest())  # handlers still stalling, say
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()

    @staticmethod
    async def _cancel_the_rest() -> None:
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


@pytest.fixture(scope="module")
def bg():
    b = Background()
    yield b
    b.close()


@pytest.fixture(scope="module")
def door(bg, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bench")
    slow = "".join(f", {{name: slow-{c}, keys: ['{SLOW_KEY.format(c)}'], requests_per_minute: 2}}" for c in CLIENTS)
    (tmp / "keys.yaml").write_text(f"tenants: [{{name: t, keys: ['{KEY}']}}{slow}]\n")
    cfg = tmp / "cluster.yaml"
    cfg.write_text(f"""
serve: {{auth: {{keys_file: {tmp / 'keys.yaml'}}}}}
models:
  - name: m
    source: sim
    engine: sim
    replicas: 2
    sim: {{gpu: h100-sxm, model_config_name: llama-3.1-8b, speedup: 20}}
    engine_settings: {{max_model_len: 2048, max_num_seqs: 8}}
    slo: {{ttft_p95_ms: 2000, tpot_p95_ms: 100}}
""")
    d = SimDoor(load_cluster_spec(cfg))
    bg.run(d.__aenter__())
    yield d.url, cfg, tmp
    bg.run(d.__aexit__(None, None, None))


def bench(*args: str, env: dict | None = None):
    return CliRunner().invoke(build_app(), ["bench", *args], env=env)


def test_open_loop_with_predict_as_a_user_runs_it(door):
    url, cfg, tmp = door
    env = {**os.environ, "PYTHONPATH": str(PKG), "OPENAI_API_KEY": KEY}
    cmd = [sys.executable, "-m", "hbmserve", "bench", "--url", url, "--model", "m", "--rate", "10", "--duration", "1",
           "--prompt-tokens", "100", "--output-tokens", "16", "--predict", str(cfg), "--json",
           "--plot", str(tmp / "bench.png")]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=30, cwd=tmp)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    m, p = out["measured"], out["predicted"]
    assert m["sent"] == m["ok"] + m["errors"] and m["sent"] >= 4 and m["errors"] == 0
    assert 0 < m["ttft_p50_s"] <= m["ttft_p90_s"] <= m["ttft_p95_s"] <= m["ttft_p99_s"] < 2.0
    assert 0 < m["tpot_p50_s"] < m["e2e_p50_s"] and m["itl_p99_s"] is not None
    assert m["request_rps"] > 0 and m["output_tok_s"] == pytest.approx(m["output_tokens"] / m["span_s"])
    assert m["slo_ttft_s"] == 2.0 and m["slo_attainment"] == pytest.approx(m["goodput_rps"] * m["span_s"] / m["sent"])
    assert p["sent"] == m["sent"] and p["ttft_p50_s"] > 0  # the same requests, simulated
    rows = {row["key"]: row for row in out["comparison"]["rows"]}
    assert rows["ttft_p95_s"]["measured"] == m["ttft_p95_s"] and rows["ttft_p95_s"]["predicted"] == p["ttft_p95_s"]
    assert out["comparison"]["mape_pct"] >= 0
    assert "20x simulated engine" in out["run"]["predicted_for"]
    assert (tmp / "bench.png").stat().st_size > 10_000
    assert KEY not in r.stdout + r.stderr


def test_closed_loop_text_report_prints_predicted_beside_measured(door):
    url, cfg, _ = door
    r = bench("--url", url, "--model", "m", "--concurrency", "3", "--duration", "0.5", "--prompt-tokens", "50",
              "--output-tokens", "8", "--api-key", KEY, "--client", "openai", "--predict", str(cfg))
    assert r.exit_code == 0, r.output
    assert "closed loop, 3 users for 0.5 s" in r.output and "openai SDK" in r.output
    header = next(line for line in r.output.splitlines() if "measured" in line and "predicted" in line)
    assert "error" in header and "MAPE over TTFT/TPOT p50/p95" in r.output
    assert "ttft_p95 ms" in r.output and KEY not in r.output


def test_a_trace_is_replayed_at_its_times(door, tmp_path):
    url, _, _ = door
    trace = tmp_path / "trace.csv"
    trace.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n"
                     + "".join(f"{10 + i * 0.4},{40 + i},{4 + i}\n" for i in range(6)))
    records = tmp_path / "records.jsonl"
    r = bench("--url", url, "--model", "m", "--trace", str(trace), "--time-scale", "0.5", "--duration", "1.1",
              "--json", "--save-records", str(records), env={"OPENAI_API_KEY": KEY})
    assert r.exit_code == 0, r.output
    rows = [json.loads(line) for line in records.read_text().splitlines()]
    # Rebased to the first arrival and compressed 2x: due at 0, 0.2, ..., 1.0; the last is past 1.1 s.
    assert [row["scheduled_s"] for row in rows] == pytest.approx([0.0, 0.2, 0.4, 0.6, 0.8, 1.0])
    # Never early, and in order; late only by the client's lag, which a busy 2-core CI machine
    # stretches (a 0.1 s bound failed there once, value unrecorded): the bound is loose, the
    # lags are printed on failure.
    lags = [row["sent_s"] - row["scheduled_s"] for row in rows]
    assert all(-1e-3 <= lag < 0.5 for lag in lags), lags
    assert [row["sent_s"] for row in rows] == sorted(row["sent_s"] for row in rows)
    assert [(row["prompt_tokens"], row["output_tokens"]) for row in rows] == [(40 + i, 4 + i) for i in range(6)]
    assert json.loads(r.stdout)["measured"]["ok"] == 6


@pytest.mark.parametrize("client", CLIENTS)
def test_a_429_with_retry_after_is_counted_by_its_status(door, client):
    url, _, _ = door
    r = bench("--url", url, "--model", "m", "--rate", "8", "--duration", "1", "--prompt-tokens", "20",
              "--output-tokens", "4", "--api-key", SLOW_KEY.format(client), "--client", client, "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    m = out["measured"]
    assert m["errors_by_kind"].get("429", 0) >= 1 and set(m["errors_by_kind"]) == {"429"}
    assert m["sent"] == m["ok"] + m["errors"] and m["ok"] <= 2  # the tenant's two a minute
    assert out["run"]["client"] == client and "429" in out["error_examples"]["429"]


@pytest.mark.parametrize("args, message", [
    (["--url", "http://127.0.0.1:9"], "cannot reach http://127.0.0.1:9/v1/models"),
    (["--url", "localhost:8000"], "--url 'localhost:8000': expected http(s)://"),
    (["--rate", "1", "--concurrency", "2"], "give exactly one of"),
    (["--model", "nope"], "--model 'nope' is not served"),
    (["--api-key", "wrong-key-0123456789"], "refused the credentials (HTTP 401)"),
    (["--catalog", "fitted.yaml"], "--catalog is for --predict"),
])
def test_bad_input_is_one_clear_line_and_exit_2(door, args, message):
    url, _, _ = door
    base = {"--url": url, "--model": "m", "--rate": "1", "--duration": "1", "--api-key": KEY}
    for flag, value in zip(args[::2], args[1::2]):
        base[flag] = value
    r = bench(*(x for kv in base.items() for x in kv))
    assert r.exit_code == 2, r.output
    assert r.output.startswith("error: ") and r.output.count("\n") == 1, r.output
    assert message in r.output and "wrong-key" not in r.output


def test_a_profile_fitted_to_saved_runs_predicts_with_bench_catalog(door, tmp_path):
    # The user's path: save two runs' records, fit on one, hold the other out, then predict a
    # run with the fitted catalog. The fit can only lower the error it minimises (mean |ln err|) on
    # what it was fitted to; MAPE may rise (CI saw 82.8% -> 114.5% as |ln err| fell), so it is not held.
    from hbmserve.ops.bench import calibrate_serving

    url, cfg, _ = door
    for rate in ("6", "12"):
        r = bench("--url", url, "--model", "m", "--rate", rate, "--duration", "1", "--prompt-tokens", "100",
                  "--output-tokens", "16", "--api-key", KEY, "--save-records", str(tmp_path / f"r{rate}.jsonl"))
        assert r.exit_code == 0, r.output
    report, fitted = tmp_path / "fit.json", tmp_path / "fitted.yaml"
    assert calibrate_serving.main(["--config", str(cfg), "--fit-on", "r6", "--max-evals", "12", "--catalog-out",
                                   str(fitted), "--out", str(report), str(tmp_path / "r6.jsonl"),
                                   str(tmp_path / "r12.jsonl")]) == 0
    out = json.loads(report.read_text())
    rows = {row["run"]: row for row in out["rows"]}
    assert not rows["r6"]["held_out"] and rows["r12"]["held_out"]
    assert rows["r6"]["log_error_after"] <= rows["r6"]["log_error_before"] + 1e-9
    assert out["mape_held_out_pct"] == rows["r12"]["mape_after_pct"]
    r = bench("--url", url, "--model", "m", "--rate", "6", "--duration", "1", "--prompt-tokens", "100",
              "--output-tokens", "16", "--api-key", KEY, "--predict", str(cfg), "--catalog", str(fitted), "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["predicted"]["sent"] >= 1
    r = bench("--url", url, "--model", "m", "--rate", "1", "--duration", "1", "--api-key", KEY,
              "--predict", str(cfg), "--catalog", str(tmp_path / "missing.yaml"))
    assert r.exit_code == 2 and "hardware catalog not found" in r.output


# ---- a server that fails the way networks and engines do ----------------------------------------

FAULTS = ("drop", "stall", "cut", "error-event")


async def faulty(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """/v1/models lists FAULTS; a completion for model `drop` closes the connection unanswered,
    `stall` never answers, `cut` breaks its chunked stream after one token, `error-event` sends
    one token then an SSE error event (the front door's relay does, when a replica dies)."""
    try:
        head = (await reader.readuntil(b"\r\n\r\n")).decode()
        length = next((int(h.split(":")[1]) for h in head.split("\r\n") if h.lower().startswith("content-length")), 0)
        body = json.loads(await reader.readexactly(length)) if length else {}
        if head.startswith("GET /v1/models"):
            data = json.dumps({"object": "list", "data": [{"id": f, "object": "model"} for f in FAULTS]}).encode()
            writer.write(b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-type: application/json\r\n"
                         b"content-length: %d\r\n\r\n%s" % (len(data), data))
            return
        model = body.get("model")
        if model == "stall":
            await asyncio.sleep(3600)
        if model == "drop":
            return
        token = b'data: {"id":"c","object":"text_completion","created":0,"model":"x","choices":[{"index":0,' \
                b'"text":"a","logprobs":null,"finish_reason":null}]}\n\n'
        writer.write(b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-type: text/event-stream\r\n"
                     b"transfer-encoding: chunked\r\n\r\n")
        writer.write(b"%x\r\n%s\r\n" % (len(token), token))
        if model == "error-event":
            err = b'data: {"error":{"message":"replica failed","type":"server_error","code":"replica_failed"}}\n\n'
            writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(err), err))
        else:
            writer.write(b"40\r\npartial")  # a chunk promised 64 bytes, then the connection ends
        await writer.drain()
    finally:
        writer.close()


@pytest.fixture(scope="module")
def faulty_url(bg):
    server = bg.run(asyncio.start_server(faulty, "127.0.0.1", 0))
    yield "http://127.0.0.1:%d" % server.sockets[0].getsockname()[1]
    bg.run(_close(server))


async def _close(server) -> None:
    server.close()


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("model, kind", [("drop", "connection"), ("stall", "timeout"), ("cut", "stream"),
                                         ("error-event", "stream")])
def test_each_failure_is_counted_by_its_kind(faulty_url, client, model, kind):
    r = bench("--url", faulty_url, "--model", model, "--concurrency", "2", "--duration", "0.05", "--prompt-tokens",
              "5", "--output-tokens", "50", "--request-timeout", "0.3" if model == "stall" else "10", "--client",
              client, "--json")
    assert r.exit_code == 1, r.output  # every request failed
    m = json.loads(r.stdout)["measured"]
    assert m["errors_by_kind"] == {kind: m["sent"]} and m["sent"] >= 1 and m["ok"] == 0
    assert "every request failed" in r.output
