"""A stand-in for the Hugging Face Hub's routes that pushing a model uses, served on loopback in a thread, so that
`trainer.push_to_hub` (and a plugin's own uploads) can be tested with no network and no account.

It answers what huggingface_hub 2.x sends for `whoami`, `create_repo`, `repo_info`, `create_branch` and
`upload_folder`/`create_commit` (the README's metadata check, the preupload call, and the NDJSON commit), and keeps
every repo's files per branch so that a test can read what was pushed. Every file is taken as a regular upload
(base64 inside the commit), which the Hub's protocol allows; the LFS and Xet transfers of large files are not stood
in, so a file over `max_file_size` is refused as the Hub would refuse a regular upload of it.

    with HubStandIn(tokens={"hf_test": "alice"}) as hub:
        HfApi(endpoint=hub.url).create_repo("model", token="hf_test")   # or HF_ENDPOINT=hub.url in a subprocess
        hub.files("alice/model")
"""

import base64
import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

import yaml


@dataclass
class Repo:
    """A stood-in repo: its files and head commit per branch, and its commits' messages, oldest first."""

    private: bool
    branches: dict[str, dict[str, bytes]] = field(default_factory=lambda: {"main": {}})
    heads: dict[str, str] = field(default_factory=lambda: {"main": "0" * 40})
    commits: list[str] = field(default_factory=list)


class HubStandIn:
    """The stand-in server. `tokens` maps each accepted token to its user; `refuse` names repos whose creation is
    refused (403, as for a namespace the token may not write to); after `fail_commits_after` commits every later
    commit fails with `fail_status`, as an outage in the middle of a run would (huggingface_hub retries a 5xx for
    some 20 seconds before it gives up; a 403, as for a storage quota exceeded, at once)."""

    def __init__(
        self,
        tokens: dict[str, str],
        refuse: tuple[str, ...] = (),
        fail_commits_after: int | None = None,
        fail_status: int = 500,
        max_file_size: int = 10 * 2**20,
    ):
        self.tokens, self.refuse, self.fail_commits_after = tokens, set(refuse), fail_commits_after
        self.max_file_size, self.fail_status = max_file_size, fail_status
        self.repos: dict[str, Repo] = {}
        self.requests: list[tuple[str, str, str | None]] = []  # (method, path, token) of every request
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.held: threading.Event | None = None

    def hold_uploads(self) -> threading.Event:
        """From now on each upload waits at its preupload call, before huggingface_hub has read the files' contents,
        until the event returned is set (for a minute at most), as a slow upload would."""
        self.held = threading.Event()
        return self.held

    def __enter__(self) -> "HubStandIn":
        self.thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.server.shutdown()
        self.server.server_close()

    def files(self, repo_id: str, branch: str = "main") -> dict[str, bytes]:
        """The files of `repo_id` on `branch` as pushed, by path."""
        return dict(self.repos[repo_id].branches[branch])

    @property
    def commits(self) -> int:
        return sum(len(repo.commits) for repo in self.repos.values())


def git_blob_id(content: bytes) -> str:
    """The object id git gives a file's content, which the preupload route reports for files already pushed."""
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


REPO_ROUTE = re.compile(
    r"^/api/models/(?P<repo>[^/]+/[^/]+)(?:/(?P<action>revision|preupload|commit|branch)/(?P<rev>.+))?$"
)


def _handler(hub: HubStandIn) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:  # the test's output is not the place for an access log
            pass

        def do_GET(self) -> None:
            self.dispatch("GET")

        def do_POST(self) -> None:
            self.dispatch("POST")

        def dispatch(self, method: str) -> None:
            path = unquote(urlsplit(self.path).path)
            header = self.headers.get("authorization", "")
            token = header.removeprefix("Bearer ") if header.startswith("Bearer ") else None
            body = self.rfile.read(int(self.headers.get("content-length") or 0))
            if hub.held is not None and "/preupload/" in path:
                hub.held.wait(timeout=60)
            with hub.lock:
                hub.requests.append((method, path, token))
                status, answer = _answer(hub, method, path, token, body)
            data = json.dumps(answer).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            if status == 404:
                self.send_header("X-Error-Code", "RepoNotFound")
            self.end_headers()
            self.wfile.write(data)

    return Handler


def _answer(hub: HubStandIn, method: str, path: str, token: str | None, body: bytes) -> tuple[int, dict]:
    """The status and JSON body of one request."""
    user = hub.tokens.get(token)
    if path == "/api/agent-harnesses" and method == "GET":  # huggingface_hub's own telemetry: no agents known
        return 200, {"standardEnvVars": [], "harnesses": {}}
    if path == "/api/validate-yaml" and method == "POST":
        return _validate_yaml(json.loads(body)["content"])
    if user is None:
        return 401, {"error": "Invalid credentials in Authorization header"}
    if path == "/api/whoami-v2" and method == "GET":
        return 200, {"type": "user", "name": user, "orgs": [], "auth": {"type": "access_token"}}
    if path == "/api/repos/create" and method == "POST":
        return _create(hub, user, json.loads(body))
    route = REPO_ROUTE.match(path)
    repo = hub.repos.get(route["repo"]) if route else None
    if repo is None or not route["repo"].startswith(f"{user}/"):
        return 404, {"error": "Repository not found"}
    branch = route["rev"] or "main"
    if route["action"] == "branch" and method == "POST":
        if branch in repo.branches:
            return 409, {"error": f"Reference {branch} already exists"}
        repo.branches[branch], repo.heads[branch] = dict(repo.branches["main"]), repo.heads["main"]
        return 200, {}
    if branch not in repo.branches:
        return 404, {"error": f"Invalid rev id: {branch}"}
    if route["action"] in (None, "revision") and method == "GET":
        files = [{"rfilename": name} for name in sorted(repo.branches[branch])]
        return 200, {"id": route["repo"], "sha": repo.heads[branch], "private": repo.private, "siblings": files}
    if route["action"] == "preupload" and method == "POST":
        return _preupload(hub, repo.branches[branch], json.loads(body)["files"], repo.heads[branch])
    if route["action"] == "commit" and method == "POST":
        return _commit(hub, route["repo"], repo, branch, body)
    return 405, {"error": f"{method} {path} is not a route of the stand-in"}


def _create(hub: HubStandIn, user: str, payload: dict) -> tuple[int, dict]:
    namespace = payload.get("organization") or user
    repo_id = f"{namespace}/{payload['name']}"
    if namespace != user or repo_id in hub.refuse:
        return 403, {"error": f"You don't have the rights to create a model under the namespace {namespace!r}"}
    if repo_id in hub.repos:
        return 409, {"error": "You already created this model repo", "url": f"{hub.url}/{repo_id}"}
    hub.repos[repo_id] = Repo(private=payload.get("visibility") == "private")
    return 200, {"url": f"{hub.url}/{repo_id}", "name": repo_id}


def _validate_yaml(content: str) -> tuple[int, dict]:
    """The Hub's check of a README's metadata: YAML between two `---` lines at the top, a mapping."""
    if not content.startswith("---\n"):
        return 200, {"errors": [], "warnings": [{"message": "empty or missing yaml metadata in repo card"}]}
    try:
        metadata = yaml.safe_load(content[4:].split("\n---\n", 1)[0])
    except yaml.YAMLError as error:
        return 400, {"errors": [{"message": f"Invalid YAML: {error}"}]}
    if not isinstance(metadata, dict):
        return 400, {"errors": [{"message": "The metadata must be a mapping"}]}
    return 200, {"errors": [], "warnings": []}


def _preupload(hub: HubStandIn, files: dict[str, bytes], asked: list[dict], head: str) -> tuple[int, dict]:
    too_big = [item["path"] for item in asked if item["size"] > hub.max_file_size]
    if too_big:
        return 400, {"error": f"The stand-in takes regular uploads only, and these are too big: {too_big}"}
    answer = [
        {
            "path": item["path"],
            "uploadMode": "regular",
            "shouldIgnore": False,
            "oid": git_blob_id(files[item["path"]]) if item["path"] in files else None,
        }
        for item in asked
    ]
    return 200, {"files": answer, "commitOid": head}


def _commit(hub: HubStandIn, repo_id: str, repo: Repo, branch: str, body: bytes) -> tuple[int, dict]:
    """The NDJSON commit: a header line, then one line per file added (base64) or deleted."""
    if hub.fail_commits_after is not None and hub.commits >= hub.fail_commits_after:
        return hub.fail_status, {"error": f"The stand-in fails every commit after the first {hub.fail_commits_after}"}
    lines = [json.loads(line) for line in body.splitlines() if line.strip()]
    header, operations = lines[0], lines[1:]
    files = dict(repo.branches[branch])
    for operation in operations:
        key, value = operation["key"], operation["value"]
        if key == "file":
            files[value["path"]] = base64.b64decode(value["content"])
        elif key == "deletedFile":
            files.pop(value["path"], None)
        elif key == "deletedFolder":
            files = {path: data for path, data in files.items() if not path.startswith(value["path"].rstrip("/") + "/")}
        else:
            return 400, {"error": f"The stand-in takes regular uploads only, not {key!r}"}
    oid = hashlib.sha1(
        f"{len(repo.commits)}{repo.heads[branch]}{header['value']['summary']}{sorted(files)}".encode()
    ).hexdigest()
    repo.branches[branch], repo.heads[branch] = files, oid
    repo.commits.append(header["value"]["summary"])
    return 200, {"success": True, "commitOid": oid, "commitUrl": f"{hub.url}/{repo_id}/commit/{oid}"}
