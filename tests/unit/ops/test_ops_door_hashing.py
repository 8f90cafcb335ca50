"""The door's KV routing costs benchmark (ops/bench/door_hashing.py) on the tiny model: each prompt
length is tokenized, hashed both ways and timed, and a batch is decoded and applied."""

from __future__ import annotations

import json

from hbmserve.cluster.tiny_model import write_model
from hbmserve.ops.bench import door_hashing


def test_every_cost_is_measured_on_prompts_that_grow(tmp_path):
    result = door_hashing.measure(write_model(tmp_path / "tiny"), repeat=2)
    rows = result["requests"]
    assert [r["prompt_chars"] for r in rows] == list(door_hashing.PROMPT_CHARS)
    tokens = [r["prompt_tokens"] for r in rows]
    assert tokens == sorted(tokens) and tokens[0] > 100
    for r in rows:
        assert r["tokenize_us"] > 0 and r["vllm_hashes_us"] > 0 and r["text_hashes_us"] > 0
    assert result["batch_bytes"] > 0 and result["batch_decode_apply_us"] > 0


def test_the_command_writes_its_json(tmp_path, capsys):
    door_hashing.main(["--repeat", "2", "--out", str(tmp_path / "h.json")])
    assert json.loads((tmp_path / "h.json").read_text())["requests"]
