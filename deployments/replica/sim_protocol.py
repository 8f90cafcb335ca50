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

Token ids, for `return_token_ids` and for a stream the front door resumes elsewhere
(deployments/ingress/migration.py): a text prompt's ids are its bytes read as little-endian
uint32, four bytes an id; the reply's token at position i has id `OUTPUT_ID_BASE + i`. So a
prompt that ends in the ids `OUTPUT_ID_BASE + 0 .. + k-1` continues a reply at position k: the
same words, and the same natural length, as the reply that broke.
"""

from __future__ import annotations

import zlib
from array import array
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

FILLER_WORDS = ("the", "model", "and", "its", "cache", "live", "in", "memory", "which", "is", "small",
                "expensive", "and", "slow", "to", "fill")
BYTES_PER_TOKEN = 4
OUTPUT_ID_BASE = 1 << 32  # above every prompt id (a uint32)


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
    return_token_ids: bool = False  # vLLM's extra: prompt ids in the first chunk, each token's id
    # vLLM's KV connector hand-off (disaggregated serving): do_remote_decode asks a prefill replica
    # to keep the prompt's KV; do_remote_prefill tells a decode replica it is coming.
    kv_transfer_params: dict[str, Any] | None = None


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
class PromptView:
    """What the simulated engine reads of a prompt: the bytes that key its natural reply length,
    its token count and ids, and where in a reply it resumes (0: a new reply)."""

    key: bytes
    tokens: int
    given_ids: tuple[int, ...] | None = None  # None: a text prompt, whose ids are its key's bytes
    resume_at: int = 0

    def ids(self) -> list[int]:
        return list(self.given_ids) if self.given_ids is not None else array("I", self.key).tolist()


@dataclass(frozen=True)
class GenerationPlan:
    prompt_tokens: int
    output_tokens: int
    finish_reason: Literal["length", "stop"]
    first_position: int = 0  # the reply's position of the first token generated (a resumed reply)


@dataclass(frozen=True)
class Rejection:
    """A request the engine cannot serve; answered as a 400 naming `param`."""

    message: str
    param: str


def estimate_tokens(text: str) -> int:
    return max(1, len(text.encode()) // BYTES_PER_TOKEN)


def natural_reply_tokens(prompt_key: bytes) -> int:
    return 16 + zlib.crc32(prompt_key) % 241


def text_prompt(text: str) -> PromptView:
    n = estimate_tokens(text)
    key = text.encode()[:n * BYTES_PER_TOKEN].ljust(n * BYTES_PER_TOKEN, b"\0")
    return PromptView(key, n)


def ids_prompt(ids: list[int]) -> PromptView:
    """A prompt given as token ids; a tail of this engine's output ids (0, 1, .. k-1 above
    OUTPUT_ID_BASE) resumes that reply at position k."""
    k = 0
    while k < len(ids) and ids[len(ids) - 1 - k] >= OUTPUT_ID_BASE:
        k += 1
    if k and ids[len(ids) - k:] != [OUTPUT_ID_BASE + i for i in range(k)]:
        k = 0  # not a tail this engine wrote: an ordinary prompt
    head = ids[:len(ids) - k]
    try:
        key = array("I", head).tobytes()
    except OverflowError:  # an id no text prompt has: keyed by its digits
        key = " ".join(map(str, head)).encode()
    return PromptView(key, len(ids), tuple(ids), resume_at=k)


def completion_prompt(req: CompletionRequest) -> PromptView | Rejection:
    prompt = req.prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        if len(prompt) != 1:
            return Rejection(f"the simulated engine serves one prompt per request, got {len(prompt)}", "prompt")
        prompt = prompt[0]
    if isinstance(prompt, str):
        return text_prompt(prompt)
    if not prompt:
        return Rejection("prompt must not be empty", "prompt")
    return ids_prompt(prompt)


def chat_prompt(req: ChatRequest) -> PromptView:
    parts = []
    for m in req.messages:
        text = m.content if isinstance(m.content, str) else "".join(map(_part_text, m.content or ()))
        parts.append(f"<|{m.role}|>\n{text}\n")
    return text_prompt("".join(parts) + "<|assistant|>\n")


def plan_generation(prompt: PromptView, max_tokens: int | None, max_model_len: int) -> GenerationPlan | Rejection:
    prompt_tokens, start = prompt.tokens, prompt.resume_at
    room = max_model_len - prompt_tokens
    if max_tokens is not None:
        if max_tokens > room:
            return Rejection(
                f"'max_tokens' is too large: {max_tokens}. This model's maximum context length is "
                f"{max_model_len} tokens and your request has {prompt_tokens} input tokens "
                f"({max_tokens} > {max_model_len} - {prompt_tokens}).", "max_tokens")
        return GenerationPlan(prompt_tokens, max_tokens, "length", start)
    if room < 1:
        return Rejection(
            f"This model's maximum context length is {max_model_len} tokens. However, your prompt has "
            f"{prompt_tokens} tokens, which leaves no room for a reply. Please reduce the length of "
            "the input prompt.", "prompt")
    natural = max(1, natural_reply_tokens(prompt.key) - start)  # what is left of the reply
    return GenerationPlan(prompt_tokens, min(natural, room), "stop" if natural <= room else "length", start)


def token_text(i: int) -> str:
    word = FILLER_WORDS[i % len(FILLER_WORDS)]
    return word if i == 0 else " " + word


def filler_text(n: int, start: int = 0) -> str:
    return "".join(token_text(i) for i in range(start, start + n))


def usage(plan: GenerationPlan, completion_tokens: int) -> dict:
    return {"prompt_tokens": plan.prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": plan.prompt_tokens + completion_tokens}


def error_body(status: int, message: str, param: str | None) -> dict:
    # vLLM's shape (type named after the HTTP error, code the status), so clients and tests see
    # the same errors from both engines.
    err_type = {400: "BadRequestError", 404: "NotFoundError", 503: "ServiceUnavailableError"}.get(status, "Error")
    return {"error": {"message": message, "type": err_type, "param": param, "code": status}}
