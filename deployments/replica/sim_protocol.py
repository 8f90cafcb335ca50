"""The OpenAI protocol as the simulated engine speaks it: request models (pydantic, at the edge),
and pure helpers that turn a request into a generation plan and tokens into response bodies.

The simulated engine has no tokenizer and no weights, so two things are estimates, chosen to be
deterministic (the same request always costs the same) and documented here:
  - prompt tokens: UTF-8 bytes / 4, at least 1 (about what a Llama-3-style BPE gives for English
    text); a prompt given as token ids counts its ids. Chat messages are counted after a
    chat-template-like framing (`<|role|>\\n...\\n` per message, then `<|assistant|>\\n`).
  - output: one filler word per token, cycling through `FILLER_WORDS`.
With `max_tokens` the reply is exactly that long (finish_reason "length"); without it, the
"model" stops by itself after `natural_reply_tokens(prompt)` tokens (16-256, from a CRC of the
prompt; finish_reason "stop"), or at max_model_len if that comes first ("length").
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

FILLER_WORDS = ("the", "model", "and", "its", "cache", "live", "in", "memory", "which", "is", "small",
                "expensive", "and", "slow", "to", "fill")
BYTES_PER_TOKEN = 4


class _Lenient(BaseModel):
    # OpenAI clients send many sampling fields (temperature, top_p, user, seed, ...); the pace of
    # the simulated engine does not depend on them, so they are accepted and ignored.
    model_config = ConfigDict(extra="ignore")


class StreamOptions(_Lenient):
    include_usage: bool = False


class _GenerationRequest(_Lenient):
    model: str
    max_tokens: int | None = Field(default=None, ge=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(default=1, ge=1, le=1)  # one choice per request (what load generators send)
    ignore_eos: bool = False  # vLLM's extra; a simulated reply with max_tokens never stops early anyway


class CompletionRequest(_GenerationRequest):
    prompt: str | list[int] | list[str] | list[list[int]]


class ChatMessage(_Lenient):
    role: str
    # Parts as vLLM takes them: a bare string, or a part whose shape the front door has
    # checked (deployments/ingress/request_body.py); only text parts count as tokens.
    content: str | list[Any] | None = None


def _part_text(part: Any) -> str:
    if isinstance(part, str):
        return part
    text = part.get("text") if isinstance(part, dict) and part.get("type") == "text" else None
    return text if isinstance(text, str) else ""


class ChatRequest(_GenerationRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)


@dataclass(frozen=True)
class GenerationPlan:
    prompt_tokens: int
    output_tokens: int
    finish_reason: Literal["length", "stop"]


@dataclass(frozen=True)
class Rejection:
    """A request the engine cannot serve; answered as a 400 naming `param`."""

    message: str
    param: str


def estimate_tokens(text: str) -> int:
    return max(1, len(text.encode()) // BYTES_PER_TOKEN)


def natural_reply_tokens(prompt_key: str) -> int:
    return 16 + zlib.crc32(prompt_key.encode()) % 241


def completion_prompt(req: CompletionRequest) -> tuple[str, int] | Rejection:
    """(text that keys the natural reply length, prompt tokens)."""
    prompt = req.prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        if len(prompt) != 1:
            return Rejection(f"the simulated engine serves one prompt per request, got {len(prompt)}", "prompt")
        prompt = prompt[0]
    if isinstance(prompt, str):
        return prompt, estimate_tokens(prompt)
    if not prompt:
        return Rejection("prompt must not be empty", "prompt")
    return " ".join(map(str, prompt)), len(prompt)


def chat_prompt(req: ChatRequest) -> tuple[str, int]:
    parts = []
    for m in req.messages:
        text = m.content if isinstance(m.content, str) else "".join(map(_part_text, m.content or ()))
        parts.append(f"<|{m.role}|>\n{text}\n")
    rendered = "".join(parts) + "<|assistant|>\n"
    return rendered, estimate_tokens(rendered)


def plan_generation(prompt_key: str, prompt_tokens: int, max_tokens: int | None,
                    max_model_len: int) -> GenerationPlan | Rejection:
    room = max_model_len - prompt_tokens
    if max_tokens is not None:
        if max_tokens > room:
            return Rejection(
                f"'max_tokens' is too large: {max_tokens}. This model's maximum context length is "
                f"{max_model_len} tokens and your request has {prompt_tokens} input tokens "
                f"({max_tokens} > {max_model_len} - {prompt_tokens}).", "max_tokens")
        return GenerationPlan(prompt_tokens, max_tokens, "length")
    if room < 1:
        return Rejection(
            f"This model's maximum context length is {max_model_len} tokens. However, your prompt has "
            f"{prompt_tokens} tokens, which leaves no room for a reply. Please reduce the length of "
            "the input prompt.", "prompt")
    natural = natural_reply_tokens(prompt_key)
    return GenerationPlan(prompt_tokens, min(natural, room), "stop" if natural <= room else "length")


def token_text(i: int) -> str:
    word = FILLER_WORDS[i % len(FILLER_WORDS)]
    return word if i == 0 else " " + word


def filler_text(n: int) -> str:
    return "".join(token_text(i) for i in range(n))


def usage(plan: GenerationPlan, completion_tokens: int) -> dict:
    return {"prompt_tokens": plan.prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": plan.prompt_tokens + completion_tokens}


def error_body(status: int, message: str, param: str | None) -> dict:
    # vLLM's shape (type named after the HTTP error, code the status), so clients and tests see
    # the same errors from both engines.
    err_type = {400: "BadRequestError", 404: "NotFoundError", 503: "ServiceUnavailableError"}.get(status, "Error")
    return {"error": {"message": message, "type": err_type, "param": param, "code": status}}
