"""A model on the Hugging Face Hub, through `huggingface_hub`.

The manifest comes from the repo's file metadata at one commit (a branch name is resolved to
its commit first, so the manifest and the files agree): LFS files carry a sha256, small files
only their git blob id, which is checked as git computes it. Offline-safe: with HF_HUB_OFFLINE
set, or no route to the Hub, `manifest()` raises SourceUnavailable at once or after
`SourceOptions.timeout_s` per try, never waits forever; a warm cache still serves the model
(weights/resolve.py falls back to the entry this source filled last).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from hbmserve.weights.errors import ManifestError, SourceError, SourceUnavailable, WeightCacheError
from hbmserve.weights.fs import Sink
from hbmserve.weights.manifest import FileEntry, Manifest, make_manifest
from hbmserve.weights.sources import Progress, SourceOptions, Transient, with_retries


def parse_hub_id(text: str) -> tuple[str, str | None]:
    """"org/name" or "org/name@revision" -> (repo id, revision or None)."""
    repo, _, revision = text.partition("@")
    parts = repo.split("/")
    if len(parts) != 2 or not all(parts) or (_ and not revision):
        raise SourceError(f"{text!r} is not a Hub model id (org/name or org/name@revision) nor a path or URL")
    return repo, revision or None


def manifest_from_siblings(siblings: Iterable[Any], where: str) -> Manifest:
    """The Hub's file list (`RepoSibling`s, fetched with files_metadata) as a manifest."""
    files = []
    for s in siblings:
        if s.size is None:
            raise ManifestError(f"{where}: the Hub gave no size for {s.rfilename} (files_metadata not requested?)")
        if s.lfs is not None:
            files.append(FileEntry(s.rfilename, s.size, f"sha256:{s.lfs.sha256}"))
        elif s.blob_id:
            files.append(FileEntry(s.rfilename, s.size, f"git-sha1:{s.blob_id}"))
        else:
            raise ManifestError(f"{where}: the Hub gave no digest for {s.rfilename}")
    return make_manifest(files)


@dataclass
class HubSource:
    repo: str
    revision: str | None = None
    opts: SourceOptions = SourceOptions()
    endpoint: str | None = None  # None: huggingface_hub's (HF_ENDPOINT or huggingface.co)
    # The commit the last manifest() resolved `revision` to: a branch that moves between
    # manifest() and fetch() must not mix two commits' files.
    commit: str | None = field(default=None, init=False)

    @property
    def uri(self) -> str:
        return self.repo + (f"@{self.revision}" if self.revision else "")

    def _classify(self, e: Exception) -> tuple[Exception, bool]:
        """The error to raise for `e`, and whether another try may help."""
        from huggingface_hub import constants
        from huggingface_hub.errors import (GatedRepoError, HfHubHTTPError, OfflineModeIsEnabled,
                                            RepositoryNotFoundError, RevisionNotFoundError)

        where = self.endpoint or constants.ENDPOINT
        if isinstance(e, OfflineModeIsEnabled):  # retrying cannot help: final at once
            return SourceUnavailable(f"{self.uri}: HF_HUB_OFFLINE is set, so the Hub at {where} is not contacted; "
                                     "prefetch the model where the network is (`hbmserve cache prefetch`) "
                                     "or serve it from a local directory"), False
        if isinstance(e, (RepositoryNotFoundError, GatedRepoError, RevisionNotFoundError)):
            return SourceError(f"{self.uri}: {type(e).__name__} from the Hub at {where} "
                               f"({str(e).splitlines()[0]})"), False
        if isinstance(e, HfHubHTTPError):
            status = getattr(e.response, "status_code", 0) or 0
            return (SourceError(f"{self.uri}: the Hub at {where} answered {str(e).splitlines()[0]}"
                                + (f" after {self.opts.attempts} tries" if status >= 500 else "")),
                    status >= 500 or status == 429)
        # huggingface_hub raises its HTTP client's own exception types for a missing route or DNS
        return SourceUnavailable(f"{self.uri}: cannot reach the Hugging Face Hub at {where} "
                                 f"after {self.opts.attempts} tries ({type(e).__name__}: {e})"), True

    def _call(self, fn: Any) -> Any:
        got: list[Any] = []

        def attempt() -> None:
            try:
                got.append(fn())
            except WeightCacheError:
                raise  # a full disk or a bad digest while adopting: not the Hub's doing
            except Exception as e:  # sorted by _classify: unreachable and 5xx are worth another try
                err, transient = self._classify(e)
                raise (Transient(err) if transient else err) from e

        with_retries(self.opts, attempt)
        return got[0]

    def manifest(self) -> Manifest:
        from huggingface_hub import HfApi

        api = HfApi(endpoint=self.endpoint)
        info = self._call(lambda: api.model_info(self.repo, revision=self.revision, files_metadata=True,
                                                 timeout=self.opts.timeout_s))
        self.commit = info.sha
        return manifest_from_siblings(info.siblings or [], f"{self.uri} on the Hub")

    def fetch(self, entry: FileEntry, sink: Sink, progress: Progress) -> None:
        from huggingface_hub import hf_hub_download

        staging = sink.path.parent / f".hub-staging-{sink.path.name}"
        revision = self.commit or self.revision
        try:
            path = self._call(lambda: hf_hub_download(
                self.repo, entry.path, revision=revision, local_dir=staging, endpoint=self.endpoint,
                etag_timeout=self.opts.timeout_s))
            sink.adopt(type(sink.path)(path))
            progress(sink.size)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
