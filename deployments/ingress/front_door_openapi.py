"""What the front door says of its own surface: the OpenAPI document, served at `/openapi.json`
(admin token), and the model cards of `/v1/models`.

It describes what the front door itself checks (auth, the JSON body, `model`, and the fields it
charges and admits by, in every form vLLM reads them) and what every engine accepts; anything else in a body is passed on to the
replica, which has the last word (vLLM answers 400 for what it refuses). Schemathesis fuzzes the
live front door against this document (tests/integration/test_front_door.py).
"""

from __future__ import annotations

from hbmserve.core.config import ClusterSpec

_ERROR = {"type": "object", "required": ["error"], "properties": {"error": {
    "type": "object", "required": ["message", "type"],
    "properties": {"message": {"type": "string"}, "type": {"type": "string"},
                   "param": {"type": "string", "nullable": True}, "code": {}}}}}


def _errors(*statuses: int) -> dict:
    return {str(s): {"description": "an OpenAI-style error",
                     "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
            for s in statuses}


def openapi_document(spec: ClusterSpec) -> dict:
    names = [m.name for m in spec.models]
    longest = max(m.engine_settings.max_model_len for m in spec.models)
    # The shapes the door reads as vLLM does (deployments/ingress/request_body.py), every form each may take,
    # so that schemathesis sends them and their wrong-typed mutants: the door answers 400 naming
    # the field, the engine judges the rest, and nothing is a 5xx.
    tokens = {"type": "integer", "minimum": 1, "maximum": longest}
    token_ids = {"type": "array", "maxItems": 64, "items": {"type": "integer", "minimum": 0, "maximum": 100}}
    text = {"type": "string", "maxLength": 2000}
    prompt = {"oneOf": [text, {"type": "array", "minItems": 1, "maxItems": 4, "items": text}, token_ids,
                        {"type": "array", "minItems": 1, "maxItems": 4, "items": token_ids}]}
    common = {
        "model": {"type": "string", "enum": names},
        "max_tokens": tokens,
        "n": {"type": "integer", "minimum": 1, "maximum": 4},
        "stream": {"type": "boolean"},
        "stream_options": {"type": "object", "additionalProperties": False,
                           "properties": {"include_usage": {"type": "boolean"},
                                          "continuous_usage_stats": {"type": "boolean"}}},
        "temperature": {"type": "number", "minimum": 0, "maximum": 2},
        "top_p": {"type": "number", "minimum": 0.01, "maximum": 1},
    }
    part = {"type": "object", "required": ["type", "text"], "additionalProperties": False,
            "properties": {"type": {"type": "string", "enum": ["text"]}, "text": text}}
    message = {"type": "object", "required": ["role", "content"], "additionalProperties": False,
               "properties": {"role": {"type": "string", "enum": ["system", "user", "assistant"]},
                              "content": {"oneOf": [text, {"type": "array", "maxItems": 4, "items": part}]}}}
    chat = {"type": "object", "required": ["model", "messages"], "additionalProperties": False,
            "properties": {**common, "max_completion_tokens": tokens,
                           "messages": {"type": "array", "minItems": 1, "maxItems": 8, "items": message}}}
    completion = {"type": "object", "required": ["model", "prompt"], "additionalProperties": False,
                  "properties": {**common, "prompt": prompt}}
    embedding = {"type": "object", "required": ["model", "input"], "additionalProperties": False,
                 "properties": {"model": common["model"], "input": prompt}}
    ok = {"description": "the engine's reply (JSON, or server-sent events when stream is true)"}

    def post(schema: dict, summary: str) -> dict:
        return {"post": {"summary": summary, "security": [{"bearer": []}],
                         "requestBody": {"required": True, "content": {"application/json": {"schema": schema}}},
                         "responses": {"200": ok, **_errors(400, 401, 404, 413, 429, 503)}}}

    return {
        "openapi": "3.0.3",
        "info": {"title": f"hbmserve front door ({spec.name})", "version": "1"},
        "components": {"schemas": {"Error": _ERROR},
                       "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
        "paths": {
            "/health": {"get": {"summary": "liveness", "responses": {"200": {"description": "serving"}}}},
            "/v1/models": {"get": {"summary": "every model of the cluster", "security": [{"bearer": []}],
                                   "responses": {"200": {"description": "a list of models"}, **_errors(401)}}},
            "/v1/models/{model}": {"get": {
                "summary": "one model", "security": [{"bearer": []}],
                "parameters": [{"name": "model", "in": "path", "required": True, "schema": {"type": "string"}}],
                "responses": {"200": {"description": "the model"}, **_errors(401, 404)}}},
            "/v1/chat/completions": post(chat, "chat completion"),
            "/v1/completions": post(completion, "text completion"),
            "/v1/embeddings": post(embedding, "embeddings (an embedding model's)"),
            "/invocations": post({"oneOf": [chat, completion]}, "a chat or text completion (SageMaker's path)"),
        },
    }


def _card(model, adapter=None) -> dict:
    """A model's card; an adapter names its base model as `parent`, as vLLM lists it."""
    name = model.name if adapter is None else adapter.name
    return {"id": name, "object": "model", "created": 0, "owned_by": "hbmserve", "root": name,
            "parent": None if adapter is None else model.name, "max_model_len": model.engine_settings.max_model_len}


def model_list(spec: ClusterSpec) -> dict:
    """`GET /v1/models`: every model, each followed by its adapters."""
    return {"object": "list", "data": [c for m in spec.models for c in (_card(m), *(_card(m, a) for a in m.adapters))]}


def model_card(spec: ClusterSpec, name: str) -> dict | None:
    """`GET /v1/models/{name}`: a model's or an adapter's card; None: no such name is served."""
    served = spec.served(name)
    return None if served is None else _card(*served)
