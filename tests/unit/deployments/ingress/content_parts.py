"""Chat content parts as an attacker sends them, for the door's reader and the door itself:
every shape the door reads (text, image_url, input_audio, refusal, other types, vLLM's bare
string), each field right, missing or of a wrong type, and things that are no part at all;
with `well_formed`, derived from OpenAI's types, saying which the door must accept."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

# Values a JSON client can send: no NaN or infinity, no lone surrogates (not UTF-8).
_CHARS = st.characters(exclude_categories=["Cs"])
JUNK = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False, allow_infinity=False),
                 st.text(_CHARS, max_size=6),
                 st.lists(st.integers(), max_size=2), st.dictionaries(st.text(_CHARS, max_size=3), st.integers(), max_size=2))
TEXT = st.text(_CHARS, max_size=16)


def _maybe(good: st.SearchStrategy) -> st.SearchStrategy:
    return st.one_of(good, JUNK)


def _part(kind: str, fields: dict[str, st.SearchStrategy]) -> st.SearchStrategy:
    # Each field may be missing: the fields are optional in the strategy, required by the check.
    return st.fixed_dictionaries({"type": st.just(kind)}, optional=fields)


PARTS = st.one_of(
    TEXT,
    _part("text", {"text": _maybe(TEXT)}),
    _part("refusal", {"refusal": _maybe(TEXT)}),
    _part("image_url", {"image_url": _maybe(st.fixed_dictionaries(
        {}, optional={"url": _maybe(TEXT), "detail": _maybe(st.sampled_from(["auto", "low", "high"]))}))}),
    _part("input_audio", {"input_audio": _maybe(st.fixed_dictionaries(
        {}, optional={"data": _maybe(TEXT), "format": _maybe(st.sampled_from(["wav", "mp3"]))}))}),
    st.fixed_dictionaries({}, optional={"type": _maybe(st.sampled_from(["video_url", "file", "weird"])),
                                        "text": JUNK, "video_url": JUNK}),
    JUNK,
)


def _str(d: dict, key: str, optional: bool = False) -> bool:
    return isinstance(d.get(key), str) or (optional and d.get(key) is None)


def well_formed(part: Any) -> bool:
    if isinstance(part, str):
        return True
    if not isinstance(part, dict):
        return False
    kind = part.get("type")
    if kind in ("text", "refusal"):
        return _str(part, kind)
    if kind == "image_url":
        url = part.get("image_url")
        return isinstance(url, dict) and _str(url, "url") and _str(url, "detail", optional=True)
    if kind == "input_audio":
        audio = part.get("input_audio")
        return isinstance(audio, dict) and _str(audio, "data") and _str(audio, "format")
    return kind is None or isinstance(kind, str)
