"""Arrivals: trace readers (CSV, JSONL) and seeded synthetic generators."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from hbmserve.capacity.traces.arrivals import TraceError, gamma_arrivals, read_trace

AZURE = Path(__file__).resolve().parents[5] / "shared" / "data" / "traces" / "azure_llm_2023_conv.csv"


def test_csv_trace(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n5.0,10,2\n1.0,20,3\n")
    a = read_trace(p)
    assert list(a.t) == [0.0, 4.0]  # sorted and re-based to the first arrival
    assert list(a.prompt) == [20, 10] and list(a.output) == [3, 2]
    assert a.hashes is None


def test_the_azure_dataset_s_own_csv_is_read_as_published(tmp_path):
    p = tmp_path / "AzureLLMInferenceTrace_code.csv"
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                 "2023-11-16 18:17:03.9799600,4808,10\n"
                 "2023-11-16 18:17:04.0319600,3180,8\n"
                 "2023-11-16 18:18:03.9799601,20,1\n")
    a = read_trace(p)
    assert a.t == pytest.approx([0.0, 0.052, 60.0000001], abs=1e-6)
    assert list(a.prompt) == [4808, 3180, 20] and list(a.output) == [10, 8, 1]
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 nonsense,1,1\n")
    with pytest.raises(TraceError, match="line 2"):
        read_trace(p)


def test_jsonl_trace_with_hash_ids_in_milliseconds(tmp_path):
    p = tmp_path / "t.jsonl"
    rows = [{"timestamp": 1000, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]},
            {"timestamp": 3500, "input_length": 700, "output_length": 6, "hash_ids": [1, 3]}]
    p.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    a = read_trace(p)
    assert list(a.t) == [0.0, 2.5]
    assert a.hashes == ((1, 2), (1, 3))


def test_bad_traces_name_the_problem(tmp_path):
    p = tmp_path / "bad.csv"
    p.write_text("arrived_at,num_prefill_tokens\n1,2\n")
    with pytest.raises(TraceError, match="num_decode_tokens"):
        read_trace(p)
    q = tmp_path / "bad.jsonl"
    q.write_text('{"timestamp": 1, "input_length": 3, "output_length": 1}\n{"timestamp": "x"}\n')
    with pytest.raises(TraceError, match="line 2"):
        read_trace(q)
    with pytest.raises(TraceError, match="not found"):
        read_trace(tmp_path / "missing.csv")


def test_poisson_rate_and_gamma_burstiness():
    a = gamma_arrivals(20.0, 500.0, 1.0, seed=1)
    assert abs(len(a) / 500.0 - 20.0) < 1.0
    gaps = np.diff(gamma_arrivals(20.0, 500.0, cv=3.0, seed=1).t)
    assert gaps.std() / gaps.mean() > 2.0
    assert np.array_equal(gamma_arrivals(5, 10, 1.0, seed=3).t, gamma_arrivals(5, 10, 1.0, seed=3).t)


def test_window_scale_clip():
    a = gamma_arrivals(10.0, 100.0, 1.0, prompt_tokens=3000, output_tokens=900, seed=2)
    w = a.window(10.0, 20.0)
    assert w.t.min() >= 0 and w.t.max() < 10.0
    assert len(a.scaled(0.5)) == len(a) and a.scaled(0.5).duration_s == pytest.approx(a.duration_s / 2)
    c = a.clipped(2048)
    assert (c.prompt + c.output <= 2048).all()


@pytest.mark.skipif(not AZURE.is_file(), reason="shared Azure trace not present")
def test_azure_trace_shape():
    a = read_trace(AZURE)
    assert len(a) == 19366
    assert 3400 < a.duration_s < 3600
    assert 1100 < a.prompt.mean() < 1200


def test_an_adapter_trace_is_zipf_and_survives_windows_and_clipping():
    from hbmserve.capacity.traces.adapter_trace import AdapterTraceSpec, adapter_arrivals

    spec = AdapterTraceSpec(adapters=10, zipf_s=1.2, rate_rps=50, duration_s=100, base_share=0.1)
    a = adapter_arrivals(spec, seed=3)
    again = adapter_arrivals(spec, seed=3)
    assert np.array_equal(a.t, again.t) and np.array_equal(a.adapters, again.adapters), "seeded"
    counts = np.bincount(a.adapters[a.adapters >= 0], minlength=10)
    assert counts[0] > counts[1] > counts[9], "rank 0 is the most popular"
    assert 0.07 < (a.adapters < 0).mean() < 0.13
    w = a.window(10, 20).clipped(512)
    i = int(np.searchsorted(a.t, 10))
    assert w.adapter_of(0) == a.adapter_of(i) and w.adapter_names == spec.names
    assert {a.adapter_of(j) for j in range(len(a))} <= {None, *spec.names}


def test_a_jsonl_trace_names_each_requests_adapter_and_writes_it_back(tmp_path):
    from hbmserve.capacity.traces.adapter_trace import AdapterTraceSpec, adapter_arrivals, with_adapters
    from hbmserve.capacity.traces.arrivals import write_jsonl_trace

    p = tmp_path / "t.jsonl"
    p.write_text("".join(json.dumps(x) + "\n" for x in (
        {"arrived_at": 2.0, "input_length": 30, "output_length": 3, "adapter": "sql"},
        {"arrived_at": 1.0, "input_length": 10, "output_length": 1, "adapter": "legal"},
        {"arrived_at": 1.5, "input_length": 20, "output_length": 2, "adapter": None},
        {"arrived_at": 3.0, "input_length": 40, "output_length": 4, "adapter": "legal"})))
    a = read_trace(p)  # sorted by time; names in order of first appearance in the file
    assert a.adapter_names == ("sql", "legal") and a.adapters.tolist() == [1, -1, 0, 1]
    assert [a.adapter_of(i) for i in range(4)] == ["legal", None, "sql", "legal"]
    assert a.prompt.tolist() == [10, 20, 30, 40]
    spec = AdapterTraceSpec(adapters=5, rate_rps=20, duration_s=30)
    b = adapter_arrivals(spec, seed=1)
    write_jsonl_trace(b, tmp_path / "b.jsonl")
    back = read_trace(tmp_path / "b.jsonl")
    assert [back.adapter_of(i) for i in range(len(b))] == [b.adapter_of(i) for i in range(len(b))]
    drawn = with_adapters(gamma_arrivals(50, 100, seed=2), spec, seed=3)
    counts = np.bincount(drawn.adapters, minlength=5)
    assert drawn.adapter_names == spec.names and counts[0] > counts[1] > counts[4], "Zipf 1: rank 0 the most"
    p.write_text(json.dumps({"arrived_at": 0.0, "input_length": 1, "output_length": 1, "adapter": 7}) + "\n")
    with pytest.raises(TraceError, match="line 1: .*adapter must be a name or null"):
        read_trace(p)
