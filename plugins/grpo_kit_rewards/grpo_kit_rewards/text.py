"""What the rewards read of a completion: the text itself, or the content of a chat completion's last message."""


def completion_text(completion) -> str:
    return completion[-1]["content"] if isinstance(completion, list) else completion
