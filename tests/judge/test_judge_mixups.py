"""Answers for the wrong request (#23 item 4): a server that returns another request's answer.

`ShiftedJudge` answers each request with the scripted judge's answer to the request that arrived before it (the
first gets its own): the failure of a proxy or batching server that mixes up its queue. Before the checks, 15 of
16 such wrong grades were accepted and cached. Now a PPM answer must restate the criteria asked and quote the
rollout shown, and with `echo_nonce=True` every answer must start with the request's nonce; an answer that fails
a check is retried and never cached. What no check can see (documented in SECURITY.md): a well-formed answer to
another request with the same rubric whose quotes are also in this rollout, without the nonce.
"""

from __future__ import annotations

import functools
import os
import re
import threading

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # before LiteLLM is imported: no network

import pytest  # noqa: E402
from judge_server import JudgeServer, scripted_judge  # noqa: E402

from ppm_trl.judge import LiteLLMJudge, parse_numbered_grades, parse_point_grades  # noqa: E402
from ppm_trl.judge.cache import ResponseCache, request_fingerprint, request_key  # noqa: E402
from ppm_trl.judge.tasks import with_nonce  # noqa: E402

WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "theta", "kappa"]


def nonce_following(body: dict) -> str:
    """The scripted judge, starting its answer with the Request-ID line the prompt asks for (if it asks)."""
    prompt = "\n".join(m.get("content", "") for m in body.get("messages", []))
    asked = re.search(r"Request-ID: ([0-9a-f]+)", prompt)
    answer = scripted_judge(body)
    return f"Request-ID: {asked.group(1)}\n{answer}" if asked else answer


class ShiftedJudge:
    """Responder: each request gets the answer meant for the request that arrived before it."""

    def __init__(self):
        self._lock = threading.Lock()
        self._previous: dict | None = None
        self.shifted = 0

    def __call__(self, body: dict) -> str:
        with self._lock:
            previous, self._previous = self._previous, body
            self.shifted += previous is not None
        return nonce_following(previous if previous is not None else body)


def ppm_items(count: int, same_rubric: bool = False):
    """Items whose honest grades differ from their neighbours': problem i's rubric names three words, the rollout
    reaches the ones chosen by the bits of i."""
    items = []
    for i in range(count):
        words = WORDS[:3] if same_rubric else [WORDS[(i + k) % len(WORDS)] + str(i) for k in range(3)]
        points = [f'The solution contains "{word}".' for word in words]
        reached = [word for k, word in enumerate(words) if (i >> k) & 1 or k == i % 3]
        items.append((f"Problem {i}", points, f"Attempt number {i}: " + " ".join(reached)))
    return items


def honest_grades(items):
    return [[f'"{p.split(chr(34))[1]}"'.strip('"') in prefix for p in points] for _, points, prefix in items]


def _judge(server, cache_dir=None, **overrides):
    settings = dict(api_base=server.api_base, timeout=10, transport="openai_http", num_retries=3, backoff_base=0.0,
                    max_concurrency=1, cache_dir=cache_dir) | overrides
    return LiteLLMJudge("openai/shifted-judge", **settings)


def _cached_answers(judge, items, style="ppm"):
    """(messages, cached content) for every item whose request has a cache entry."""
    from ppm_trl.judge import prompts

    build = prompts.ppm_grading_messages if style == "ppm" else prompts.standard_rubric_messages
    cache = ResponseCache(judge.cache_dir)
    out = []
    for problem, points, prefix in items:
        messages = build(problem, points, prefix)
        if judge.echo_nonce:
            messages, _ = with_nonce(messages, str)
        fingerprint = request_fingerprint(judge.model, judge.api_base, judge.transport, messages, judge._cache_params)
        entry = cache.get(request_key(fingerprint))
        if entry is not None:
            out.append((messages, entry["content"]))
    return out


def test_shifted_answers_for_other_problems_are_refused_and_never_cached(tmp_path):
    items = ppm_items(16)
    honest = honest_grades(items)
    os.environ.setdefault("OPENAI_API_KEY", "sk-loopback-dummy-key")
    shifted = ShiftedJudge()
    with JudgeServer(responder=shifted) as server, _judge(server, str(tmp_path)) as judge:
        grades = judge.grade_prefixes(items)
    assert shifted.shifted >= 15  # the server did mix up answers
    wrong = [i for i, (got, want) in enumerate(zip(grades, honest)) if got is not None and got != want]
    assert wrong == []  # was 15 of 16 before the checks
    assert judge.stats.unparseable >= 15  # each mixed-up answer was refused (and retried)
    for messages, content in _cached_answers(judge, items):
        assert content == scripted_judge({"messages": messages})  # only answers to their own request are cached


def test_shifted_answers_for_other_rollouts_of_the_same_rubric_are_refused(tmp_path):
    # Same problem and rubric (the criteria check cannot tell them apart): the evidence quotes give them away.
    items = [("Problem", [f'The solution contains "{w}".' for w in WORDS[:3]],
              f"Attempt number {i} reaches " + " ".join(w for k, w in enumerate(WORDS[:3]) if (i >> k) & 1))
             for i in range(1, 8)]
    honest = honest_grades(items)
    os.environ.setdefault("OPENAI_API_KEY", "sk-loopback-dummy-key")
    with JudgeServer(responder=ShiftedJudge()) as server, _judge(server, str(tmp_path)) as judge:
        grades = judge.grade_prefixes(items)
    assert [i for i, (got, want) in enumerate(zip(grades, honest)) if got is not None and got != want] == []
    for messages, content in _cached_answers(judge, items):
        assert content == scripted_judge({"messages": messages})


def test_the_nonce_catches_what_the_content_checks_cannot(tmp_path):
    # Short rollouts of one rubric: quotes too short to prove anything, criteria identical. Without the nonce the
    # mix-up is invisible (documented); with it, no wrong grade is accepted or cached.
    items = [("Problem", [f'The solution contains "{w}".' for w in WORDS[:3]],
              " ".join(w for k, w in enumerate(WORDS[:3]) if (i >> k) & 1)) for i in range(1, 8)]
    honest = honest_grades(items)
    os.environ.setdefault("OPENAI_API_KEY", "sk-loopback-dummy-key")
    with JudgeServer(responder=ShiftedJudge()) as server, _judge(server, num_retries=0) as judge:
        blind = judge.grade_prefixes(items)
    assert sum(got is not None and got != want for got, want in zip(blind, honest)) >= 3  # the limit, shown
    with JudgeServer(responder=ShiftedJudge()) as server, _judge(server, str(tmp_path), echo_nonce=True) as judge:
        grades = judge.grade_prefixes(items)
        assert all("Request-ID: " in body["messages"][0]["content"] for body in server.bodies)
    assert [i for i, (got, want) in enumerate(zip(grades, honest)) if got is not None and got != want] == []
    assert any(got is not None for got in grades)  # retries met their own answer: the nonce refuses only mix-ups
    for messages, content in _cached_answers(judge, items):
        assert content == nonce_following({"messages": messages})


def test_the_nonce_protects_papo_and_standard_grading_too():
    reference = "Let x = 2.\nThen y = x + 3.\nSo \\boxed{5}."
    responses = ["Let x = 2.\nThen y = x + 3.\nSo \\boxed{5}.", "I guess \\boxed{7}.", "So \\boxed{5}.", "No idea."] * 2
    honest = [1.0, 0.0, 0.5, 0.0] * 2
    items = [("P", reference, r) for r in responses]
    os.environ.setdefault("OPENAI_API_KEY", "sk-loopback-dummy-key")
    with JudgeServer(responder=ShiftedJudge()) as server, _judge(server, num_retries=0) as judge:
        assert sum(g is not None and g != h for g, h in zip(judge.score_rubric(items), honest)) >= 3
    with JudgeServer(responder=ShiftedJudge()) as server, _judge(server, echo_nonce=True) as judge:
        scores = judge.score_rubric(items)
        standard = judge.grade_prefixes(ppm_items(6, same_rubric=True), style="standard")
    assert all(s is None or s == h for s, h in zip(scores, honest)) and any(s is not None for s in scores)
    assert all(g is None or g == h for g, h in zip(standard, honest_grades(ppm_items(6, same_rubric=True))))


# ------------------------------------------------------------------------------------------ the parser's checks
POINTS = ['The solution contains "alpha".', 'The solution contains "beta".']
ROLLOUT = "First we compute alpha = 2 and then we note that beta is not needed here."


def ppm_answer(criteria=None, evidence=None, grades=("YES", "NO"), verdicts=None):
    criteria = criteria or POINTS
    evidence = evidence or ["we compute alpha = 2 and then", "not present in rollout"]
    verdicts = verdicts or grades
    lines = ["Section 1 – Reasoning:"]
    for i, (criterion, quote, verdict) in enumerate(zip(criteria, evidence, verdicts), start=1):
        lines += [f"{i}. Criterion: {criterion}", f"Evidence: {quote}", "Reason: r.", f"Verdict: {verdict}."]
    lines.append("Section 2 – Grades:")
    lines += [f"{i}. {g}" for i, g in enumerate(grades, start=1)]
    return "\n".join(lines)


read = functools.partial(parse_point_grades, num_points=2, points=POINTS, rollout=ROLLOUT)


@pytest.mark.parametrize("answer", [
    ppm_answer(),
    ppm_answer(criteria=['**The solution contains  "alpha"**', "The solution contains 'beta'"]),  # decoration
    ppm_answer(criteria=["The solution contains", "The solution contains \u201cbeta\u201d."]),  # cut short, quotes
    ppm_answer(evidence=['"First we compute alpha = 2 ... beta is not needed"', "not present in rollout"]),
    ppm_answer(evidence=["**we  compute ALPHA = 2 and then**", "x = 2"]),  # case, spacing; a short quote
])
def test_answers_for_this_request_are_read(answer):
    assert read(answer) == [True, False]


@pytest.mark.parametrize("answer", [
    ppm_answer(criteria=['The solution contains "gamma".', POINTS[1]]),  # another rubric's criterion
    ppm_answer(criteria=[POINTS[1], POINTS[0]]),  # the criteria of another numbering
    ppm_answer(evidence=["we compute gamma = 7 and then stop", "not present in rollout"]),  # another rollout
    ppm_answer(evidence=["we compute gamma = 7 and then stop", "and beta is surely needed over there"]),
    ppm_answer(grades=("YES",), verdicts=("YES", "NO")),  # fewer grades than points
    ppm_answer(grades=("YES", "NO", "YES"), verdicts=("YES", "NO", "YES"), criteria=POINTS + ["extra"],
               evidence=["we compute alpha = 2 and then", "not present in rollout", "x"]),  # more
    ppm_answer(grades=("YES", "YES"), verdicts=("YES",)),  # Section 1 incomplete
])
def test_answers_for_another_request_are_refused(answer):
    assert read(answer) is None
    assert parse_point_grades(answer, 2) in (None, [True, False], [True, True])  # without the checks: read


@pytest.mark.parametrize("answer", ["1. YES", "1. YES\n2. NO\n3. YES", "1. YES\n1. NO", "2. YES\n1. NO"])
def test_standard_grade_count_must_equal_the_points(answer):
    assert parse_numbered_grades(answer, 2) is None


def test_nonce_parser_refuses_a_missing_or_other_nonce():
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    asked, parse = with_nonce(messages, str)
    nonce = re.search(r"Request-ID: ([0-9a-f]+)", asked[0]["content"]).group(1)
    assert messages[0]["content"] == "S"  # the caller's messages are not changed
    assert with_nonce(messages, str)[0] == asked  # deterministic: the same request, the same nonce (cacheable)
    assert with_nonce([messages[0], {"role": "user", "content": "V"}], str)[0][0]["content"] != asked[0]["content"]
    assert parse(f"Request-ID: {nonce}\nthe answer") == "the answer"
    assert parse(f"**Request-ID:** `{nonce}`\nthe answer") == "the answer"
    assert parse("the answer") is None
    assert parse(f"Request-ID: {'0' * 16}\nthe answer") is None
    assert parse(f"the answer\nRequest-ID: {nonce}") is None  # it must come first
    user_only, _ = with_nonce([{"role": "user", "content": "U"}], str)
    assert user_only[0]["content"].startswith("U\n\n") and "Request-ID: " in user_only[0]["content"]


def test_echo_nonce_is_a_judge_setting():
    import argparse

    from ppm_trl.judge.arguments import JudgeArguments
    from ppm_trl.prepare import add_prepare_arguments

    assert JudgeArguments(judge_echo_nonce=True).judge_kwargs("/tmp/out")["echo_nonce"] is True
    assert JudgeArguments().judge_kwargs("/tmp/out")["echo_nonce"] is False
    judge = LiteLLMJudge("openai/x", api_base="http://127.0.0.1:9/v1", echo_nonce=True)
    assert judge.config()["echo_nonce"] is True
    with pytest.raises(ValueError, match="echo_nonce"):
        LiteLLMJudge("openai/x", api_base="http://127.0.0.1:9/v1", echo_nonce="no")
    parsed = add_prepare_arguments(argparse.ArgumentParser()).parse_args(
        ["--dataset", "d", "--reference-column", "r", "--judge-model", "m", "--out", "o", "--echo-nonce"])
    assert parsed.judge_echo_nonce is True
