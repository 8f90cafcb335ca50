"""Why a fill failed, one class per cause, so a caller (and an operator reading the message) can
tell a missing model from a flaky network from a full disk. Every message names the file or URL."""

from __future__ import annotations


class WeightCacheError(Exception):
    """Base class; the message is meant for the operator as-is."""


class ManifestError(WeightCacheError):
    """A manifest that cannot be used (bad JSON, a path escaping the entry, no digest)."""


class SourceError(WeightCacheError):
    """The source answered but cannot give the model: 404, 403, 5xx after every retry, no such
    directory, a library that is not installed."""


class SourceUnavailable(SourceError):
    """The source cannot be reached at all (no network, offline mode, connection refused)."""


class TruncatedDownload(WeightCacheError):
    """A file ended before its manifest size, after every retry."""


class ChecksumMismatch(WeightCacheError):
    """A file's bytes do not hash to its manifest digest."""


class DiskFull(WeightCacheError):
    """The disk ran out (ENOSPC) or would go below the configured free space."""


class CacheFull(WeightCacheError):
    """The model does not fit under the cache's size cap even after evicting every entry that is
    neither in use nor pinned."""


class EntryBusy(WeightCacheError):
    """An eviction asked for an entry a running replica uses (or one pinned, without --force)."""
