"""The `cache:` section of the cluster config: where each node keeps model weights, and how much.

Split from core/config.py (which stays the file that reads and reports the whole config). The
cache itself lives in hbmserve/weights; this is only what a user may set.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, field_validator

from hbmserve.core.engine_settings import Strict

GIB = 1024**3


class WeightCacheSpec(Strict):
    # Expanded on the node that uses it (`~` is that node's home), so it must not be relative:
    # a relative root would land wherever the replica's working directory happens to be.
    root: Annotated[str, Field(min_length=1)] = "~/.cache/hbmserve/weights"
    # The cap on what the cache holds; past it, least recently used entries that no replica
    # uses and the warm pool has not pinned are evicted.
    max_gib: Annotated[float, Field(gt=0)] = 200.0
    # Never fill the disk below this much free space, whatever the cap says (other writers, logs).
    min_free_gib: Annotated[float, Field(ge=0)] = 5.0

    @field_validator("root")
    @classmethod
    def _absolute_or_home(cls, v: str) -> str:
        if not v.startswith(("/", "~")):
            raise ValueError(f"must be an absolute path or start with ~ (got {v!r}): "
                             "it is resolved on every node, not against the config file")
        return v

    @property
    def max_bytes(self) -> int:
        return int(self.max_gib * GIB)

    @property
    def min_free_bytes(self) -> int:
        return int(self.min_free_gib * GIB)
