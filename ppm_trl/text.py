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
    """Text of a TRL completion: a plain string, or the assistant messages of a conversational completion."""
    if isinstance(completion, str):
        return completion
    return "".join(m["content"] for m in completion if m.get("role") == "assistant" and isinstance(m["content"], str))
