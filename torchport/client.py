"""A small Python client for a torchport server.

```python
from torchport.client import Client

with Client("http://127.0.0.1:8000", api_key="tp_…") as client:
    job = client.submit("model.py", options={"strict": True})
    job.wait()                      # follows the server-sent events
    job.download("out/")            # program.pt2, graph.json, signature.json, report.json
    job.download_zip("job.zip")     # or all of them as one zip, as the server sent it
    client.get(job.id).cancel()     # client.list(status="running"), client.cancel(id)
```
Failures of the API raise `TorchportError` with the contract's error `code`; a job that
failed is not an exception: `job.status == "failed"` and `job.error` says why.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
import time
import zipfile
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote

import httpx
from httpx_sse import connect_sse
from pydantic import BaseModel, Field, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from schemas import EnvironmentList, ErrorBody, JobList, JobPublic, JobSummary, StageEvent
from schemas.job import TERMINAL_STATUSES

DEFAULT_SERVER = "http://127.0.0.1:8000"
ZIP_MANIFEST = "manifest.json"
"""The member of `…/artifacts.zip` that lists the artifacts with their sizes and digests."""
MAX_MANIFEST_BYTES = 1024 * 1024
"""The most of an archive's manifest read (a server's job has a few dozen artifacts)."""
MAX_NAME_BYTES = 255
"""The longest artifact name saved: a file name on every common file system."""
_CHUNK = 1024 * 1024
_Document = TypeVar("_Document", bound=BaseModel)
_UNREADABLE_ZIP = (
    zipfile.BadZipFile,
    zipfile.LargeZipFile,
    NotImplementedError,  # a compression zipfile lacks
    RuntimeError,  # an encrypted member
    EOFError,
    zlib.error,
    ValueError,
)
"""What zipfile raises for an archive it cannot read."""


class ClientSettings(BaseSettings):
    """What a client takes from its environment when not told: `TORCHPORT_SERVER`,
    `TORCHPORT_API_KEY` (docs/configuration.md)."""

    model_config = SettingsConfigDict(env_prefix="TORCHPORT_", extra="ignore")

    server: str = Field(default=DEFAULT_SERVER, description="The torchport server's URL.")
    api_key: str | None = Field(default=None, description="The API key sent as a bearer token.")


class TorchportError(Exception):
    """An error answer of the API (or no answer at all: code `unavailable`)."""

    def __init__(
        self, code: str, message: str, status_code: int | None = None, body: ErrorBody | None = None
    ) -> None:
        super().__init__(f"[{code}] {message}")
        self.code = code
        self.message = message
        self.status_code = status_code
        self.body = body


def _path(*segments: str) -> str:
    """An API path of these segments, each percent-encoded: a job id or an artifact name
    (typed by the user, or sent by the server) stays one segment of the URL."""
    return "/v1/exports/" + "/".join(
        quote(segment, safe="", errors="backslashreplace") for segment in segments
    )


def plain_file_name(name: str) -> bool:
    """Whether `name` can be saved as it is, as a file directly in a download's directory:
    not empty, no folder (`/`, `\\`), not hidden nor `.`/`..`, no control or invisible
    character (NUL among them), at most `MAX_NAME_BYTES` long."""
    return (
        0 < len(name.encode("utf-8", "surrogatepass")) <= MAX_NAME_BYTES
        and name.isprintable()
        and not name.startswith(".")
        and "/" not in name
        and "\\" not in name
    )


def _parsed(model: type[_Document], text: str | bytes) -> _Document:
    """A document of the server's as `model`; an answer that is no such JSON document
    raises `internal_error` (never a traceback)."""
    try:
        return model.model_validate(json.loads(text))
    except ValueError as exc:  # not JSON (JSONDecodeError), or not the document
        kind = "no JSON" if isinstance(exc, json.JSONDecodeError) else "not as the contract says"
        raise TorchportError("internal_error", f"the server's {model.__name__} is {kind}") from None


def _raise_for(response: httpx.Response) -> None:
    if response.is_success:
        return
    try:
        body = ErrorBody.model_validate(response.json())
    except (ValueError, json.JSONDecodeError):
        raise TorchportError(
            "internal_error",
            f"HTTP {response.status_code}: {response.text[:200]}",
            response.status_code,
        ) from None
    raise TorchportError(body.code, body.message, response.status_code, body)


class Job:
    """A job on the server; `data` is its last known state."""

    def __init__(self, client: Client, data: JobPublic) -> None:
        self._client = client
        self.data = data

    @property
    def id(self) -> str:
        """The job id."""
        return self.data.id

    @property
    def status(self) -> str:
        """queued, running, succeeded, failed or canceled."""
        return self.data.status

    @property
    def error(self) -> ErrorBody | None:
        """Why the job failed, if it did."""
        return self.data.error

    @property
    def done(self) -> bool:
        """Whether the job finished (in any way)."""
        return self.data.status in TERMINAL_STATUSES

    def refresh(self) -> Job:
        """Fetch the current state."""
        self.data = self._client._get_job(self.id)
        return self

    def events(self) -> Iterator[StageEvent | JobPublic]:
        """Stage events as they happen, then the final job (server-sent events, parsed by
        httpx-sse)."""
        with connect_sse(
            self._client._http, "GET", _path(self.id, "events"), timeout=None
        ) as source:
            if not source.response.is_success:
                source.response.read()
                _raise_for(source.response)
            for sse in source.iter_sse():
                if sse.event == "job":
                    self.data = _parsed(JobPublic, sse.data)
                    yield self.data
                    return
                if sse.event == "stage":
                    yield _parsed(StageEvent, sse.data)

    def wait(
        self,
        timeout: float | None = None,
        on_event: Callable[[StageEvent], None] | None = None,
        poll_interval: float = 0.2,
    ) -> Job:
        """Block until the job finishes; `on_event` sees each stage event.

        Follows the event stream, and falls back to polling if the stream breaks.

        Raises:
            TimeoutError: the job did not finish within `timeout` seconds.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        if not self.done:
            try:
                for item in self.events():
                    if isinstance(item, StageEvent) and on_event is not None:
                        on_event(item)
                    if deadline is not None and time.monotonic() > deadline:
                        break
            except httpx.HTTPError:
                pass
        while not self.done:
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"job {self.id} still {self.status} after {timeout} s")
            time.sleep(poll_interval)
            self.refresh()
        return self

    def download(
        self, directory: str | os.PathLike[str], names: list[str] | None = None
    ) -> list[Path]:
        """Save the job's artifacts into `directory`; returns the paths.

        All of them come as one zip (`GET …/artifacts.zip`), unpacked here, each checked
        against the size and SHA-256 its manifest gives; `names` fetches only those, one
        by one (a name the job does not have is the server's `not_found`).

        Raises:
            TorchportError: `internal_error` for an archive that cannot be read, has no
                manifest, lists a name that is no plain file name (`plain_file_name`) or a
                file it lacks, or whose files differ from what it lists (nothing is saved
                then); `invalid_request` for a name of `names` that is no plain file name.
        """
        target = Path(directory)
        for name in names or []:
            if not plain_file_name(name):
                raise TorchportError("invalid_request", f"not an artifact name: {name!r}")
        target.mkdir(parents=True, exist_ok=True)
        if names is None:
            with tempfile.TemporaryDirectory(dir=target, prefix=".torchport-") as tmp:
                return _unpack(self.download_zip(Path(tmp) / "artifacts.zip"), target)
        saved = []
        for name in names:
            path = target / name
            self._client._save(_path(self.id, "artifacts", name), path)
            saved.append(path)
        return saved

    def download_zip(self, path: str | os.PathLike[str]) -> Path:
        """Save every artifact as one zip at `path` (into `path/<id>.zip` when it is a
        directory), streamed to disk as it comes; returns its path."""
        target = Path(path)
        if target.is_dir():
            target = target / f"{self.id}.zip"
        self._client._save(_path(self.id, "artifacts.zip"), target)
        return target

    def cancel(self) -> Job:
        """Cancel the job (a running one is stopped by its worker shortly after: its
        status stays `running` until then)."""
        response = self._client._send("DELETE", _path(self.id))
        self.data = _parsed(JobPublic, response.content)
        return self

    def __repr__(self) -> str:
        return f"<Job {self.id} {self.status}>"


class _Listed(BaseModel):
    """One artifact of an archive's manifest."""

    name: str
    size: int = Field(ge=0)
    sha256: str


class _Manifest(BaseModel):
    """An archive's `manifest.json` (its `job_id` is not needed here)."""

    artifacts: list[_Listed]


def _refused_archive(why: str) -> TorchportError:
    return TorchportError("internal_error", f"the server's artifacts.zip {why}")


def _unpack(archive: Path, target: Path) -> list[Path]:
    """Write the artifacts of a job's zip into `target`, each checked against the size and
    SHA-256 of the zip's manifest; only the manifest's names, each a plain file name.

    Every file is written beside the archive first and moved into `target` once all of
    them arrived as listed, so a refused archive saves nothing.

    Raises:
        TorchportError: `internal_error`, for an archive that is refused.
    """
    staged = archive.parent / "unpacked"
    staged.mkdir()
    try:
        with zipfile.ZipFile(archive) as zf:
            listed = _manifest(zf)
            for artifact in listed:
                _extract(zf, artifact, staged / artifact.name)
    except _UNREADABLE_ZIP as exc:
        raise _refused_archive(f"cannot be read: {exc}") from None
    saved = []
    for artifact in listed:
        path = target / artifact.name
        # a rename: a link already at `path` is replaced, never followed
        os.replace(staged / artifact.name, path)
        saved.append(path)
    return saved


def _manifest(zf: zipfile.ZipFile) -> list[_Listed]:
    """The manifest's artifacts, read to at most `MAX_MANIFEST_BYTES`, each a plain file
    name the archive holds, none twice."""
    if ZIP_MANIFEST not in zf.NameToInfo:
        raise _refused_archive(f"has no {ZIP_MANIFEST}")
    with zf.open(ZIP_MANIFEST) as member:
        text = member.read(MAX_MANIFEST_BYTES + 1)
    if len(text) > MAX_MANIFEST_BYTES:
        raise _refused_archive(f"has a {ZIP_MANIFEST} over {MAX_MANIFEST_BYTES} bytes")
    try:
        listed = _Manifest.model_validate_json(text).artifacts
    except ValidationError:
        raise _refused_archive(f"has a {ZIP_MANIFEST} that is no manifest") from None
    seen: set[str] = set()
    for artifact in listed:
        if not plain_file_name(artifact.name) or artifact.name in seen:
            raise _refused_archive(f"names an artifact {artifact.name!r}: no plain file name")
        if artifact.name not in zf.NameToInfo:
            raise _refused_archive(f"lists {artifact.name!r} but does not hold it")
        seen.add(artifact.name)
    return listed


def _extract(zf: zipfile.ZipFile, artifact: _Listed, path: Path) -> None:
    """Write one listed member to `path`, reading at most one chunk past its listed size."""
    digest, size = hashlib.sha256(), 0
    with zf.open(artifact.name) as member, path.open("wb") as out:
        while size <= artifact.size and (chunk := member.read(_CHUNK)):
            digest.update(chunk)
            size += len(chunk)
            out.write(chunk)
    if (size, digest.hexdigest()) != (artifact.size, artifact.sha256):
        raise _refused_archive(
            f"holds {artifact.name!r} with {size} bytes of SHA-256 {digest.hexdigest()}, "
            f"not the {artifact.size} bytes of {artifact.sha256!r} it lists"
        )


def _as_json(value: dict[str, Any] | str | os.PathLike[str] | None) -> str | None:
    if value is None or (isinstance(value, str) and value.lstrip().startswith("{")):
        return value if value is None else str(value)
    if isinstance(value, dict):
        return json.dumps(value)
    return Path(value).read_text()


class Client:
    """A connection to a torchport server (`TORCHPORT_SERVER`, `TORCHPORT_API_KEY` by default)."""

    def __init__(
        self, server: str | None = None, api_key: str | None = None, timeout: float = 60.0
    ) -> None:
        defaults = ClientSettings()
        self.server = (server or defaults.server or DEFAULT_SERVER).rstrip("/")
        key = api_key or defaults.api_key
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._http = httpx.Client(base_url=self.server, headers=headers, timeout=timeout)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def _send(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        """One request; an error answer raises its code, no answer raises `unavailable`."""
        try:
            response = self._http.request(method, url, **kwargs)
        except httpx.TransportError as exc:
            raise TorchportError("unavailable", f"cannot reach {self.server}: {exc}") from exc
        _raise_for(response)
        return response

    def _save(self, url: str, path: Path) -> None:
        """Stream a download into `path` (written under a temporary name, then renamed, so
        a broken transfer leaves no partial file under the real name)."""
        partial = path.with_name(f".{path.name}.part")
        try:
            with self._http.stream("GET", url) as response:
                if not response.is_success:
                    response.read()
                    _raise_for(response)
                with partial.open("wb") as f:
                    for chunk in response.iter_bytes(_CHUNK):
                        f.write(chunk)
        except httpx.TransportError as exc:
            partial.unlink(missing_ok=True)
            raise TorchportError("unavailable", f"cannot reach {self.server}: {exc}") from exc
        except BaseException:
            partial.unlink(missing_ok=True)
            raise
        partial.replace(path)

    def submit(
        self,
        model: str | os.PathLike[str],
        *,
        inputs: str | os.PathLike[str] | None = None,
        weights: str | os.PathLike[str] | None = None,
        options: dict[str, Any] | str | os.PathLike[str] | None = None,
        callback_url: str | None = None,
        calibration: str | os.PathLike[str] | None = None,
    ) -> Job:
        """Upload a model (and optional inputs, weights, options, the URL POSTed the job
        when it ends, calibration inputs for `quantize.scheme: int8`); returns the job.
        A `model` string starting `s3://` names a checkpoint by reference (`model_url`:
        the server's workers read it from an allow-listed prefix)."""
        files: dict[str, Any] = {}
        if isinstance(model, str) and model.startswith("s3://"):
            files["model_url"] = (None, model)
        uploads = (
            ("model", None if "model_url" in files else model),
            ("inputs", inputs),
            ("weights", weights),
            ("calibration", calibration),
        )
        with contextlib.ExitStack() as stack:
            for field, path in uploads:
                if path is None:
                    continue
                handle = stack.enter_context(Path(path).open("rb"))
                files[field] = (Path(path).name, handle, "application/octet-stream")
            data = {}
            options_text = _as_json(options)
            if options_text is not None:
                data["options"] = options_text
            if callback_url is not None:
                data["callback_url"] = callback_url
            response = self._send("POST", "/v1/exports", files=files, data=data)
        return Job(self, _parsed(JobPublic, response.content))

    def _get_job(self, job_id: str) -> JobPublic:
        response = self._send("GET", _path(job_id))
        return _parsed(JobPublic, response.content)

    def environment(self) -> EnvironmentList:
        """Per queue, the libraries its workers' jobs can import (`GET /v1/environment`)."""
        return _parsed(EnvironmentList, self._send("GET", "/v1/environment").content)

    def job(self, job_id: str) -> Job:
        """An existing job by id."""
        return Job(self, self._get_job(job_id))

    def get(self, job_id: str) -> Job:
        """An existing job by id (`GET /v1/exports/{id}`); the same as `job`."""
        return self.job(job_id)

    def cancel(self, job_id: str) -> Job:
        """Cancel a job by id (`DELETE /v1/exports/{id}`): a queued one is canceled at once,
        a running one stays `running` until its worker stopped it; a finished one raises
        `conflict`."""
        response = self._send("DELETE", _path(job_id))
        return Job(self, _parsed(JobPublic, response.content))

    def list(
        self, status: str | None = None, limit: int | None = None, cursor: str | None = None
    ) -> JobList:
        """One page of your jobs' summaries, newest first (`GET /v1/exports`); pass its
        `next_cursor` as `cursor` for the next page (`jobs()` follows them all)."""
        params: dict[str, Any] = {}
        for name, value in (("status", status), ("limit", limit), ("cursor", cursor)):
            if value is not None:
                params[name] = value
        return _parsed(JobList, self._send("GET", "/v1/exports", params=params).content)

    def jobs(self, status: str | None = None, page_size: int = 50) -> Iterator[JobSummary]:
        """Summaries of your jobs, newest first, following the pagination cursor;
        `job(summary.id)` has the whole job."""
        cursor: str | None = None
        while True:
            page = self.list(status=status or None, limit=page_size, cursor=cursor)
            yield from page.items
            cursor = page.next_cursor
            if not cursor:
                return


def submit(
    model: str | os.PathLike[str],
    *,
    server: str | None = None,
    api_key: str | None = None,
    **kwargs: Any,
) -> Job:
    """Submit with a new `Client`; the job keeps the client open for wait/download."""
    return Client(server, api_key).submit(model, **kwargs)


__all__ = ["Client", "Job", "TorchportError", "plain_file_name", "submit"]
