"""The prompt's token ids at the front door, as the engine will see them: what the engine's block
hashes (routing/engine_hashes.py) are computed from, so the door can look a prompt up in the KV
index its engines report.

The door gets the model's tokenizer files from a replica (`GET /hbm/tokenizer`, served from the
replica's resolved model folder: the door needs no weights) and loads them with the `tokenizers`
library, which is what transformers' fast tokenizers run on: 0.05 s and ~16 MB, where
transformers' AutoTokenizer costs ~5.7 s and ~415 MB of imports in every door process.

Chat requests are rendered with the model's chat template as vLLM renders them
(`apply_chat_template(..., add_generation_prompt=True)` in transformers' sandboxed Jinja
environment, then encoded without special tokens, since the template writes them); completions
are encoded with special tokens, as vLLM encodes a prompt string. Only what that rendering is
sure to reproduce is tokenized: string prompts, and messages of plain string content with no
tools or other keys. Anything else returns None and the caller routes on the approximate text
hashes (routing/prefix.py): a request it cannot hash exactly is routed as before, never wrongly.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

# What the door needs of a model folder; the chat template lives in one of the last two.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json")
_SPECIAL = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token")
_MESSAGE_KEYS = frozenset({"role", "content", "name"})


class TokenizerUnavailable(ValueError):
    """The folder lacks a fast tokenizer (tokenizer.json) or its files do not load."""


def tokenizer_files(model_dir: Path) -> dict[str, str]:
    """The tokenizer's files of a model folder, by name (what a replica serves the door)."""
    files = {name: (model_dir / name).read_text() for name in TOKENIZER_FILES if (model_dir / name).is_file()}
    if "tokenizer.json" not in files:
        raise TokenizerUnavailable(f"{model_dir} has no tokenizer.json (a fast tokenizer is needed to hash "
                                   "prompts as the engine does)")
    return files


def tokenizer_route(model_dir: str):
    """The replica's `GET /hbm/tokenizer` (ASGI): `tokenizer_files` of its model folder as JSON,
    read on first use; 404 where the model is not a local folder with a fast tokenizer, and the
    doors then route on the approximate text hashes."""
    cached: list[tuple[int, bytes]] = []

    async def route(scope, receive, send) -> None:
        if not cached:
            try:
                cached.append((200, json.dumps(tokenizer_files(Path(model_dir))).encode()))
            except (TokenizerUnavailable, OSError) as err:
                cached.append((404, json.dumps({"error": str(err)}).encode()))
        status, body = cached[0]
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    return route


def _token_text(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):  # an AddedToken, saved
        return value["content"]
    return None


class PromptTokenizer:
    """One model's tokenizer and chat template, loaded from `tokenizer_files`' output."""

    def __init__(self, files: Mapping[str, str]) -> None:
        from tokenizers import Tokenizer

        try:
            self._tok = Tokenizer.from_str(files["tokenizer.json"])
            config = json.loads(files.get("tokenizer_config.json", "{}"))
            specials = json.loads(files.get("special_tokens_map.json", "{}"))
        except Exception as err:  # tokenizers raises plain Exceptions; json ValueError; a missing file KeyError
            raise TokenizerUnavailable(f"tokenizer files do not load: {err}") from None
        template = files.get("chat_template.jinja") or config.get("chat_template")
        self._template = self._compile(template) if isinstance(template, str) else None
        self._specials = {k: t for k in _SPECIAL
                          if (t := _token_text(config.get(k, specials.get(k)))) is not None}

    @staticmethod
    def _compile(source: str):
        """transformers' chat-template environment: sandboxed, trimmed blocks, its globals and
        `tojson`. A template that needs more (its `{% generation %}` tag) does not compile and
        chat requests fall back."""
        import jinja2
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message: str):
            raise jinja2.exceptions.TemplateError(message)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=["jinja2.ext.loopcontrols"])
        env.filters["tojson"] = lambda x, indent=None, separators=None, sort_keys=False: json.dumps(
            x, ensure_ascii=False, indent=indent, separators=separators, sort_keys=sort_keys)
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        try:
            return env.from_string(source)
        except jinja2.exceptions.TemplateError:
            return None

    def completion(self, prompt: str) -> list[int]:
        return self._tok.encode(prompt, add_special_tokens=True).ids

    def chat(self, messages: Sequence[Any]) -> list[int] | None:
        """The rendered conversation's ids, or None where the rendering might differ from vLLM's."""
        import jinja2

        if self._template is None or not messages:
            return None
        for m in messages:
            if not (isinstance(m, Mapping) and set(m) <= _MESSAGE_KEYS and isinstance(m.get("role"), str)
                    and isinstance(m.get("content"), str)):
                return None
        try:
            text = self._template.render(messages=[dict(m) for m in messages], add_generation_prompt=True,
                                         **self._specials)
        except jinja2.exceptions.TemplateError:
            return None
        return self._tok.encode(text, add_special_tokens=False).ids
