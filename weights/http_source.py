"""Files under an HTTP(S) base URL, with `hbmserve-manifest.json` beside them.

Every try resumes with a Range request where the partial file ends; a server that ignores Range
(200 instead of 206) gets the file restarted. Connection errors, bodies cut short, 5xx and 429
are retried with jittered exponential back-off (tenacity); 4xx are final. Once the tries are
spent the error says which of these it was, with the URL.
"""

from __future__ import annotations

import re
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import quote

import httpx

from hbmserve.weights.errors import SourceError, SourceUnavailable, TruncatedDownload
from hbmserve.weights.fs import Sink
from hbmserve.weights.manifest import MANIFEST_NAME, FileEntry, Manifest, parse_manifest
from hbmserve.weights.sources import Progress, SourceOptions, Transient as _Transient, with_retries

_CONTENT_RANGE = re.compile(r"bytes (\d+)-")


@dataclass
class HttpSource:
    base_url: str
    opts: SourceOptions = SourceOptions()
    # Built on first use and kept: loading the CA bundle costs ~50 ms per client, and a fill
    # opens one client per file.
    _tls: ssl.SSLContext | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def uri(self) -> str:
        return self.base_url

    def _url(self, path: str) -> str:
        return self.base_url.rstrip("/") + "/" + quote(path)

    def _client(self) -> httpx.Client:
        # identity: the bytes on disk must be the file's bytes, never a decoded transfer encoding
        if self._tls is None:
            self._tls = httpx.create_ssl_context()
        return httpx.Client(timeout=self.opts.timeout_s, headers={"Accept-Encoding": "identity"},
                            follow_redirects=True, verify=self._tls)

    def manifest(self) -> Manifest:
        url, got = self._url(MANIFEST_NAME), []

        def attempt() -> None:
            with self._client() as client:
                r = _checked(lambda: client.get(url), url, self.opts.attempts)
                got.append(r.content)

        with_retries(self.opts, attempt)
        return parse_manifest(got[0], url)

    def fetch(self, entry: FileEntry, sink: Sink, progress: Progress) -> None:
        url = self._url(entry.path)
        with self._client() as client:
            with_retries(self.opts, lambda: self._attempt(client, url, entry, sink, progress))

    def _attempt(self, client: httpx.Client, url: str, entry: FileEntry, sink: Sink, progress: Progress) -> None:
        if sink.size >= entry.size:
            return  # a previous try got every byte; the caller checks them
        headers = {"Range": f"bytes={sink.size}-"} if sink.size else {}
        request = client.build_request("GET", url, headers=headers)
        try:
            r = _checked(lambda: client.send(request, stream=True), url, self.opts.attempts)
            try:
                if r.status_code == 206:
                    m = _CONTENT_RANGE.match(r.headers.get("content-range", ""))
                    if not m or int(m.group(1)) != sink.size:
                        raise SourceError(f"{url}: asked for bytes {sink.size}- and got "
                                          f"{r.headers.get('content-range')!r}")
                elif sink.size:  # 200: the whole file again
                    progress(-sink.size)
                    sink.reset()
                # No chunk_size: httpx would buffer up to it and drop the buffer when the
                # connection breaks; unbuffered, every byte that arrived is kept for the resume.
                for chunk in r.iter_raw():
                    sink.write(chunk)
                    progress(len(chunk))
            finally:
                r.close()
        except httpx.TransportError as e:
            # A body cut short lands here too (httpx: "peer closed connection without sending
            # complete message body"), with the bytes that did arrive already in the sink.
            if sink.size:
                raise _Transient(TruncatedDownload(
                    f"{url}: the connection ended at byte {sink.size} of {entry.size} "
                    f"after {self.opts.attempts} tries ({e})")) from e
            raise _Transient(SourceUnavailable(f"cannot reach {url} after {self.opts.attempts} tries: {e}")) from e
        if sink.size < entry.size:  # a clean end, but short (a Content-Length that lied)
            raise _Transient(TruncatedDownload(f"{url}: the server sent {sink.size} of {entry.size} bytes "
                                               f"after {self.opts.attempts} tries"))


def _checked(send: Callable[[], httpx.Response], url: str, attempts: int) -> httpx.Response:
    """Send, and sort the status: 2xx returned, 5xx/429 retried, anything else final."""
    try:
        r = send()
    except httpx.TransportError as e:
        raise _Transient(SourceUnavailable(f"cannot reach {url} after {attempts} tries: {e}")) from e
    if r.status_code in (200, 206):
        return r
    r.close()
    if r.status_code == 416:  # our partial file is longer than theirs: a changed file, not a flaky one
        raise SourceError(f"{url}: HTTP 416, the partial download is past the end of the served file")
    if r.status_code >= 500 or r.status_code == 429:
        raise _Transient(SourceError(f"{url}: HTTP {r.status_code} after {attempts} tries"))
    hint = f" (an HTTP source publishes {MANIFEST_NAME}; write it with `hbmserve cache manifest DIR`)" \
        if r.status_code == 404 and url.endswith(MANIFEST_NAME) else ""
    raise SourceError(f"{url}: HTTP {r.status_code}{hint}")
