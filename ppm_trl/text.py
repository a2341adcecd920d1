"""Reading text out of dataset rows and TRL completions (pure; no TRL import)."""

from __future__ import annotations

from typing import Any


def problem_text(row: dict[str, Any]) -> str:
    """The problem statement of a row: the last user message of a conversational prompt, or the plain prompt."""
    prompt = row["prompt"]
    if isinstance(prompt, str):
        return prompt
    user_messages = [m["content"] for m in prompt if m.get("role") == "user"]
    content = user_messages[-1] if user_messages else prompt[-1]["content"]
    if isinstance(content, list):  # multimodal content blocks
        content = " ".join(block.get("text", "") for block in content if isinstance(block, dict))
    return content


def completion_text(completion: Any) -> str:
    """The text of one completion: a plain string, one message dict, or a list of messages.

    For a message list (TRL's conversational format, possibly multi-turn) the assistant messages are joined with
    newlines; content given as a list of parts (`{"type": "text", "text": ...}`) is concatenated.
    """
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        completion = [completion]
    if isinstance(completion, (list, tuple)):
        texts = []
        for message in completion:
            if not isinstance(message, dict):
                raise TypeError(f"a conversational completion must be a list of message dicts, got item {message!r}")
            if message.get("role", "assistant") != "assistant":
                continue
            texts.append(_content_text(message.get("content")))
        return "\n".join(texts)
    raise TypeError(
        f"a completion must be a string or a list of messages ({{'role', 'content'}}), got {type(completion).__name__}"
    )


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part.get("text", "") if isinstance(part, dict) else str(part) for part in content)
    return str(content)
