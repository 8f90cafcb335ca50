"""The wire between the front door (deployments/ingress/) and a replica (deployments/replica/): the internal token
header, the replica's private paths, the OpenAI error shape both answer with, and how a finished
reply's token counts are read. Both sides import this module; neither imports the other.
"""

from __future__ import annotations

import json

from hbmserve.core.routing import CHARS_PER_TOKEN

# The front door proves itself to a replica with the deployment's internal token in this header.
INTERNAL_TOKEN_HEADER = b"x-hbmserve-internal"
# The LoRA adapter a request runs with, named by the front door: the replica registers it in its
# engine first if it must (deployments/replica/replica_middleware.py AdapterRegistry).
ADAPTER_HEADER = b"x-hbmserve-adapter"
# A replica's load report (core.records.LoadReport), polled by every front door.
LOAD_PATH = "/hbm/load"


def request_lengths(last_body: bytes, request_bytes: int, chunks: int) -> tuple[int, int]:
    """(prompt, output) tokens of a finished request: the `usage` of its reply's last body chunk
    when it has one (every non-streamed vLLM reply; a streamed one asked for with
    stream_options.include_usage), else the request's size at CHARS_PER_TOKEN (the front door's
    estimate too) and one token per streamed chunk."""
    text = last_body.strip()
    if b'"usage"' in text:
        try:
            usage = json.loads(text.removeprefix(b"data:").strip())["usage"]
            return int(usage["prompt_tokens"]), int(usage["completion_tokens"])
        except (ValueError, KeyError, TypeError):
            pass
    return max(1, request_bytes // CHARS_PER_TOKEN), max(1, chunks)


def json_response(status: int, payload: dict, headers: list[tuple[bytes, bytes]] = ()):
    """The two ASGI messages of a whole JSON reply."""
    body = json.dumps(payload).encode()
    start = {
        "type": "http.response.start",
        "status": status,
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *headers],
    }
    return start, {"type": "http.response.body", "body": body}


def openai_error(status: int, message: str, err_type: str, code: str, headers: list[tuple[bytes, bytes]] = (),
                 param: str | None = None):
    """An OpenAI-style error reply: {"error": {"message", "type", "param", "code"}}."""
    return json_response(status, {"error": {"message": message, "type": err_type, "param": param, "code": code}},
                         headers)
