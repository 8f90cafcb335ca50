"""The door's tokenizer (deployments/kv/prompt_tokens.py) gives the ids transformers gives, which
is what vLLM runs (its chat rendering is transformers' apply_chat_template; its prompt encoding
the fast tokenizer's). Checked on the tiny model's own tokenizer, and on a variant with a BOS
post-processor and a template that uses `bos_token`, `tojson` and `raise_exception`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hbmserve.cluster.tiny_model import TinyModelShape, write_tokenizer
from hbmserve.deployments.kv.prompt_tokens import PromptTokenizer, TokenizerUnavailable, tokenizer_files

LLAMA3_LIKE = ("{{ bos_token }}{% for m in messages %}{% if m['role'] not in ['system', 'user', 'assistant'] %}"
               "{{ raise_exception('bad role') }}{% endif %}<|start|>{{ m['role'] }}\n{{ m['content'] | trim }}"
               "<|end|>{% if loop.last and m.get('name') %}{{ m['name'] | tojson }}{% endif %}{% endfor %}"
               "{% if add_generation_prompt %}<|start|>assistant\n{% endif %}")


@pytest.fixture(scope="module")
def plain(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tok") / "tiny"
    write_tokenizer(out, TinyModelShape())
    return out


@pytest.fixture(scope="module")
def with_bos(plain: Path, tmp_path_factory) -> Path:
    """The same vocabulary, a BOS added on encode, and the template in tokenizer_config.json."""
    out = tmp_path_factory.mktemp("tok") / "bos"
    out.mkdir()
    tok = json.loads((plain / "tokenizer.json").read_text())
    bos = next(t["id"] for t in tok["added_tokens"] if t["content"] == "<|bos|>")
    tok["post_processor"] = {"type": "TemplateProcessing",
                             "single": [{"SpecialToken": {"id": "<|bos|>", "type_id": 0}},
                                        {"Sequence": {"id": "A", "type_id": 0}}],
                             "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
                             "special_tokens": {"<|bos|>": {"id": "<|bos|>", "ids": [bos], "tokens": ["<|bos|>"]}}}
    (out / "tokenizer.json").write_text(json.dumps(tok))
    config = json.loads((plain / "tokenizer_config.json").read_text())
    config["chat_template"] = LLAMA3_LIKE
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    return out


def _hf(folder: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder))


roles = st.sampled_from(["system", "user", "assistant"])
text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=80)
conversations = st.lists(st.fixed_dictionaries({"role": roles, "content": text}), min_size=1, max_size=5)


@pytest.mark.parametrize("which", ["plain", "with_bos"])
def test_chat_and_completion_ids_match_transformers(which, request):
    folder = request.getfixturevalue(which)
    ours, theirs = PromptTokenizer(tokenizer_files(folder)), _hf(folder)

    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(conversation=conversations, prompt=text)
    def check(conversation, prompt):
        expected = theirs.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
        assert ours.chat(conversation) == theirs.encode(expected, add_special_tokens=False)
        assert ours.completion(prompt) == theirs.encode(prompt, add_special_tokens=True)

    check()
    # The variant's BOS really is there: the test would notice a dropped post-processor.
    if which == "with_bos":
        assert ours.completion("hi")[0] == theirs.bos_token_id


def test_what_it_cannot_render_exactly_falls_back(with_bos):
    ours = PromptTokenizer(tokenizer_files(with_bos))
    assert ours.chat([{"role": "user", "content": [{"type": "text", "text": "hi"}]}]) is None  # parts
    assert ours.chat([{"role": "assistant", "content": "x", "tool_calls": []}]) is None  # tools
    assert ours.chat([{"role": "wizard", "content": "x"}]) is None  # the template raised
    assert ours.chat([]) is None
    assert ours.chat([{"role": "user", "content": "a", "name": "bob"}]) is not None  # `name` renders


def test_a_folder_without_a_fast_tokenizer_is_named(tmp_path):
    with pytest.raises(TokenizerUnavailable, match=str(tmp_path)):
        tokenizer_files(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(TokenizerUnavailable, match="do not load"):
        PromptTokenizer(tokenizer_files(tmp_path))
