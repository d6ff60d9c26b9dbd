"""A small OpenAI-compatible judge for the judge reward's tests: a real HTTP server on loopback, in a thread.

It answers `/v1/chat/completions` and `/v1/completions` with the accuracy of the sum its prompt ends with ("3+4=7"
-> "1", anything else -> "0"), so that a run judged by it learns the embedded task. A test sets `behaviour` to make
it fail: "busy" answers HTTP 503 to the next `failures` requests, "slow" sleeps `delay_s` first, "garbage"
answers text without a number, "redirect" answers 302 to `redirect_to`, "echo" repeats the question before its
verdict, "trickle" sends its answer a byte every `delay_s`, "huge" sends 2 MB. "broken" breaks the next `failures`
answers as `broken` says: "json" (not JSON), "html" (an error page), "utf8" (bytes that are no UTF-8), "truncated"
(a body shorter than its Content-Length), "status" (no HTTP status line). `authorizations` records the
Authorization header of every request.
"""

import contextlib
import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

SUM = re.compile(r"(\d+)\+(\d+)=(\d+)\s*$")


class JudgeServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128  # socketserver's 5 would drop concurrent connections, each then retried a second later

    def __init__(self):
        super().__init__(("127.0.0.1", 0), JudgeHandler)
        self.url = f"http://127.0.0.1:{self.server_address[1]}"
        self.reset()

    def reset(self):
        self.behaviour, self.failures, self.delay_s, self.requests = "right", 0, 0.0, 0
        self.broken, self.redirect_to, self.authorizations = "json", "", []


class JudgeHandler(BaseHTTPRequestHandler):
    def log_message(self, *args):  # quiet
        pass

    def do_POST(self):
        server: JudgeServer = self.server
        server.requests += 1
        server.authorizations.append(self.headers.get("Authorization"))
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if server.behaviour == "busy" and server.failures > 0:
            server.failures -= 1
            return self._send(503, {"error": "busy"})
        if server.behaviour == "redirect":
            self.send_response(302)
            self.send_header("Location", server.redirect_to + self.path)
            self.send_header("Content-Length", "0")
            return self.end_headers()
        if server.behaviour == "broken" and server.failures > 0:
            server.failures -= 1
            return self._send_broken(server.broken)
        if server.behaviour == "slow":
            time.sleep(server.delay_s)
        chat = self.path == "/v1/chat/completions"
        if not chat and self.path != "/v1/completions":
            return self._send(404, {"error": f"no route {self.path}"})
        question = body["messages"][-1]["content"] if chat else body["prompt"]
        match = SUM.search(question)
        verdict = str(int(bool(match) and int(match[1]) + int(match[2]) == int(match[3])))
        answer = "I cannot tell." if server.behaviour == "garbage" else f"Verdict: {verdict}"
        if server.behaviour == "echo":  # as `echo: true` does: the question, whose template says "0 to 10", first
            answer = f"{question} {answer}"
        if server.behaviour == "huge":
            answer += " " * 2_000_000
        choice = {"index": 0, "finish_reason": "stop"}
        choice |= {"message": {"role": "assistant", "content": answer}} if chat else {"text": answer}
        self._send(200, {"id": "judge", "object": "chat.completion", "model": body["model"], "choices": [choice]})

    def _send(self, status: int, payload: dict):
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.server.behaviour == "trickle":
            for byte in data:
                self.wfile.write(bytes([byte]))
                self.wfile.flush()
                time.sleep(self.server.delay_s)
            return
        self.wfile.write(data)

    def _send_broken(self, how: str):
        if how == "status":
            self.wfile.write(b"garbage instead of a status line\r\n\r\n")
            return
        data = {
            "json": b'{"choices": [{"message": {"content": "Verdict: 1"',
            "html": b"<html><body>502 Bad Gateway</body></html>",
            "utf8": b'{"choices": [{"message": {"content": "\xff\xfe Verdict: 1"}}]}',
            "truncated": b'{"choices": [',
        }[how]
        self.send_response(200)
        self.send_header("Content-Length", str(len(data) + (100 if how == "truncated" else 0)))
        self.end_headers()
        self.wfile.write(data)
        self.close_connection = True


@contextlib.contextmanager
def serving():
    server = JudgeServer()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="session")
def judge_server():
    with serving() as server:
        yield server


@pytest.fixture
def judge(judge_server):
    """The server, behaving well at the start of each test."""
    judge_server.reset()
    return judge_server


@pytest.fixture
def judge_server_elsewhere():
    """A second judge, on another port: another host as far as the client's credentials are concerned."""
    with serving() as server:
        yield server
