"""Mid-stream migration: a stream whose replica dies goes on from another replica, as one reply.

On a stream it can resume, the front door asks the engine for token ids (vLLM's
`return_token_ids`), and a `StreamLedger` sits on the events on their way to the client: it
passes on whole events only, notes the prompt's token ids and each token id the client has been
sent, and strips the ids the client did not ask for. When the stream breaks before its finish
(the connection drops, or the engine sends an error event), `continuation_body` asks another
replica on /v1/completions for the rest: the prompt's ids and the ids already sent, as token ids
(so no re-tokenization can shift a token), the same sampling parameters and seed, and
max_tokens less what was sent. `StreamLedger.feed_continued` re-frames that reply into the
client's stream (the same id, created and object; chat deltas for a chat) and counts its usage
once, against the original prompt.

Resumable: a stream of one choice of one prompt whose every field is in `_PROMPT_KEYS`,
`_SAMPLING_KEYS` or `_PLAIN_KEYS`, with text-only chat messages. Tools, structured output,
logprobs, images and fields this module does not know keep their state in the engine, which
a continuation would not have: such a stream ends with an SSE error event, as before.

Exact for greedy decoding. What does not carry over (README, "How a request flows"):
a seeded sampled run continues with the same seed but not the same random draws; presence and
frequency penalties see the tokens sent before the break as prompt; a stop string that
straddles the break is not matched.
"""

from __future__ import annotations

import json
import re
from typing import Any

from hbmserve.deployments.ingress.request_body import Generation
from hbmserve.deployments.ingress.usage_tap import whole_events

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
_PROMPT_KEYS = frozenset({"messages", "prompt", "chat_template", "chat_template_kwargs", "add_generation_prompt",
                          "continue_final_message"})  # shape the prompt, which the ids carry over
_SAMPLING_KEYS = frozenset({"temperature", "top_p", "top_k", "min_p", "seed", "stop", "stop_token_ids",
                            "ignore_eos", "presence_penalty", "frequency_penalty", "repetition_penalty",
                            "logit_bias", "bad_words", "allowed_token_ids", "skip_special_tokens",
                            "spaces_between_special_tokens", "include_stop_str_in_output", "priority", "user",
                            "cache_salt"})  # copied to the continuation as they are
_PLAIN_KEYS = frozenset({"model", "stream", "stream_options", "n", "max_tokens", "max_completion_tokens",
                         "min_tokens", "return_token_ids", "logprobs", "echo"})

_EVENT_END = b"\n\n"
_IDS = re.compile(rb'"token_ids":\[([0-9,]*)\]')  # exact: in `"prompt_token_ids"` no quote precedes `token_ids`
_PROMPT_IDS = re.compile(rb'"prompt_token_ids":\[([0-9,]*)\]')
_FINISHED = b'"finish_reason":"'  # a finish reason that is not null
_ID_FIELDS = re.compile(rb',"(?:prompt_token_ids|token_ids)":(?:null|\[[0-9,]*\])|,"prompt_text":null')
_ERROR_EVENT = b'data: {"error"'
_USAGE = b'"usage":{'


def resumable(path: str, body: dict[str, Any], gen: Generation) -> bool:
    """Whether a broken stream of this request can go on from another replica."""
    if path not in (CHAT, COMPLETIONS) or not gen.stream or gen.sequences != 1:
        return False
    if any(k not in _PROMPT_KEYS and k not in _SAMPLING_KEYS and k not in _PLAIN_KEYS for k in body):
        return False
    options = body.get("stream_options")
    if body.get("logprobs") or body.get("echo") or (isinstance(options, dict) and options.get("continuous_usage_stats")):
        return False
    if path == COMPLETIONS:
        prompt = body.get("prompt")
        return isinstance(prompt, str) or (isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str))
    return all(isinstance(m, dict) and _text_only(m.get("content")) for m in body.get("messages", ()))


def _text_only(content: Any) -> bool:
    return content is None or isinstance(content, str) or (
        isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in content))


def with_token_ids(raw: bytes) -> bytes:
    """The body to send the engine: it asks for token ids (a key inserted at the front of the
    object, so nothing is re-encoded; a key the client sent itself comes later and wins)."""
    start = raw.index(b"{") + 1
    return raw[:start] + b'"return_token_ids":true,' + raw[start:]


def _ints(group: bytes) -> list[int]:
    return [int(x) for x in group.split(b",")] if group else []


class StreamLedger:
    """One resumable stream's account of what its client has been sent."""

    def __init__(self, path: str, body: dict[str, Any]):
        self.chat = path == CHAT
        self.body = body
        self.keep_ids = body.get("return_token_ids") is True  # the client asked for them itself
        self._prompt_ids: bytes | None = None  # as the first event spelt them (parsed on a break)
        self._sent: list[int] = []  # token ids passed on to the client, as far as parsed
        self._sent_unparsed: list[bytes] = []  # the rest, as the events spelt them (parsed on a break)
        self.finished = False  # a finish reason has been passed on: nothing is left to generate
        self.failed = False  # the engine sent an error event (held back, not passed on)
        self.usage_sent = False
        self.migrations = 0
        self._envelope: dict[str, Any] | None = None  # id, object, created, model of the first event
        self._held = b""

    @property
    def prompt_ids(self) -> list[int] | None:
        """The prompt's token ids, as the engine reported them; None before its first event."""
        return None if self._prompt_ids is None else _ints(self._prompt_ids)

    @property
    def sent(self) -> list[int]:
        """The token ids passed on to the client."""
        if self._sent_unparsed:
            self._sent += _ints(b",".join(g for g in self._sent_unparsed if g))
            self._sent_unparsed.clear()
        return self._sent

    @property
    def can_resume(self) -> bool:
        return not self.finished and self._prompt_ids is not None and self._envelope is not None

    def _whole_events(self, chunk: bytes) -> bytes:
        data, self._held = whole_events(self._held, chunk)
        if _ERROR_EVENT in data:  # what came before the error goes on; the error and after, not
            data = data[:data.index(_ERROR_EVENT)]
            self.failed, self._held = True, b""
        return data

    def feed(self, chunk: bytes) -> bytes:
        """The original reply's chunk -> the whole events to pass on, the ids noted."""
        if self.failed:
            return b""
        data = self._whole_events(chunk)
        if not data:
            return data
        if self._envelope is None:
            first = json.loads(data[data.index(b"{"):data.index(_EVENT_END)])
            self._envelope = {k: first.get(k) for k in ("id", "object", "created", "model")}
        if self._prompt_ids is None and (m := _PROMPT_IDS.search(data)):
            self._prompt_ids = m.group(1)
        self._sent_unparsed += _IDS.findall(data)
        self.finished = self.finished or _FINISHED in data
        self.usage_sent = self.usage_sent or _USAGE in data
        return data if self.keep_ids else _ID_FIELDS.sub(b"", data)

    def closing(self) -> bytes:
        """The end of a stream that broke after its finish: the usage (the tap drops it when the
        client did not ask), then [DONE]."""
        usage = b"" if self.usage_sent else (
            b"data: " + json.dumps(self._reframe({"usage": {}}), separators=(",", ":")).encode() + _EVENT_END)
        return usage + b"data: [DONE]" + _EVENT_END

    def continuation_body(self) -> bytes:
        """The /v1/completions request for the rest of the reply; what the broken reply left
        half-sent, or its error, is dropped."""
        self.failed, self._held = False, b""
        body = self.body
        out: dict[str, Any] = {"model": body["model"], "prompt": (self.prompt_ids or []) + self.sent, "stream": True,
                               "return_token_ids": True, "stream_options": {"include_usage": True}}
        out |= {k: body[k] for k in _SAMPLING_KEYS if k in body}
        most = body.get("max_completion_tokens") or body.get("max_tokens")
        if most is not None:  # unset: the engine's default, the rest of the context, as before
            out["max_tokens"] = max(1, most - len(self.sent))
        if body.get("min_tokens"):
            out["min_tokens"] = max(0, body["min_tokens"] - len(self.sent))
        return json.dumps(out, separators=(",", ":")).encode()

    def feed_continued(self, chunk: bytes) -> bytes:
        """A continuation's chunk -> the same tokens as events of the client's stream."""
        if self.failed:
            return b""
        out = []
        for event in self._whole_events(chunk).split(_EVENT_END):
            if not event.startswith(b"data: {"):
                if event:
                    out.append(event + _EVENT_END)  # [DONE]
                continue
            out.append(b"data: " + json.dumps(self._reframe(json.loads(event[6:])), separators=(",", ":")).encode()
                       + _EVENT_END)
        return b"".join(out)

    def _reframe(self, event: dict[str, Any]) -> dict[str, Any]:
        env = self._envelope or {}
        framed: dict[str, Any] = dict(env)
        if event.get("usage") is not None:  # counted once: the client's prompt, every token sent
            prompt = len(self.prompt_ids or ())
            framed["choices"] = []
            framed["usage"] = {"prompt_tokens": prompt, "completion_tokens": len(self.sent),
                               "total_tokens": prompt + len(self.sent)}
            return framed
        choices = []
        for c in event.get("choices") or ():
            ids = c.get("token_ids") or []
            self.sent.extend(ids)
            self.finished = self.finished or c.get("finish_reason") is not None
            text = c.get("text") or ""
            if self.chat:
                choice = {"index": 0, "delta": {"content": text}, "logprobs": None,
                          "finish_reason": c.get("finish_reason")}
            else:
                choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": c.get("finish_reason"),
                          "stop_reason": c.get("stop_reason")}
            choices.append(choice | ({"token_ids": ids} if self.keep_ids else {}))
        framed["choices"] = choices
        return framed
