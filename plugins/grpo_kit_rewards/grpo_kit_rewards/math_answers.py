"""Is an answer right? math-verify (https://github.com/huggingface/Math-Verify) compares it with the gold answer.

Both are parsed with math-verify's default extraction (LaTeX, then plain expressions), so "12", "$12$",
"\\boxed{12}", "0.5" and "\\frac{1}{2}" all parse. math-verify bounds each parse and comparison with
signal.alarm, which Python allows only on a main thread: the Scorer runs the math rewards on the main thread of
its worker processes, where those bounds work. Anywhere else they are switched off, and the caller bounds the
whole call (the Scorer's timeout does).
"""

import functools
import logging
import threading

from math_verify import parse, verify

PARSE_TIMEOUT_S, VERIFY_TIMEOUT_S = 10, 5  # TRL's bounds for its math rewards


class _DropTimeoutDisabledNotice(logging.Filter):
    """math-verify warns when its timeouts are off; here that is deliberate, so only that one notice is dropped."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Timeout is disabled")


_NOTICE_FILTER = _DropTimeoutDisabledNotice()
for _logger in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(_logger).addFilter(_NOTICE_FILTER)


def is_correct(answer: str, gold: str) -> float | None:
    """1.0 if `answer` states the gold answer, 0.0 if not, None if the gold answer itself cannot be parsed."""
    on_main_thread = threading.current_thread() is threading.main_thread()
    parse_timeout = PARSE_TIMEOUT_S if on_main_thread else None
    gold, answer = gold.strip(), answer.strip()
    gold_parsed = _parse(gold, parse_timeout)
    if not gold_parsed:
        return None
    if answer == gold:  # the common case in a batch of short answers, without a parse
        return 1.0
    verify_timeout = VERIFY_TIMEOUT_S if on_main_thread else None
    return float(verify(gold_parsed, _parse(answer, parse_timeout), timeout_seconds=verify_timeout))


@functools.lru_cache(maxsize=4096)  # gold answers repeat num_generations times in a batch
def _parse(text: str, timeout: int | None) -> list:
    return parse(text, parsing_timeout=timeout)
