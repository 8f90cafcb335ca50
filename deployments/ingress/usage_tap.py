"""What the engine spent on a request, read from its reply on the way through the front door, so
that a tenant's token bucket is settled with the engine's own count (access/limits.py `settle`).

vLLM reports `usage` (prompt and completion tokens, every choice and prompt included) at the end
of every non-streamed reply, and in a streamed one only when the client asked with
`stream_options.include_usage`. So the door asks for it on every streamed request
(`with_usage_asked`) and, when the client had not, takes the usage chunk out of the stream again
(`UsageTap`): the client gets the stream it asked for. (`--enable-force-include-usage` would ask
at the engine, but it also turns on usage in every chunk, which the door would have to strip
from each.) A key the door inserts at the front of the JSON object costs no re-encoding; when
the client sent stream options of its own, the body is re-encoded with include_usage added.

Without a usage (the client left, the stream broke), `UsageTap.spent` falls back to the prompt
and one token per streamed event; an error reply ran nothing and costs nothing.
"""

from __future__ import annotations

import json
import re
from collections import deque
from dataclasses import dataclass
from typing import Any

from hbmserve.deployments.ingress.request_body import Generation

_USAGE = b'"usage":'  # a key: inside a JSON string the quotes would be escaped
_COUNT = re.compile(rb'"(prompt_tokens|completion_tokens)":\s*(\d+)')
_EVENT_END = b"\n\n"
_TAIL_BYTES = 4096  # a usage object is a few hundred bytes at the end of the reply


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int

    @property
    def total(self) -> int:
        return self.prompt_tokens + self.completion_tokens


def with_usage_asked(raw: bytes, body: dict[str, Any], gen: Generation) -> bytes:
    """The body to send the engine: a streamed request asks for the usage chunk."""
    if not gen.stream or gen.stream_usage:
        return raw
    if "stream_options" in body:  # the client's options kept; usage in every chunk not asked for
        options = body["stream_options"] if isinstance(body["stream_options"], dict) else {}
        return json.dumps({**body, "stream_options": {**options, "include_usage": True,
                                                      "continuous_usage_stats": False}}).encode()
    start = raw.index(b"{") + 1  # the body parsed as a JSON object, so it has one
    return raw[:start] + b'"stream_options":{"include_usage":true},' + raw[start:]


def whole_events(held: bytes, chunk: bytes) -> tuple[bytes, bytes]:
    """(the whole server-sent events of `held` + `chunk`, the unfinished event after them)."""
    if not held and chunk.endswith(_EVENT_END):  # the usual piece: whole events, nothing held
        return chunk, b""
    data = held + chunk
    end = data.rfind(_EVENT_END)
    end = 0 if end < 0 else end + len(_EVENT_END)
    return data[:end], data[end:]


def _usage_in(text: bytes) -> Usage | None:
    at = text.rfind(_USAGE)
    if at < 0:
        return None
    counts = dict(_COUNT.findall(text[at:]))
    try:
        return Usage(int(counts[b"prompt_tokens"]), int(counts[b"completion_tokens"]))
    except KeyError:
        return None


class UsageTap:
    """Sits on one reply's body chunks (`feed` returns what to pass on); `strip` takes the usage
    chunk out of a stream whose client did not ask for it."""

    def __init__(self, strip: bool):
        self.strip = strip
        self.forwarded = False  # sent to a replica (the front door sets it)
        self.status: int | None = None  # None: no reply reached the client
        self.streamed = False
        self.usage: Usage | None = None
        self.events = 0  # streamed data events passed on: about one token each
        self._recent: deque[bytes] = deque()  # the reply's last chunks, _TAIL_BYTES or a little more
        self._recent_bytes = 0
        self._held = b""  # while stripping: an event not yet complete

    def begin(self, status: int, streamed: bool) -> None:
        self.status, self.streamed = status, streamed

    def _remember(self, chunk: bytes) -> None:
        self._recent.append(chunk)
        self._recent_bytes += len(chunk)
        while self._recent_bytes - len(self._recent[0]) >= _TAIL_BYTES:
            self._recent_bytes -= len(self._recent.popleft())

    def feed(self, chunk: bytes) -> bytes:
        if not self.streamed:
            self._remember(chunk)
            return chunk
        if not self.strip:
            self._remember(chunk)
            self.events += chunk.count(b"data: ")
            return chunk
        data, self._held = whole_events(self._held, chunk)  # a usage key may straddle two chunks
        if _USAGE in data:
            events = data.split(_EVENT_END)
            for event in events:
                if _USAGE in event:
                    self.usage = _usage_in(event)
            data = _EVENT_END.join(e for e in events if _USAGE not in e)
        self.events += data.count(b"data: ")
        return data

    def finish(self) -> bytes:
        """The bytes still held, and the usage read from the reply's end."""
        held, self._held = self._held, b""
        if self.usage is None:
            self.usage = _usage_in(b"".join(self._recent) + held)
        return held

    def spent(self, charged: int, prompt_tokens: int) -> int:
        """Tokens the request cost: the engine's usage; else nothing when it never reached a
        replica or got an error reply, the prompt when no reply came, and prompt and streamed
        events (or the charge, not streamed) when the reply ended without a usage."""
        if self.usage is not None:
            return self.usage.total
        if not self.forwarded:
            return 0
        if self.status is None:
            return prompt_tokens
        if self.status >= 400:
            return 0
        if self.streamed:
            return prompt_tokens + max(0, self.events - 1)  # the last event is [DONE]
        return charged
