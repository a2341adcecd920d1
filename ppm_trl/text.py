"""Reading text out of dataset rows and TRL completions, and the final `\\boxed{}` answer (pure; no TRL import).

The bottom of the import graph: it imports nothing from `ppm_trl`, so `rewards`, `envs/` and the trainers can all
use it without importing each other.
"""

from __future__ import annotations

import re
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


# `\boxed{`, an escaped brace `\{` `\}` (a literal character), or a brace.
_BOX_TOKEN = re.compile(r"\\boxed\s*\{|\\[{}]|[{}]")


def boxed_spans(text: str) -> list[tuple[int, int | None]]:
    """(start, end) of the contents of every `\\boxed{...}`, in the order the boxes open; end is None for a box
    that is never closed. Escaped braces (`\\{`, `\\}`) are literal characters, not nesting.

    One pass with a stack of the open boxes, so the time is linear in `len(text)` however many boxes are left
    unclosed (scanning forward from each box would be quadratic on a run of unclosed `\\boxed{`).
    """
    spans: list[tuple[int, int | None]] = []
    open_boxes: list[tuple[int, int]] = []  # (index in spans, brace depth just before the box opened)
    depth = 0
    for match in _BOX_TOKEN.finditer(text):
        token = match.group()
        if token == "{":
            depth += 1
        elif token == "}":
            depth -= 1
            if open_boxes and open_boxes[-1][1] == depth:  # the brace that brings the depth back closes the box
                index, _ = open_boxes.pop()
                spans[index] = (spans[index][0], match.start())
        elif token.endswith("{") and token.startswith("\\boxed"):
            open_boxes.append((len(spans), depth))
            spans.append((match.end(), None))
            depth += 1
    return spans


def last_boxed(text: str) -> str | None:
    """Content of the LAST `\\boxed{...}` in `text`, matching nested braces; None if absent or unclosed.

    Escaped braces (`\\{`, `\\}`) are literal characters, not nesting. An unclosed last box (a truncated
    completion) gives None rather than an earlier box: the final answer is the last one written. Linear time
    (`boxed_spans`).
    """
    if not isinstance(text, str):
        return None
    spans = boxed_spans(text)
    if not spans or spans[-1][1] is None:
        return None
    start, end = spans[-1]
    return text[start:end]


# The other spellings of a boxed final answer that solutions use: `\fbox{7}` (LaTeX's plain frame box) and
# `\boxed 4` (a one-token argument without braces, which LaTeX accepts).
_FBOX = re.compile(r"\\fbox(?=\s*\{)")
_BRACELESS_BOX = re.compile(r"\\boxed[ \t]+([^\s${}\\]+?)([.,;:]?)(?=\s|\$|$)")


def normalize_boxes(text: Any) -> Any:
    """A solution with `\\fbox{7}` and `\\boxed 4` written as `\\boxed{7}` and `\\boxed{4}`, the one spelling every
    reader here (`last_boxed`, ARG's answer marker, the judge's answer check) looks for; other values unchanged.

    Applied to dataset text (gold answers, reference solutions) when it is read, never to completions: what a
    completion must write to earn its reward is the reward function's business."""
    if not isinstance(text, str) or ("\\fbox" not in text and "\\boxed" not in text):
        return text
    text = _FBOX.sub(r"\\boxed", text)
    return _BRACELESS_BOX.sub(lambda m: "\\boxed{" + m.group(1) + "}" + m.group(2), text)
