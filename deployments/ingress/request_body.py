"""A request body as the front door reads it: the fields that decide what the engine runs
(messages, prompt or input, max_tokens, max_completion_tokens, n, stream), with the coercion of
vLLM's own request models, so that the door charges what the engine will run.

vLLM's pydantic models (`ChatCompletionRequest`, `CompletionRequest`) are the reference, but
importing them costs every front door about 18 s and 540 MB; these models declare the same
types for the fields the door reads, in pydantic's lax mode as vLLM's do ("12000" and 12000.0
are 12000; 4.5 is refused), and let every other field through untouched for the engine to judge.
`tests/unit/deployments/ingress/test_request_body.py` checks them against vLLM's on hostile bodies.

A body of the wrong shape is a `BodyShapeError` naming the field, answered 400 by the door.
Before any of that, `read_body` takes the bytes off the socket within the door's size and time
limits (`BodyLimits`).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, ValidationError

from hbmserve.core.routing import CHARS_PER_TOKEN

# vLLM's default for /v1/completions when max_tokens is absent or null (CompletionRequest).
COMPLETION_DEFAULT_MAX_TOKENS = 16


class BodyShapeError(ValueError):
    def __init__(self, message: str, param: str | None):
        super().__init__(message)
        self.param = param


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow")


class _TextPart(_Body):
    type: Literal["text"]
    text: str


class _ImageUrl(_Body):
    url: str
    detail: str | None = None


class _ImageUrlPart(_Body):
    type: Literal["image_url"]
    image_url: _ImageUrl


class _InputAudio(_Body):
    data: str
    format: str


class _InputAudioPart(_Body):
    type: Literal["input_audio"]
    input_audio: _InputAudio


class _RefusalPart(_Body):
    type: Literal["refusal"]
    refusal: str


class _OtherPart(_Body):
    """A part of another type (vLLM's video_url, audio_url, file, image_embeds, ...) or vLLM's
    untyped shorthand: its fields are the engine's to judge; its type, if any, is a string."""

    type: str | None = None


_PARTS = {"text": _TextPart, "image_url": _ImageUrlPart, "input_audio": _InputAudioPart, "refusal": _RefusalPart}


# Tags name the branch of a union in pydantic's error locations; they start with "~" so that
# BodyShapeError's `param` can drop them and name the field alone (messages.0.content.0.text).
def _part_kind(part: Any) -> str:
    if isinstance(part, str):
        return "~str"  # vLLM reads a bare string part as text
    kind = part.get("type") if isinstance(part, dict) else None
    return f"~{kind}" if isinstance(kind, str) and kind in _PARTS else "~other"


ContentPart = Annotated[
    Annotated[str, Tag("~str")] | Annotated[_TextPart, Tag("~text")] | Annotated[_ImageUrlPart, Tag("~image_url")]
    | Annotated[_InputAudioPart, Tag("~input_audio")] | Annotated[_RefusalPart, Tag("~refusal")]
    | Annotated[_OtherPart, Tag("~other")],
    Discriminator(_part_kind)]
Content = Annotated[
    Annotated[str, Tag("~text")] | Annotated[list[ContentPart], Tag("~parts")],
    Discriminator(lambda c: "~text" if isinstance(c, str) else "~parts")]


class _Message(_Body):
    role: str
    # Each part is checked as OpenAI's types declare it, as vLLM's request model does: a text
    # part whose text is a number is a 400 naming messages.i.content.j.text, never a crash.
    content: Content | None = None


class _StreamOptions(_Body):
    include_usage: bool | None = False
    continuous_usage_stats: bool | None = False


class _Streamed(_Body):
    stream: bool | None = False
    stream_options: _StreamOptions | None = None


class ChatBody(_Streamed):
    messages: list[_Message]
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    n: int | None = 1


TokenId = Annotated[int, Field(ge=0)]
Prompt = list[TokenId] | list[list[TokenId]] | str | list[str]


class CompletionBody(_Streamed):
    prompt: Prompt | None = None
    max_tokens: int | None = None
    n: int = 1


class EmbeddingBody(_Body):
    input: list[int] | list[list[int]] | str | list[str]  # vLLM's embedding model checks no id's sign


@dataclass(frozen=True)
class Generation:
    """What the engine will run for one request: `sequences` in all (n per prompt), each of up
    to `max_tokens` (None: to the end of the context; 0: an embedding, no output), after
    `prompt_tokens` (estimated from the text at CHARS_PER_TOKEN, exact for token ids) per
    prompt. `stream_usage`: a streamed reply whose client asked for the usage chunk."""

    prompts: int
    sequences: int
    prompt_tokens: int  # the largest prompt's
    max_tokens: int | None
    all_prompt_tokens: int = 0  # every prompt's, the prompt part of the charge
    stream: bool = False
    stream_usage: bool = False

    def most_tokens(self, max_model_len: int) -> int:
        """The most tokens the engine may spend on it: every prompt, and each sequence to its
        max_tokens or, without one, to the end of the context. What a tenant is charged before
        it runs (the engine's usage settles it after)."""
        out = self.max_tokens if self.max_tokens is not None else max(1, max_model_len - self.prompt_tokens)
        return self.all_prompt_tokens + self.sequences * out


EMBEDDINGS = "/v1/embeddings"


def read_generation(path: str, body: dict[str, Any]) -> Generation:
    """The body of a /v1/chat/completions, /v1/completions or /v1/embeddings request
    (/invocations: any of them, told apart by `messages` and `input`), or BodyShapeError."""
    try:
        if path == EMBEDDINGS or (path == "/invocations" and "input" in body and "prompt" not in body):
            sizes = _prompts(EmbeddingBody.model_validate(body).input)
            return Generation(len(sizes), len(sizes), max(sizes), 0, sum(sizes))
        if path == "/v1/chat/completions" or (path == "/invocations" and "messages" in body):
            chat = ChatBody.model_validate(body)
            chars = sum(len(m.role) + len(_text(m.content)) for m in chat.messages)
            asked = chat.max_completion_tokens if chat.max_completion_tokens is not None else chat.max_tokens
            n = 1 if chat.n is None else chat.n
            tokens = chars // CHARS_PER_TOKEN
            return _checked(Generation(1, n, tokens, asked, tokens, *_stream(chat, body)))
        completion = CompletionBody.model_validate(body)
    except ValidationError as err:
        first = err.errors()[0]
        param = ".".join(str(p) for p in first["loc"] if not str(p).startswith("~")) or None
        msg = first["msg"].split(" or instance of ")[0]  # pydantic names the model class: not the client's business
        raise BodyShapeError(f"{param}: {msg}" if param else msg, param) from None
    prompts = _prompts(completion.prompt)
    asked = completion.max_tokens if completion.max_tokens is not None else COMPLETION_DEFAULT_MAX_TOKENS
    return _checked(Generation(len(prompts), len(prompts) * completion.n, max(prompts, default=0), asked,
                               sum(prompts), *_stream(completion, body)))


def _stream(parsed: _Streamed, body: dict[str, Any]) -> tuple[bool, bool]:
    """(streamed, the client asked for the usage chunk); vLLM's refusal of stream options on a
    reply that is not streamed."""
    if body.get("stream_options") and not body.get("stream"):  # on the raw body, as vLLM checks
        raise BodyShapeError("stream_options: Stream options can only be defined when `stream=True`.",
                             "stream_options")
    return bool(parsed.stream), bool(parsed.stream and parsed.stream_options and parsed.stream_options.include_usage)


def _checked(g: Generation) -> Generation:
    if g.sequences < 1:
        raise BodyShapeError("n: must be at least 1", "n")
    if g.max_tokens is not None and g.max_tokens < 1:
        raise BodyShapeError("max_tokens: must be at least 1", "max_tokens")
    return g


def _prompts(prompt) -> list[int]:
    """Each prompt's size in tokens: a token-id list is exact, text is estimated."""
    if prompt is None or prompt == []:
        return [0]
    if isinstance(prompt, str):
        return [len(prompt) // CHARS_PER_TOKEN]
    if all(isinstance(p, int) for p in prompt):
        return [len(prompt)]
    return [len(p) if isinstance(p, list) else len(p) // CHARS_PER_TOKEN for p in prompt]


def _text(content: str | list[str | BaseModel] | None) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    return "".join(p if isinstance(p, str) else p.text for p in content if isinstance(p, (str, _TextPart)))


@dataclass(frozen=True)
class BodyLimits:
    max_bytes: int = 4 * 1024 * 1024
    read_timeout_s: float = 30.0
    first_byte_timeout_s: float = 600.0


class BodyError(Exception):
    def __init__(self, status: int, message: str, code: str):
        super().__init__(message)
        self.status, self.code = status, code


async def read_body(scope, receive, limits: BodyLimits) -> bytes:
    """The whole request body, or BodyError: 413 past the size limit (checked against
    Content-Length first, so a large upload is refused before it is read), 408 when the client
    does not finish sending in time. A slow body holds a connection, never an admission slot."""
    declared = dict(scope["headers"]).get(b"content-length")
    if declared is not None and declared.isdigit() and int(declared) > limits.max_bytes:
        raise BodyError(413, f"request body of {int(declared)} bytes exceeds the limit of {limits.max_bytes}",
                        "request_too_large")
    parts, size = [], 0
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limits.read_timeout_s
    try:  # one deadline for the whole body, with no task of its own (wait_for made one a read)
        async with asyncio.timeout_at(deadline):
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    raise BodyError(499, "client closed the connection", "client_closed")
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > limits.max_bytes:
                    raise BodyError(413, f"request body exceeds the limit of {limits.max_bytes} bytes",
                                    "request_too_large")
                parts.append(chunk)
                if not message.get("more_body"):
                    return b"".join(parts)
    except TimeoutError:
        raise BodyError(408, f"request body not received within {limits.read_timeout_s:g}s",
                        "request_timeout") from None
