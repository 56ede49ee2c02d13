"""A loopback Hugging Face Hub: enough of the Hub HTTP API on 127.0.0.1 for offline tests.

Tests must show that `from_pretrained("org/repo")` downloads from a Hub and that `push_to_hub` uploads,
without any network. `LoopbackHub` serves model repos stored in a folder, on an ephemeral port, from a
background thread; the `hub` fixture points the installed `huggingface_hub` client at it::

    # tests/conftest.py registers this module as a plugin (pytest_plugins), so every test can ask for `hub`:

    def test_download(hub):
        hub.add_repo("org/tiny", {"config.json": "{}", "weights.bin": b"\\0"})
        folder = snapshot_download("org/tiny", allow_patterns=["*.json"])
        assert os.listdir(folder) == ["config.json"]
        assert hub.downloaded("org/tiny") == ["config.json"]  # weights.bin was never fetched

Endpoints, as huggingface_hub 2.4 calls them for model repos (anything else answers 501, naming itself):

    GET      /api/models/{repo}[/revision/{rev}]    model info: sha, siblings (model_info, repo_info)
    GET      /api/models/{repo}/tree/{rev}[/{path}] file listing (snapshot_download lists the tree of the commit)
    HEAD/GET /{repo}/resolve/{rev}/{path}           file metadata (X-Repo-Commit, ETag = git blob id) / content
    POST     /api/repos/create                      create_repo; first commit holds .gitattributes, as on the Hub
    POST     /api/models/{repo}/preupload/{rev}     upload mode: always "regular" (no LFS, no Xet)
    POST     /api/models/{repo}/commit/{rev}        NDJSON commit: base64 files, deleted files and folders
    POST     /api/validate-yaml                     model card metadata check (always valid)

Model repos named `namespace/name` only; no LFS, pull requests, private or gated repos. Errors are answered as
the Hub does: 404 with `X-Error-Code` RepoNotFound / RevisionNotFound / EntryNotFound,
which `huggingface_hub.utils.hf_raise_for_status` maps to RepositoryNotFoundError / RevisionNotFoundError /
RemoteEntryNotFoundError.

Pointing the client at the server (`loopback_client`). huggingface_hub reads HF_ENDPOINT, HF_HUB_CACHE and
HF_HUB_OFFLINE into `huggingface_hub.constants` at import, so environment variables set by a test come too late.
For the duration of the context it patches what the download and upload paths read at call time:

- `constants.ENDPOINT` (default endpoint of every `HfApi()` and of the commit/preupload helpers) and
  `constants.HUGGINGFACE_CO_URL_TEMPLATE` (`hf_hub_url` builds resolve URLs from this copy, not from ENDPOINT);
- `constants.HF_HUB_CACHE` (default `cache_dir` of hf_hub_download, snapshot_download, transformers' hub utils),
  pointed at an empty folder;
- `constants.HF_HUB_OFFLINE = False`: `is_offline_mode()` reads it at each request, so a test may set it True;
- `constants.HF_HUB_DISABLE_TELEMETRY = True`: with telemetry on, the first user agent built in the process fetches
  `/api/agent-harnesses` (and caches it in HF_HOME), a request that would land in one test's log and not another's;
- `huggingface_hub.hf_api.api.endpoint`: the module-level `HfApi` created at import, whose bound methods are
  `huggingface_hub.model_info`, `create_repo`, `upload_folder`, `upload_file` (what diffusers and model cards use);
- `transformers.utils.hub._hf_api`, a shared `HfApi` created on first use, is dropped on entry and on exit;
- the token: HF_TOKEN, HUGGING_FACE_HUB_TOKEN and HF_OIDC_RESOURCE are unset and `constants.HF_TOKEN_PATH` /
  `HF_STORED_TOKENS_PATH` point into the cache folder, so the server only sees a token passed as `token=`;
- huggingface_hub's shared HTTP client (`set_client_factory`) is replaced by one that ignores proxy variables and
  raises `NetworkRefused` for any origin but the server's: a path still holding the real endpoint fails loudly
  instead of reaching the network (or being mistaken for "offline" and served from a cache).

To test offline loading, `hub.close()` and pass `local_files_only=True`, or `monkeypatch.setattr(constants,
"HF_HUB_OFFLINE", True)` in a test that requests `monkeypatch` after `hub`, so that it is undone first.

diffusers keeps copies of its own (`diffusers.utils.constants.HUGGINGFACE_CO_RESOLVE_ENDPOINT`, `HF_HUB_OFFLINE`
imported by name in `diffusers.utils.hub_utils` and `diffusers.loaders.lora_base`); they only shape error messages,
the user agent and LoRA loading, so they are left alone.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import re
import sys
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Self
from urllib.parse import parse_qsl, unquote, urlsplit

import httpx2
import pytest
from huggingface_hub import constants, hf_api, set_client_factory
from huggingface_hub.utils import _http

USER = "loopback-user"  # the namespace of repos created without an organization
_GITATTRIBUTES = b"*.bin filter=lfs diff=lfs merge=lfs -text\n*.safetensors filter=lfs diff=lfs merge=lfs -text\n"
_SHA = re.compile(r"[0-9a-f]{40}")
_TOKEN_VARIABLES = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_OIDC_RESOURCE")


@dataclass(frozen=True)
class HubRequest:
    """One request as the server saw it: the path is as sent (quoted), without the query string."""

    method: str
    path: str
    authorization: str | None


class NetworkRefused(RuntimeError):
    """A request through huggingface_hub's client to anything but the loopback Hub."""


class _HubError(Exception):
    """An error answer, with the `X-Error-Code` the client maps to its exceptions."""

    def __init__(self, status: int, code: str, message: str, headers: Mapping[str, str] | None = None):
        super().__init__(message)
        self.status, self.code, self.headers = status, code, dict(headers or {})


def _git_oid(content: bytes) -> str:
    """The git blob id: the Hub's ETag of a regular file, and the `oid` preupload compares to skip unchanged files."""
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


def _checked(path: str) -> str:
    """A repo id or file path that stays inside the store."""
    if path.startswith("/") or any(part in ("", ".", "..") for part in path.split("/")):
        raise _HubError(400, "BadRequest", f"invalid path {path!r}")
    return path


class _RepoStore:
    """Model repos as folders: `<root>/<repo_id>/refs.json` maps branches to commits, `<root>/<repo_id>/<sha>/` holds
    all files of a commit (repos are tiny, so every commit is a full copy)."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.lock = threading.RLock()  # held across read-modify-write of a branch (commits)

    def create(self, repo_id: str) -> bool:
        """Create an empty repo; False if it exists."""
        refs = self._refs_file(repo_id)
        with self.lock:
            if refs.exists():
                return False
            refs.parent.mkdir(parents=True)
            refs.write_text("{}")
            return True

    def resolve(self, repo_id: str, revision: str) -> str:
        """The commit sha of a branch, or of a full sha of this repo."""
        refs = self._refs_file(repo_id)
        with self.lock:
            if not refs.exists():
                raise _HubError(404, "RepoNotFound", f"Repository {repo_id} not found")
            sha = json.loads(refs.read_text()).get(revision, revision)
        if not _SHA.fullmatch(sha) or not (refs.parent / sha).is_dir():
            raise _HubError(404, "RevisionNotFound", f"Invalid rev id: {revision}")
        return sha

    def snapshot(self, repo_id: str, revision: str) -> tuple[str, dict[str, bytes]]:
        """The commit sha and files (path -> content) of a revision."""
        sha = self.resolve(repo_id, revision)
        folder = self._refs_file(repo_id).parent / sha
        files = sorted(p for p in folder.rglob("*") if p.is_file())
        return sha, {p.relative_to(folder).as_posix(): p.read_bytes() for p in files}

    def commit(self, repo_id: str, branch: str, files: Mapping[str, bytes], message: str) -> str:
        """Make `files` the whole tree of `branch` (created if needed); returns the new commit sha."""
        refs_file = self._refs_file(repo_id)
        with self.lock:
            refs = json.loads(refs_file.read_text())
            tree = {_checked(path): _git_oid(content) for path, content in sorted(files.items())}
            sha = hashlib.sha1(json.dumps([refs.get(branch), message, tree]).encode()).hexdigest()
            folder = refs_file.parent / sha
            folder.mkdir(exist_ok=True)
            for path, content in files.items():
                (folder / path).parent.mkdir(parents=True, exist_ok=True)
                (folder / path).write_bytes(content)
            refs_file.write_text(json.dumps({**refs, branch: sha}))
            return sha

    def _refs_file(self, repo_id: str) -> Path:
        return self.root / _checked(repo_id) / "refs.json"


def _tree_entries(files: Mapping[str, bytes], folder: str, recursive: bool) -> list[dict]:
    """Tree listing entries under `folder`, in the Hub's JSON shape (sub-folders included, as the Hub does)."""
    prefix = f"{folder.strip('/')}/" if folder else ""
    entries: dict[str, dict] = {}
    for path, content in files.items():
        if not path.startswith(prefix):
            continue
        parts = path[len(prefix) :].split("/")
        for depth in range(1, len(parts) if recursive else min(len(parts), 2)):
            sub = prefix + "/".join(parts[:depth])
            tree_id = hashlib.sha1(sub.encode()).hexdigest()  # a stand-in: the client never compares folder ids
            entries[sub] = {"type": "directory", "oid": tree_id, "size": 0, "path": sub}
        if recursive or len(parts) == 1:
            entries[path] = {"type": "file", "oid": _git_oid(content), "size": len(content), "path": path}
    return list(entries.values())


_REPO = r"(?P<repo_id>[^/]+/[^/]+)"
_REV = r"(?P<revision>[^/]+)"
_ROUTES = [
    ({"GET"}, re.compile(rf"/api/models/{_REPO}(?:/revision/{_REV})?"), "model_info"),
    ({"GET"}, re.compile(rf"/api/models/{_REPO}/tree/{_REV}(?:/(?P<path>.+))?"), "tree"),
    ({"GET", "HEAD"}, re.compile(rf"/{_REPO}/resolve/{_REV}/(?P<path>.+)"), "resolve"),
    ({"POST"}, re.compile(r"/api/repos/create"), "create_repo"),
    ({"POST"}, re.compile(rf"/api/models/{_REPO}/preupload/{_REV}"), "preupload"),
    ({"POST"}, re.compile(rf"/api/models/{_REPO}/commit/{_REV}"), "commit"),
    ({"POST"}, re.compile(r"/api/validate-yaml"), "validate_yaml"),
]

_Reply = tuple[int, dict[str, str], bytes]


def _json(data, status: int = 200) -> _Reply:
    return status, {"Content-Type": "application/json"}, json.dumps(data).encode()


class _Handler(BaseHTTPRequestHandler):
    """Routes a request to the endpoint method named in `_ROUTES`, with the path parameters unquoted.

    HTTP/1.0 (the default): one request per connection, so no client connection outlives a response.
    """

    server: _Server

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        self.server.log.append(HubRequest(self.command, url.path, self.headers.get("Authorization")))
        self.params = dict(parse_qsl(url.query))
        self.body = self.rfile.read(int(self.headers.get("Content-Length", 0)))  # unread data would reset the socket
        try:
            status, headers, body = self._route(url.path)
        except _HubError as error:
            status, headers, body = _json({"error": str(error)}, error.status)
            message = str(error).encode("ascii", "backslashreplace").decode()  # headers are latin-1
            headers.update({"X-Error-Code": error.code, "X-Error-Message": message, **error.headers})
        self.send_response(status)
        for name, value in {**headers, "Content-Length": str(len(body))}.items():
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_HEAD = do_POST = do_GET

    def log_message(self, format: str, *args) -> None:
        """Quiet: the server keeps its own log (`LoopbackHub.requests`)."""

    def _route(self, path: str) -> _Reply:
        for methods, pattern, name in _ROUTES:
            match = pattern.fullmatch(path)
            if match and self.command in methods:
                params = {key: unquote(value) for key, value in match.groupdict().items() if value is not None}
                return getattr(self, f"_{name}")(**params)
        raise _HubError(501, "NotImplemented", f"the loopback hub does not implement {self.command} {path}")

    def _model_info(self, repo_id: str, revision: str = constants.DEFAULT_REVISION) -> _Reply:
        sha, files = self.server.store.snapshot(repo_id, revision)
        siblings = [{"rfilename": path} for path in files]
        return _json({"id": repo_id, "modelId": repo_id, "sha": sha, "private": False, "siblings": siblings})

    def _tree(self, repo_id: str, revision: str, path: str = "") -> _Reply:
        _, files = self.server.store.snapshot(repo_id, revision)
        entries = _tree_entries(files, path, recursive=self.params.get("recursive") == "true")
        if path and not entries:
            raise _HubError(404, "EntryNotFound", f"{path} does not exist on {revision}")
        return _json(entries)

    def _resolve(self, repo_id: str, revision: str, path: str) -> _Reply:
        sha, files = self.server.store.snapshot(repo_id, revision)
        if path not in files:  # the client caches the absence per commit, hence X-Repo-Commit
            raise _HubError(404, "EntryNotFound", f"{path} does not exist on {revision}", {"X-Repo-Commit": sha})
        content = files[path]
        headers = {"X-Repo-Commit": sha, "ETag": f'"{_git_oid(content)}"', "Content-Type": "application/octet-stream"}
        return 200, headers, content

    def _create_repo(self) -> _Reply:
        request = json.loads(self.body)
        if request.get("type", "model") != "model":
            raise _HubError(400, "BadRequest", "the loopback hub serves model repos only")
        repo_id = f"{request.get('organization') or USER}/{request['name']}"
        url = f"{self.server.url}/{repo_id}"
        if not self.server.store.create(repo_id):  # create_repo(exist_ok=True) reads the url of a 409
            return _json({"error": "You already created this model repo", "url": url}, 409)
        self.server.store.commit(repo_id, constants.DEFAULT_REVISION, {".gitattributes": _GITATTRIBUTES}, "initial")
        return _json({"url": url, "name": repo_id})

    def _preupload(self, repo_id: str, revision: str) -> _Reply:
        _, files = self.server.store.snapshot(repo_id, revision)
        wanted = [entry["path"] for entry in json.loads(self.body)["files"]]
        # `oid` of the current file lets the client drop unchanged files from the commit, as with the Hub.
        oids = {path: _git_oid(content) for path, content in files.items()}
        answer = [{"path": p, "uploadMode": "regular", "shouldIgnore": False, "oid": oids.get(p)} for p in wanted]
        return _json({"files": answer})

    def _commit(self, repo_id: str, revision: str) -> _Reply:
        if self.params.get("create_pr"):
            raise _HubError(501, "NotImplemented", "the loopback hub does not open pull requests")
        store = self.server.store
        with store.lock:
            _, files = store.snapshot(repo_id, revision)
            message = _apply_commit(files, [json.loads(line) for line in self.body.splitlines() if line.strip()])
            sha = store.commit(repo_id, revision, files, message)
        return _json({"success": True, "commitOid": sha, "commitUrl": f"{self.server.url}/{repo_id}/commit/{sha}"})

    def _validate_yaml(self) -> _Reply:
        return _json({"errors": [], "warnings": []})


def _apply_commit(files: dict[str, bytes], items: list[dict]) -> str:
    """Apply the operations of a commit payload to `files` in place; returns the commit summary."""
    summary = ""
    for item in items:
        key, value = item["key"], item["value"]
        if key == "header":
            summary = value["summary"]
        elif key == "file":
            files[value["path"]] = base64.b64decode(value["content"])
        elif key == "deletedFile":
            if files.pop(value["path"], None) is None:
                raise _HubError(404, "EntryNotFound", f"A file with this name doesn't exist: {value['path']}")
        elif key == "deletedFolder":
            prefix = value["path"].rstrip("/") + "/"
            for path in [p for p in files if p.startswith(prefix)]:
                del files[path]
        else:  # lfsFile: preupload never asks for LFS
            raise _HubError(400, "BadRequest", f"the loopback hub does not accept {key!r} operations")
    return summary


class _Server(ThreadingHTTPServer):
    daemon_threads = True  # closing never waits for a client that keeps its connection open
    request_queue_size = 64  # snapshot_download connects from 8 threads at once

    def __init__(self, store: _RepoStore):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.store = store
        self.log: list[HubRequest] = []
        self.url = f"http://127.0.0.1:{self.server_address[1]}"


def _read_files(files: str | Path | Mapping[str, bytes | str]) -> dict[str, bytes]:
    if isinstance(files, Mapping):
        return {path: content.encode() if isinstance(content, str) else content for path, content in files.items()}
    folder = Path(files)
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


class LoopbackHub:
    """A Hub on 127.0.0.1 (ephemeral port), serving from a background thread the repos stored under `root`.

    `url` is the endpoint; `requests` logs every request (`HubRequest`), so a test can check which files were
    fetched and which token was sent.
    """

    def __init__(self, root: str | Path):
        self._store = _RepoStore(root)
        self._server = _Server(self._store)
        self.url = self._server.url
        self.requests = self._server.log
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()

    def add_repo(self, repo_id: str, files: str | Path | Mapping[str, bytes | str], revision: str = "main") -> str:
        """Seed `repo_id` (created if needed) so that branch `revision` holds exactly `files`, a folder or a
        path -> content mapping; returns the commit sha."""
        self._store.create(repo_id)
        return self._store.commit(repo_id, revision, _read_files(files), f"seed {revision}")

    def files(self, repo_id: str, revision: str = "main") -> dict[str, bytes]:
        """The files (path -> content) of a revision, e.g. to check what `push_to_hub` uploaded."""
        return self._store.snapshot(repo_id, revision)[1]

    def downloaded(self, repo_id: str) -> list[str]:
        """The file paths of `repo_id` whose content was fetched (GET resolve), in request order."""
        prefix = f"/{repo_id}/resolve/"
        return [
            unquote(r.path[len(prefix) :].split("/", 1)[1])
            for r in self.requests
            if r.method == "GET" and r.path.startswith(prefix)
        ]

    def close(self) -> None:
        """Stop serving and free the port; later requests fail to connect. Idempotent."""
        if self._thread.is_alive():
            self._server.shutdown()
            self._thread.join(timeout=5)
        self._server.server_close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


class _LoopbackOnly(httpx2.HTTPTransport):
    """Transport that sends requests to one origin only."""

    def __init__(self, endpoint: str):
        super().__init__()
        url = httpx2.URL(endpoint)
        self._origin = (url.scheme, url.host, url.port)

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        if (request.url.scheme, request.url.host, request.url.port) != self._origin:
            raise NetworkRefused(f"request to {request.url} outside the loopback hub")
        return super().handle_request(request)


def _loopback_only_client(endpoint: str) -> httpx2.Client:
    """huggingface_hub's default client (its request hook checks offline mode), bounded in time and loopback only."""
    return httpx2.Client(
        transport=_LoopbackOnly(endpoint),
        trust_env=False,  # no proxy from the environment
        event_hooks={"request": [_http.hf_request_event_hook]},
        follow_redirects=True,
        timeout=30,
    )


def _forget_transformers_api() -> None:
    """transformers creates one HfApi on first use and keeps it (with the endpoint of that moment)."""
    module = sys.modules.get("transformers.utils.hub")
    if module is not None:
        module._hf_api = None


@contextlib.contextmanager
def loopback_client(endpoint: str, cache_dir: str | Path) -> Iterator[None]:
    """Point huggingface_hub (and the libraries built on it) at `endpoint` with `cache_dir` as cache; see the module
    docstring for what is patched and why. Everything is restored on exit."""
    cache_dir = str(cache_dir)
    previous_factory = _http._GLOBAL_CLIENT_FACTORY  # no public getter
    with pytest.MonkeyPatch.context() as patch:
        for name, value in {
            "ENDPOINT": endpoint,
            "HUGGINGFACE_CO_URL_TEMPLATE": endpoint + "/{repo_id}/resolve/{revision}/{filename}",
            "HF_HUB_CACHE": cache_dir,
            "HF_HUB_OFFLINE": False,
            "HF_HUB_DISABLE_TELEMETRY": True,  # else the first user agent fetches /api/agent-harnesses
            "HF_TOKEN_PATH": f"{cache_dir}/token",
            "HF_STORED_TOKENS_PATH": f"{cache_dir}/stored_tokens",
        }.items():
            patch.setattr(constants, name, value)
        patch.setattr(hf_api.api, "endpoint", endpoint)
        for variable in _TOKEN_VARIABLES:
            patch.delenv(variable, raising=False)
        _forget_transformers_api()
        set_client_factory(lambda: _loopback_only_client(endpoint))
        try:
            yield
        finally:
            set_client_factory(previous_factory)
            _forget_transformers_api()


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[LoopbackHub]:
    """A `LoopbackHub` the huggingface_hub client talks to, with an empty cache; both are gone after the test."""
    with LoopbackHub(tmp_path / "hub") as server, loopback_client(server.url, tmp_path / "hf-cache"):
        yield server
