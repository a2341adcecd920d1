"""Does a rubric point state the gold final answer? math-verify, so `72`, `72.0`, `\\$72` and `$\\frac{1}{2}$` vs
`0.5` agree and `720` does not pass for `72`.

`ppm-trl prepare` asks the judge for reasoning points whose last one states the final answer; a rubric that ends
on another answer is rejected (and re-asked). Both sides go through math-verify: the gold answer as if boxed, the
point with its usual extraction (a `\\boxed{}`, an "answer is" anchor, else the last expression). When either side
is not a math expression (a multiple-choice letter, a word) the check falls back to the normalised containment of
`parsing.answer_in_text`.
"""

from __future__ import annotations

import logging
import re
import threading

from ppm_trl.judge import parsing

_MAX_VERIFIED_CHARS = 2_000  # math-verify on a longer point could stall the judge's event loop: containment only
_THOUSANDS = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?")


def clean_answer(answer: str) -> str:
    """The gold answer without dollar signs (`\\$72`, `$72$`), a trailing period or thousands separators."""
    text = str(answer).strip().replace("\\$", "").replace("$", "").strip().rstrip(".").strip()
    return text.replace(",", "") if _THOUSANDS.fullmatch(text) else text


def states_answer(text: str, answer: str) -> bool:
    """Whether `text` (the last reasoning point) states `answer` (the gold final answer)."""
    gold = clean_answer(answer)
    if not gold or not str(text).strip():
        return False
    if len(text) <= _MAX_VERIFIED_CHARS and len(gold) <= _MAX_VERIFIED_CHARS:
        verdict = _math_verify(str(text), gold)
        if verdict is not None:
            return verdict
    return parsing.answer_in_text(gold, str(text))


def _math_verify(text: str, gold: str) -> bool | None:
    """math-verify's verdict, or None when either side is not a math expression it can read."""
    from latex2sympy2_extended import NormalizationConfig
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    # signal-based timeouts only work on the main thread; the judge parses on its background loop's thread
    timeout = 5 if threading.current_thread() is threading.main_thread() else None
    if timeout is None:
        logging.getLogger("math_verify").setLevel(logging.ERROR)  # its "timeout unavailable" warning, per call
    config = [LatexExtractionConfig(normalization_config=NormalizationConfig(units=True), boxed_match_priority=0),
              ExprExtractionConfig()]
    try:
        gold_parsed = parse("\\boxed{" + gold + "}", parsing_timeout=timeout)
        stated = parse(text, extraction_config=config, parsing_timeout=timeout)
        if not gold_parsed or not stated:
            return None
        return bool(verify(gold_parsed, stated, timeout_seconds=timeout))
    except Exception:  # math-verify raises on some inputs (and on a timeout): not a math verdict
        return None
