"""A small OpenAI-compatible judge for the judge reward's tests: a real HTTP server on loopback, in a thread.

It answers `/v1/chat/completions` and `/v1/completions` with the accuracy of the sum its prompt ends with ("3+4=7"
-> "1", anything else -> "0"), so that a run judged by it learns the embedded task. A test sets `behaviour` to make
it fail: "busy" answers HTTP 503 to the next `failures` requests, "slow" sleeps `delay_s` first, "garbage"
answers text without a number.
"""

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


class JudgeHandler(BaseHTTPRequestHandler):
    def log_message(self, *args):  # quiet
        pass

    def do_POST(self):
        server: JudgeServer = self.server
        server.requests += 1
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if server.behaviour == "busy" and server.failures > 0:
            server.failures -= 1
            return self._send(503, {"error": "busy"})
        if server.behaviour == "slow":
            time.sleep(server.delay_s)
        chat = self.path == "/v1/chat/completions"
        if not chat and self.path != "/v1/completions":
            return self._send(404, {"error": f"no route {self.path}"})
        question = body["messages"][-1]["content"] if chat else body["prompt"]
        match = SUM.search(question)
        verdict = str(int(bool(match) and int(match[1]) + int(match[2]) == int(match[3])))
        answer = "I cannot tell." if server.behaviour == "garbage" else f"Verdict: {verdict}"
        choice = {"index": 0, "finish_reason": "stop"}
        choice |= {"message": {"role": "assistant", "content": answer}} if chat else {"text": answer}
        self._send(200, {"id": "judge", "object": "chat.completion", "model": body["model"], "choices": [choice]})

    def _send(self, status: int, payload: dict):
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture(scope="session")
def judge_server():
    server = JudgeServer()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture
def judge(judge_server):
    """The server, behaving well at the start of each test."""
    judge_server.reset()
    return judge_server
