"""judge: an LLM-as-judge reward, asking any OpenAI-compatible server (`vllm serve`, a hosted API) for each score.

Each completion becomes one request: `template` is filled with the prompt, the completion and any dataset column
(`{prompt}`, `{completion}`, `{solution}`, ...), sent to `/v1/chat/completions` as the user message (`api=chat`,
the default: a judge model is served as a chat model) or to `/v1/completions` as the prompt (`api=completions`).
The score is read from the answer by `score_pattern`: its last match (a judge reasons first and concludes), the
pattern's first group where it has one, mapped linearly from [score_min, score_max] to [0, 1].

Requests run `concurrency` at a time, each within `timeout_s` seconds from connecting to its answer's last byte, and
an answer of at most 1 MiB. One that fails to get an answer (no connection, a timeout, HTTP 429 or 5xx, a broken or
malformed answer) is tried again up to `retries` times, `retry_delay_s` doubling each time. A redirect is never
followed: the API key goes to `base_url`'s host alone, and the score comes from it alone.
A row whose request still fails, or whose answer holds no score in range, is a judge failure, handled by
`on_failure`: `zero` scores it 0.0 and counts it in the metric `rewards/judge/failed_rows` (rows per batch), with
a warning the first time; `stop` stops the run with a RewardError naming the row and the cause. Never a silent
constant.
"""

import concurrent.futures
import http.client
import json
import logging
import math
import re
import string
import time
from urllib.parse import urlsplit

from grpo_kit import ConfigError, RewardError
from grpo_kit_rewards.text import completion_text

log = logging.getLogger(__name__)

FAILED_ROWS_METRIC = "rewards/judge/failed_rows"
ROUTES = {"chat": "/chat/completions", "completions": "/completions"}
RETRIED_STATUSES = {408, 429, 500, 502, 503, 504}  # the server is busy or restarting: asking again may work
MAX_ANSWER_BYTES = 1 << 20  # an answer of max_tokens tokens is a few KB: more is no judge's answer


class JudgeFailure(Exception):
    """The judge gave no usable score for a row."""


class Judge:
    def __init__(self, config):
        self.config = config
        if not config.base_url or not config.model:
            raise ConfigError(
                "The judge reward needs its server and model: set reward.judge.base_url (e.g. http://localhost:8000) "
                "and reward.judge.model (the name the server serves it under, as `vllm serve MODEL` shows)."
            )
        if config.api not in ROUTES:
            raise ConfigError(f"reward.judge.api={config.api} is not one of: {', '.join(ROUTES)}.")
        if config.on_failure not in ("zero", "stop"):
            raise ConfigError(f"reward.judge.on_failure={config.on_failure} is not one of: zero, stop.")
        if config.concurrency < 1 or config.timeout_s <= 0 or config.retries < 0:
            raise ConfigError("reward.judge needs concurrency >= 1, timeout_s > 0 and retries >= 0.")
        if not (math.isfinite(config.score_min) and math.isfinite(config.score_max)):
            raise ConfigError(
                f"reward.judge needs finite score_min and score_max, got {config.score_min}, {config.score_max}: "
                "they map the judge's scores linearly onto [0, 1]."
            )
        if not config.score_min < config.score_max:
            raise ConfigError(f"reward.judge needs score_min < score_max, got {config.score_min}, {config.score_max}.")
        if urlsplit(config.base_url).scheme not in ("http", "https"):
            raise ConfigError(f"reward.judge.base_url={config.base_url!r} must start with http:// or https://.")
        self.pattern = _compiled(config.score_pattern)
        self.fields = template_fields(config.template)
        base = config.base_url.rstrip("/")
        self.url = (base if base.endswith("/v1") else base + "/v1") + ROUTES[config.api]
        self._warned = False

    @property
    def required_columns(self) -> list[str]:
        return [name for name in self.fields if name not in ("prompt", "completion")]

    def __call__(self, prompts, completions, completion_ids, log_metric=None, **columns) -> list[float]:
        texts = [
            self.config.template.format(
                prompt=prompt_text(prompt),
                completion=completion_text(completion),
                **{name: columns[name][row] for name in self.required_columns},
            )
            for row, (prompt, completion) in enumerate(zip(prompts, completions))
        ]
        with concurrent.futures.ThreadPoolExecutor(min(self.config.concurrency, len(texts) or 1)) as pool:
            outcomes = list(pool.map(self._score_or_failure, texts))
        failed = [(row, outcome) for row, outcome in enumerate(outcomes) if isinstance(outcome, JudgeFailure)]
        if failed and self.config.on_failure == "stop":
            row, failure = failed[0]
            raise RewardError(
                f"The judge at {self.url} gave no score for {len(failed)} of {len(texts)} completions (row {row}: "
                f"{failure}), and reward.judge.on_failure=stop. Check that the server answers, or set "
                "reward.judge.on_failure=zero to score such rows 0 and count them in rewards/judge/failed_rows."
            )
        if failed and not self._warned:
            self._warned = True
            log.warning(
                "The judge at %s gave no score for %d of %d completions (row %d: %s): they score 0.0 "
                "(reward.judge.on_failure=zero). Not logged again; %s counts such rows.",
                self.url,
                len(failed),
                len(texts),
                failed[0][0],
                failed[0][1],
                FAILED_ROWS_METRIC,
            )
        if log_metric is not None:
            log_metric(FAILED_ROWS_METRIC, len(failed))
        return [0.0 if isinstance(outcome, JudgeFailure) else outcome for outcome in outcomes]

    def _score_or_failure(self, text: str) -> float | JudgeFailure:
        try:
            return self.score(self.answer(text), asked=text)
        except JudgeFailure as failure:
            return failure

    def answer(self, text: str) -> str:
        """The judge's answer to `text`, asking again after a failure that may pass."""
        c = self.config
        if c.api == "chat":
            messages = ([{"role": "system", "content": c.system_prompt}] if c.system_prompt else []) + [
                {"role": "user", "content": text}
            ]
            body = {"model": c.model, "messages": messages}
        else:
            body = {"model": c.model, "prompt": text}
        body |= {"max_tokens": c.max_tokens, "temperature": c.temperature}
        headers = {"Content-Type": "application/json"} | ({"Authorization": f"Bearer {c.api_key}"} if c.api_key else {})
        for attempt in range(c.retries + 1):
            try:
                status, reason, payload = post(self.url, json.dumps(body).encode(), headers, c.timeout_s)
                if status == 200:
                    return _answer_text(json.loads(payload), c.api)
                cause = f"HTTP {status} {reason}"
                if 300 <= status < 400:
                    raise JudgeFailure(
                        f"{cause}: the judge redirects, which is never followed (the API key goes to "
                        f"reward.judge.base_url's host alone); set base_url to where the judge answers"
                    )
                if status not in RETRIED_STATUSES:
                    raise JudgeFailure(cause)
            except (OSError, http.client.HTTPException) as error:  # refused, reset, timed out, a broken answer
                cause = f"{type(error).__name__}: {getattr(error, 'reason', error)}"
            except ValueError as error:  # not JSON, not UTF-8: a proxy's error page, say, worth asking again
                cause = f"the answer is not JSON ({error})"
            if attempt < c.retries:
                time.sleep(c.retry_delay_s * 2**attempt)
        raise JudgeFailure(f"{cause}, after {c.retries + 1} attempts")

    def score(self, answer: str, asked: str = "") -> float:
        """The answer's score, in [0, 1]; a judge that repeats the question first (as `echo` does) is read after it,
        where the question's own numbers ("from 0 to 10") cannot be taken for its score."""
        c = self.config
        if asked and asked in answer:
            answer = answer[answer.rindex(asked) + len(asked) :]
        matches = list(self.pattern.finditer(answer))
        if not matches:
            raise JudgeFailure(f"no score matching {c.score_pattern!r} in the answer {answer[:200]!r}")
        found = matches[-1].group(1 if self.pattern.groups else 0)
        try:
            value = float(found)
        except ValueError:
            raise JudgeFailure(f"the score {found!r} in the answer {answer[:200]!r} is not a number") from None
        if not c.score_min <= value <= c.score_max:
            raise JudgeFailure(f"the score {value:g} is outside [{c.score_min:g}, {c.score_max:g}]")
        return (value - c.score_min) / (c.score_max - c.score_min)


def post(url: str, body: bytes, headers: dict, timeout_s: float) -> tuple[int, str, bytes]:
    """POST `body` to `url` within `timeout_s` in all, from connecting to the answer's last byte (a socket's own
    timeout bounds each read alone, and a trickling answer would take as long as it likes); the status, its reason,
    and the body, refused beyond MAX_ANSWER_BYTES. Redirects are not followed."""
    deadline = time.monotonic() + timeout_s
    parts = urlsplit(url)
    connection_class = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    connection = connection_class(parts.hostname, parts.port, timeout=timeout_s)
    try:
        connection.request("POST", parts.path + (f"?{parts.query}" if parts.query else ""), body, headers)
        sock = connection.sock  # kept: a response that closes the connection takes it from `connection`
        sock.settimeout(_left(deadline))
        response = connection.getresponse()
        chunks, size = [], 0
        while chunk := _read(sock, response, deadline):
            size += len(chunk)
            if size > MAX_ANSWER_BYTES:
                raise JudgeFailure(f"the answer is larger than {MAX_ANSWER_BYTES} bytes: no judge's answer is")
            chunks.append(chunk)
        return response.status, response.reason, b"".join(chunks)
    finally:
        connection.close()


def _read(sock, response, deadline: float) -> bytes:
    sock.settimeout(_left(deadline))
    return response.read1(65536)


def _left(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("no whole answer within reward.judge.timeout_s")
    return left


def template_fields(template: str) -> list[str]:
    """The names `template` fills in, each a plain `{name}`; anything else is refused before the run starts."""
    try:
        parsed = [name for _, name, _, _ in string.Formatter().parse(template) if name is not None]
    except ValueError as error:
        raise ConfigError(
            f"reward.judge.template cannot be read as a format string ({error}): fields are written {{name}}, and "
            "a literal brace is doubled, {{ or }}."
        ) from None
    for name in parsed:
        if not name.isidentifier():
            raise ConfigError(
                f"reward.judge.template has the field {{{name}}}: write plain names only, {{prompt}}, {{completion}} "
                "or a dataset column such as {solution} (a literal brace is doubled, {{ or }})."
            )
    return list(dict.fromkeys(parsed))


def prompt_text(prompt) -> str:
    """A text prompt as it is; a chat prompt as its messages, one `role: content` line each."""
    if isinstance(prompt, list):
        return "\n".join(f"{message['role']}: {message['content']}" for message in prompt)
    return prompt


def _answer_text(response: dict, api: str) -> str:
    try:
        choice = response["choices"][0]
        text = choice["message"]["content"] if api == "chat" else choice["text"]
    except (KeyError, IndexError, TypeError):
        raise JudgeFailure(f"the response is not an OpenAI {api} response: {str(response)[:200]}") from None
    if not isinstance(text, str):
        raise JudgeFailure(f"the response's answer is {text!r}, not text")
    return text


def _compiled(pattern: str) -> re.Pattern:
    try:
        return re.compile(pattern)
    except re.error as error:
        raise ConfigError(f"reward.judge.score_pattern={pattern!r} is not a regular expression: {error}.") from None
