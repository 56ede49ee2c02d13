"""The loopback Hub answers the installed huggingface_hub client as the Hub would, and nothing leaves 127.0.0.1."""

import socket
from pathlib import Path
from urllib.parse import urlsplit

import huggingface_hub
import pytest
from hub_server import USER, LoopbackHub, NetworkRefused, loopback_client
from huggingface_hub import HfApi, constants, hf_hub_download, snapshot_download
from huggingface_hub.errors import (
    HfHubHTTPError,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.utils import _http, get_session

FILES = {"config.json": b'{"rows": 4}', "weights/model.bin": b"\x00\x01\x02", "README.md": b"# tiny"}


def _read_folder(folder: str | Path) -> dict[str, bytes]:
    folder = Path(folder)
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def _download_one(repo_id: str, **kwargs) -> str:
    return hf_hub_download(repo_id, "config.json", **kwargs)


DOWNLOADS = pytest.mark.parametrize("download", [_download_one, snapshot_download], ids=["file", "snapshot"])


def test_snapshot_download_fetches_exactly_the_files_of_the_repo_into_the_empty_cache(hub, tmp_path):
    sha = hub.add_repo("org/tiny", FILES)
    folder = snapshot_download("org/tiny")
    assert Path(folder) == tmp_path / "hf-cache" / "models--org--tiny" / "snapshots" / sha
    assert _read_folder(folder) == FILES
    assert sorted(hub.downloaded("org/tiny")) == sorted(FILES)


def test_allow_patterns_fetch_only_the_allowed_files(hub):
    hub.add_repo("org/tiny", FILES)
    folder = snapshot_download("org/tiny", allow_patterns=["*.json"])
    assert _read_folder(folder) == {"config.json": FILES["config.json"]}
    assert hub.downloaded("org/tiny") == ["config.json"]


def test_revision_selects_a_branch_or_a_commit(hub):
    main = hub.add_repo("org/tiny", FILES)
    dev = hub.add_repo("org/tiny", {"config.json": "{}"}, revision="dev")
    assert _read_folder(snapshot_download("org/tiny", revision="dev")) == {"config.json": b"{}"}
    assert _read_folder(snapshot_download("org/tiny", revision=main)) == FILES
    assert hub.files("org/tiny", dev) == {"config.json": b"{}"}
    assert hf_hub_download("org/tiny", "config.json").endswith(f"{main}/config.json")


def test_hf_hub_download_fetches_one_file(hub):
    hub.add_repo("org/tiny", FILES)
    path = hf_hub_download("org/tiny", "weights/model.bin")
    assert Path(path).read_bytes() == FILES["weights/model.bin"]
    assert [(r.method, r.path) for r in hub.requests] == [
        ("HEAD", "/org/tiny/resolve/main/weights/model.bin"),
        ("GET", "/org/tiny/resolve/main/weights/model.bin"),
    ]


def test_tree_lists_top_level_folders_and_all_files_recursively(hub):
    hub.add_repo("org/tiny", FILES)
    api = HfApi()
    top = {(type(entry).__name__, entry.path) for entry in api.list_repo_tree("org/tiny")}
    assert top == {("RepoFile", "config.json"), ("RepoFile", "README.md"), ("RepoFolder", "weights")}
    assert sorted(api.list_repo_files("org/tiny")) == sorted(FILES)


@DOWNLOADS
def test_missing_repo_raises_repository_not_found(hub, download):
    with pytest.raises(RepositoryNotFoundError):
        download("org/absent")


@DOWNLOADS
def test_missing_revision_raises_revision_not_found(hub, download):
    hub.add_repo("org/tiny", FILES)
    with pytest.raises(RevisionNotFoundError):
        download("org/tiny", revision="absent")


def test_missing_file_raises_entry_not_found_from_the_server(hub):
    hub.add_repo("org/tiny", FILES)
    with pytest.raises(RemoteEntryNotFoundError):  # not the local variant, which a dead server would give
        hf_hub_download("org/tiny", "absent.json")


def test_cached_files_load_with_the_server_closed(hub):
    hub.add_repo("org/tiny", FILES)
    folder, file = snapshot_download("org/tiny"), _download_one("org/tiny")
    hub.close()
    assert snapshot_download("org/tiny", local_files_only=True) == folder
    assert _download_one("org/tiny", local_files_only=True) == file


def test_offline_mode_serves_from_the_cache(hub, monkeypatch):
    # `monkeypatch` after `hub`, so that it is undone before the fixture restores the client.
    hub.add_repo("org/tiny", FILES)
    folder = snapshot_download("org/tiny")
    hub.close()
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    assert snapshot_download("org/tiny") == folder
    assert _download_one("org/tiny") == f"{folder}/config.json"


def test_create_repo_and_upload_folder_store_what_snapshot_download_returns(hub, tmp_path):
    for path, content in FILES.items():
        (tmp_path / "upload" / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "upload" / path).write_bytes(content)
    # The module-level functions, as diffusers' push_to_hub calls them.
    url = huggingface_hub.create_repo("org/pushed")
    commit = huggingface_hub.upload_folder(repo_id=url.repo_id, folder_path=tmp_path / "upload")
    assert (url.repo_id, url.endpoint) == ("org/pushed", hub.url)
    stored = hub.files("org/pushed")
    assert stored == {**FILES, ".gitattributes": stored[".gitattributes"]}  # the Hub's first commit
    assert _read_folder(snapshot_download("org/pushed", revision=commit.oid)) == stored


def test_uploading_unchanged_files_makes_no_commit(hub, tmp_path):
    (tmp_path / "upload").mkdir()
    (tmp_path / "upload" / "config.json").write_bytes(FILES["config.json"])
    repo_id = HfApi().create_repo("org/pushed").repo_id
    first = HfApi().upload_folder(repo_id=repo_id, folder_path=tmp_path / "upload")
    second = HfApi().upload_folder(repo_id=repo_id, folder_path=tmp_path / "upload")
    assert second.oid == first.oid
    assert [r.path for r in hub.requests if r.path.endswith("/commit/main")] == ["/api/models/org/pushed/commit/main"]


def test_deletions_remove_files_and_folders(hub):
    hub.add_repo("org/tiny", FILES)
    api = HfApi()
    api.delete_file("README.md", repo_id="org/tiny")
    api.delete_folder("weights", repo_id="org/tiny")
    assert hub.files("org/tiny") == {"config.json": FILES["config.json"]}
    with pytest.raises(RemoteEntryNotFoundError):
        api.delete_file("README.md", repo_id="org/tiny")


def test_create_repo_conflicts_unless_exist_ok_and_defaults_to_the_user_namespace(hub):
    HfApi().create_repo("org/pushed")
    assert HfApi().create_repo("org/pushed", exist_ok=True).repo_id == "org/pushed"
    with pytest.raises(HfHubHTTPError) as conflict:
        HfApi().create_repo("org/pushed")
    assert conflict.value.response.status_code == 409
    assert HfApi().create_repo("solo").repo_id == f"{USER}/solo"


def test_only_a_token_passed_by_the_caller_reaches_the_server(hub):
    hub.add_repo("org/tiny", FILES)
    _download_one("org/tiny")
    snapshot_download("org/tiny", token="hf_loopback", force_download=True)
    assert [r.authorization for r in hub.requests[:2]] == [None, None]
    assert {r.authorization for r in hub.requests[2:]} == {"Bearer hf_loopback"}


def test_unknown_endpoints_answer_501_naming_themselves(hub):
    with pytest.raises(HfHubHTTPError, match="does not implement GET /api/whoami-v2"):
        HfApi().whoami(token="hf_loopback")


def test_requests_outside_the_loopback_hub_are_refused(hub):
    with pytest.raises(NetworkRefused):
        get_session().get("https://huggingface.co/api/models/gpt2")


def test_loopback_client_is_undone_and_the_server_stopped_on_exit(tmp_path):
    before = (constants.ENDPOINT, constants.HF_HUB_CACHE, constants.HF_TOKEN_PATH, huggingface_hub.hf_api.api.endpoint)
    factory = _http._GLOBAL_CLIENT_FACTORY
    with LoopbackHub(tmp_path / "hub") as server, loopback_client(server.url, tmp_path / "cache"):
        assert constants.ENDPOINT == huggingface_hub.hf_api.api.endpoint == HfApi().endpoint == server.url
        assert huggingface_hub.hf_hub_url("org/tiny", "a.json").startswith(server.url)
    after = (constants.ENDPOINT, constants.HF_HUB_CACHE, constants.HF_TOKEN_PATH, huggingface_hub.hf_api.api.endpoint)
    assert after == before
    assert _http._GLOBAL_CLIENT_FACTORY is factory
    address = urlsplit(server.url)
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((address.hostname, address.port), timeout=1).close()
