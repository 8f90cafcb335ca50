"""S3-compatible storage (AWS, MinIO, Ceph RGW...), used only where boto3 is installed; hbmserve
does not depend on it. Same contract as the HTTP source: `hbmserve-manifest.json` under the
prefix, ranged GETs that resume where a partial file ends, tenacity back-off between tries.
The endpoint comes from boto3's usual configuration (AWS_ENDPOINT_URL, profiles, ...).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hbmserve.weights.errors import SourceError, SourceUnavailable, TruncatedDownload, WeightCacheError
from hbmserve.weights.fs import Sink
from hbmserve.weights.manifest import MANIFEST_NAME, FileEntry, Manifest, parse_manifest
from hbmserve.weights.sources import Progress, SourceOptions, Transient, with_retries

_CHUNK = 4 * 1024 * 1024


@dataclass(frozen=True)
class S3Source:
    bucket: str
    prefix: str
    client: Any  # a boto3 S3 client (or anything with get_object)
    opts: SourceOptions = SourceOptions()

    @property
    def uri(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"

    def _key(self, path: str) -> str:
        return f"{self.prefix.rstrip('/')}/{path}" if self.prefix else path

    def _get(self, path: str, start: int) -> Any:
        where = f"s3://{self.bucket}/{self._key(path)}"
        try:
            kwargs = {"Range": f"bytes={start}-"} if start else {}
            return self.client.get_object(Bucket=self.bucket, Key=self._key(path), **kwargs)["Body"]
        except Exception as e:  # botocore's ClientError carries the status; anything else is the network
            status = getattr(e, "response", {}).get("ResponseMetadata", {}).get("HTTPStatusCode")
            if status is None:
                raise Transient(SourceUnavailable(f"cannot reach {where} after {self.opts.attempts} tries: {e}")) from e
            if status >= 500 or status == 429:
                raise Transient(SourceError(f"{where}: HTTP {status} after {self.opts.attempts} tries")) from e
            raise SourceError(f"{where}: HTTP {status} ({e})") from e

    def manifest(self) -> Manifest:
        got: list[bytes] = []
        with_retries(self.opts, lambda: got.append(self._get(MANIFEST_NAME, 0).read()))
        return parse_manifest(got[0], f"s3://{self.bucket}/{self._key(MANIFEST_NAME)}")

    def fetch(self, entry: FileEntry, sink: Sink, progress: Progress) -> None:
        def attempt() -> None:
            if sink.size >= entry.size:
                return
            body = self._get(entry.path, sink.size)
            try:
                while chunk := body.read(_CHUNK):
                    sink.write(chunk)
                    progress(len(chunk))
            except WeightCacheError:
                raise  # a full disk is not a flaky stream
            except Exception as e:  # botocore's IncompleteReadError/ResponseStreamingError, urllib3's errors
                raise Transient(TruncatedDownload(f"{self.uri}/{entry.path}: stream ended at byte {sink.size} "
                                                  f"of {entry.size} after {self.opts.attempts} tries ({e})")) from e
            if sink.size < entry.size:
                raise Transient(TruncatedDownload(f"{self.uri}/{entry.path}: got {sink.size} of {entry.size} "
                                                  f"bytes after {self.opts.attempts} tries"))

        with_retries(self.opts, attempt)


def s3_source(uri: str, opts: SourceOptions) -> S3Source:
    """"s3://bucket/prefix" -> an S3Source with a default boto3 client; a clear error without boto3."""
    rest = uri.removeprefix("s3://")
    bucket, _, prefix = rest.partition("/")
    if not bucket:
        raise SourceError(f"{uri!r}: expected s3://bucket/prefix")
    try:
        import boto3
        from botocore.config import Config
    except ImportError:
        raise SourceError(f"{uri}: S3 sources need boto3, which is not installed here; `pip install boto3` "
                          "on every node (hbmserve does not depend on it)") from None
    config = Config(connect_timeout=opts.timeout_s, read_timeout=opts.timeout_s, retries={"max_attempts": 1})
    return S3Source(bucket, prefix, boto3.client("s3", config=config), opts)
