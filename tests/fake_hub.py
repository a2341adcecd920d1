"""A Hugging Face Hub on 127.0.0.1 that speaks the part of the Hub's HTTP API an upload uses — repo creation,
the model card's metadata check, pre-upload, commit — so that `push_to_hub` runs huggingface_hub's real client end to end (issue 44 item 3: the
upload list tested against a Hub, not a mock of the call). Every file arrives inline ("regular" upload mode, base64
in the commit's NDJSON) and is kept in `FakeHub.repos[repo_id][path] = bytes`. `refuse` answers every request with
that HTTP status instead (a token without write access: 403; none: 401)."""

from __future__ import annotations

import base64
import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

NAMESPACE = "someone"  # the account the fake token belongs to


class FakeHub:
    def __init__(self, refuse: int | None = None):
        self.refuse = refuse
        self.repos: dict[str, dict[str, bytes]] = {}
        self.created: list[str] = []
        self.commits: list[dict] = []  # each commit's header (summary, ...) and the paths it wrote
        self.requests: list[str] = []  # "METHOD path" of every request, in arrival order
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep the test output clean
                pass

            def _body(self) -> bytes:
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def _answer(self, status: int, payload: dict) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                hub.requests.append(f"GET {self.path}")
                if hub.refuse:
                    return self._answer(hub.refuse, {"error": "refused by the fake Hub"})
                if self.path.startswith("/api/whoami"):
                    return self._answer(200, {"name": NAMESPACE, "type": "user", "auth": {"type": "access_token"}})
                return self._answer(404, {"error": f"the fake Hub has no {self.path}"})

            def do_POST(self):
                hub.requests.append(f"POST {self.path}")
                body = self._body()
                if hub.refuse:
                    return self._answer(hub.refuse, {"error": "refused by the fake Hub"})
                parts = self.path.split("?")[0].strip("/").split("/")
                if parts[:2] == ["api", "validate-yaml"]:  # the model card's metadata check
                    return self._answer(200, {"errors": [], "warnings": []})
                if parts[:3] == ["api", "repos", "create"]:
                    request = json.loads(body)
                    repo_id = f"{request.get('organization') or NAMESPACE}/{request['name']}"
                    hub.created.append(repo_id)
                    hub.repos.setdefault(repo_id, {})
                    return self._answer(200, {"url": f"{hub.endpoint}/{repo_id}", "name": repo_id})
                if len(parts) >= 6 and parts[0] == "api" and parts[1] == "models" and parts[4] == "preupload":
                    files = json.loads(body)["files"]
                    return self._answer(200, {"files": [{"path": f["path"], "uploadMode": "regular",
                                                         "shouldIgnore": False} for f in files],
                                              "commitOid": "0" * 40})
                if len(parts) >= 6 and parts[0] == "api" and parts[1] == "models" and parts[4] == "commit":
                    repo_id = f"{parts[2]}/{parts[3]}"
                    header, written = {}, []
                    for line in body.decode().splitlines():
                        item = json.loads(line)
                        if item["key"] == "header":
                            header = item["value"]
                        elif item["key"] == "file":
                            value = item["value"]
                            hub.repos.setdefault(repo_id, {})[value["path"]] = base64.b64decode(value["content"])
                            written.append(value["path"])
                        elif item["key"] == "deletedFile":
                            hub.repos.get(repo_id, {}).pop(item["value"]["path"], None)
                    hub.commits.append({"repo_id": repo_id, "header": header, "paths": written})
                    oid = hashlib.sha1(body).hexdigest()
                    return self._answer(200, {"success": True, "commitOid": oid, "pullRequestUrl": None,
                                              "commitUrl": f"{hub.endpoint}/{repo_id}/commit/{oid}"})
                return self._answer(404, {"error": f"the fake Hub has no {self.path}"})

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> FakeHub:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()
