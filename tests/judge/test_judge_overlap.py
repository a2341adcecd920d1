"""Issue #17 part 3 (PPM) and issue 24 item 4 (PAPO): the judge starts as soon as a batch's completions exist (PAPO:
and its outcome rewards, computed right then) and runs while TRL computes the old-policy log-probs; overlapped or
not, the same texts are graded once, with the same numbers, the same cache and the same errors."""

from __future__ import annotations

import os
import threading

import pytest
import torch
from datasets import Dataset
from helpers import TINY_ARGS, build_trainer, capture_outputs, script_generation
from judge_server import JudgeServer

from ppm_trl.envs import make_dataset
from ppm_trl.judge.callback import JudgeUnscorableError
from ppm_trl.judge.client import PROBE_MAX_TOKENS
from ppm_trl.rewards import accuracy_reward, env_outcome_reward
from ppm_trl.trainers.base import Rollout

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
G, K, BUDGET = 4, 4, 64
WORKER = "ppm-trl-scoring"  # the name of the base's background worker thread (a prefix)
# num_iterations=2: TRL computes the old-policy log-probs of every generation batch (the pass the judge hides under)
SETTINGS = dict(per_device_train_batch_size=8, num_generations=G, max_completion_length=BUDGET, num_segments=K,
                max_steps=4, num_iterations=2, filter_zero_advantage_groups=False, learning_rate=1e-3, **TINY_ARGS)
# the composed trainers (ARG + PPM, ARG + PAPO): one step, all-failure groups guided to the reference
ARG_SETTINGS = dict(per_device_train_batch_size=8, num_generations=G, max_completion_length=48, max_steps=1,
                    arg_num_continuations=3, arg_max_accepted=2, arg_min_continuation_tokens=16, learning_rate=1e-3,
                    warmup_steps=0, num_iterations=2)
UNTIMED = ("runtime", "per_second", "latency", "step_time", "wait_s")  # wall-clock metrics: the only ones allowed to differ


class RecordingScorer:
    """Wraps a progress (PPM) or process (PAPO) scorer: which thread called it, with which texts; optionally raises."""

    def __init__(self, inner=None, error: Exception | None = None):
        self.inner, self.error = inner, error
        self.calls, self.started = [], threading.Event()

    def __call__(self, rows, texts):
        self.started.set()
        on_worker = threading.current_thread().name.startswith(WORKER)
        # PPM's texts: one list of prefixes per row; PAPO's: one string per correct row
        self.calls.append((WORKER if on_worker else "training thread",
                           [t if isinstance(t, str) else list(t) for t in texts]))
        if self.error is not None:
            raise self.error
        return self.inner(rows, texts)

    @property
    def stats(self):
        return getattr(self.inner, "stats", {})


def _references(dataset):
    return {row["prompt"][0]["content"]: row["reference"] for row in dataset}


def _countdown_completions(dataset):
    references = _references(dataset)

    def completion_for(prompt_text, index):
        reference = next(r for p, r in references.items() if p in prompt_text)
        lines = reference.split("\n")
        return ["\n".join(lines), lines[0] + "\nno", "z" * 20, "\n".join(lines[:2])][index % G]

    return completion_for


def _logged(trainer):
    return [{k: v for k, v in log.items() if not any(word in k for word in UNTIMED)}
            for log in trainer.state.log_history]


def _train_programmatic(tmp_path, overlap, scorer=None, **overrides):
    dataset = make_dataset("multi_countdown", 2, 4, seed=0)
    trainer = build_trainer("ppm", tmp_path / f"out_{overlap}", train_dataset=dataset, overlap_scoring=overlap,
                            **{**SETTINGS, **overrides})
    recorder = RecordingScorer(trainer.progress_scorer) if scorer is None else scorer
    trainer.progress_scorer = recorder
    script_generation(trainer, _countdown_completions(dataset))
    outputs = capture_outputs(trainer)
    trainer.train()
    return trainer, outputs, recorder


def test_overlap_on_and_off_train_identically_with_the_programmatic_scorer(tmp_path):
    runs = {overlap: _train_programmatic(tmp_path, overlap) for overlap in (True, False)}
    (on, on_outputs, on_scorer), (off, off_outputs, off_scorer) = runs[True], runs[False]
    # Overlapped: every batch was scored on the worker; sequential: on the training thread, as before.
    assert [name for name, _ in on_scorer.calls] == [WORKER] * 2
    assert all(name != WORKER for name, _ in off_scorer.calls) and len(off_scorer.calls) == 2
    assert [texts for _, texts in on_scorer.calls] == [texts for _, texts in off_scorer.calls]  # the same texts
    assert len(on_outputs) == len(off_outputs) == 2  # two generation batches, each trained on twice
    for a, b in zip(on_outputs, off_outputs):
        assert "old_per_token_logps" in a  # the log-prob pass the scoring ran under did run
        assert torch.equal(a["advantages"], b["advantages"])
        assert torch.equal(a["old_per_token_logps"], b["old_per_token_logps"])
    assert _logged(on) == _logged(off)  # losses, progress metrics, scorer counters: all equal
    assert len({round(log["ppm/final_progress"], 6) for log in _logged(on) if "ppm/final_progress" in log}) >= 1
    assert any(log.get("loss", 0) != 0 for log in _logged(on))


def _judge_dataset():
    points = ['computes "alpha"', 'computes "beta"', 'states the final answer "\\boxed{7}"']
    return Dataset.from_list([{
        "prompt": [{"role": "user", "content": f"Compute alpha, then beta, then the answer. (#{i})"}],
        "answer": "7", "reference": "alpha\nbeta\n\\boxed{7}", "reasoning_points": points,
        "reasoning_graph": [{"if_all": [3], "makes_obsolete": [1, 2]}],
    } for i in range(2)])


JUDGE_COMPLETIONS = ["alpha".ljust(16) + "beta".ljust(16) + "\\boxed{7}", "x" * 16 + "alpha".ljust(16) + "y" * 10,
                     "z" * 5, "beta".ljust(16)]


def _outcome(completions, **kwargs):
    return [1.0 if "\\boxed{7}" in c[0]["content"] else 0.0 for c in completions]


def _train_with_judge(tmp_path, server, overlap, cache, hook=None, **overrides):
    trainer = build_trainer("ppm", tmp_path / "out", reward_funcs=_outcome, train_dataset=_judge_dataset(),
                            overlap_scoring=overlap, progress_scorer="judge", judge_model="openai/loopback-judge",
                            judge_api_base=server.api_base, judge_cache_dir=str(tmp_path / cache), judge_timeout=10,
                            **{**SETTINGS, **overrides})
    script_generation(trainer, lambda prompt, index: JUDGE_COMPLETIONS[index % G])
    outputs = capture_outputs(trainer)
    if hook is not None:
        hook(trainer)
    trainer.train()
    return trainer, outputs


def _graded(server):
    return sorted(body["messages"][-1]["content"] for body in server.bodies if body.get("max_tokens") != PROBE_MAX_TOKENS)


def _on_and_off_with_the_loopback_judge(tmp_path, train):
    """`train(tmp_path, server, overlap, cache=..., **overrides)` with the overlap on and off against one loopback
    judge: the same requests, advantages and logs either way, and the overlapped run served entirely from the
    sequential run's cache. Returns the overlapped trainer and the texts it had graded."""
    results = {}
    with JudgeServer(latency=0.05) as server:
        for overlap in (True, False):
            server.reset_counters()
            trainer, outputs = train(tmp_path, server, overlap, cache=f"cache_{overlap}")
            results[overlap] = trainer, outputs, server.requests, _graded(server)
        # The overlapped run reads the sequential run's cache: the very same requests, so nothing is sent.
        server.reset_counters()
        train(tmp_path, server, True, cache="cache_False", judge_probe=False)
        assert server.requests == 0
    (on, on_outputs, on_requests, on_graded), (off, off_outputs, off_requests, off_graded) = results[True], results[False]
    assert on_requests == off_requests and on_graded == off_graded and len(on_graded) > 0
    for a, b in zip(on_outputs, off_outputs, strict=True):
        assert torch.equal(a["advantages"], b["advantages"])
    assert _logged(on) == _logged(off)
    return on, on_graded


def test_overlap_on_and_off_train_identically_with_the_loopback_judge(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-loopback-dummy")
    on, _ = _on_and_off_with_the_loopback_judge(tmp_path, _train_with_judge)
    assert any(log.get("ppm/scorer_requests", 0) > 0 for log in _logged(on))


def _wait_until(condition, seconds):
    deadline = threading.Event()
    for _ in range(int(seconds / 0.01)):
        if condition():
            return True
        deadline.wait(0.01)
    return condition()


def _script_failures_then_guesses(trainer):
    """Every group fails (all-failure groups for ARG); ARG's continuations then guess wrong (reference fallback)."""
    calls = script_generation(trainer, lambda prompt, index: "no idea" if len(calls) == 1 else "Guess \\boxed{8}")


def test_ppm_arg_grades_the_final_rows_early(tmp_path):
    """ARG replaces the rows of all-failure groups in `on_rollout`; the early scoring sees the inserted reference."""
    reference = "Add them.\nSo $3+4=7$.\n\\boxed{7}"
    dataset = Dataset.from_dict({
        "prompt": [[{"role": "user", "content": f"What is 3+4? (#{i})"}] for i in range(2)],
        "answer": ["7"] * 2, "reference": [reference] * 2, "reasoning_points": [["So 3+4=7", "7"]] * 2,
    })
    results = {}
    for overlap in (True, False):
        scorer = RecordingScorer(lambda rows, texts: torch.tensor(
            [[1.0 if "\\boxed{7}" in p else 0.5 if "So $3+4=7$" in p else 0.0 for p in t] for t in texts]))
        trainer = build_trainer("ppm+arg", tmp_path / str(overlap), scorer=scorer, reward_funcs=[accuracy_reward],
                                train_dataset=dataset, num_segments=K, overlap_scoring=overlap, **ARG_SETTINGS)
        _script_failures_then_guesses(trainer)
        outputs = capture_outputs(trainer)
        trainer.train()
        results[overlap] = scorer, outputs[0]
    scorer, out = results[True]
    assert len(scorer.calls) == 1 and scorer.calls[0][0] == WORKER
    assert sum(reference in texts[-1] for texts in scorer.calls[0][1]) == 2  # the inserted (final) rows
    assert "old_per_token_logps" in out  # the old-policy log-prob pass ran meanwhile
    assert scorer.calls[0][1] == results[False][0].calls[0][1]
    assert torch.equal(out["advantages"], results[False][1]["advantages"])


@pytest.mark.parametrize("overlap", [True, False])
def test_a_scorer_exception_surfaces_in_the_step_with_its_message(tmp_path, overlap):
    scorer = RecordingScorer(error=ConnectionError("judge exploded on row 3"))
    with pytest.raises(ConnectionError, match="^judge exploded on row 3$"):
        _train_programmatic(tmp_path, overlap, scorer=scorer)
    assert [name == WORKER for name, _ in scorer.calls] == [overlap]


@pytest.mark.parametrize("overlap", [True, False])
def test_a_bad_progress_value_is_the_same_error(tmp_path, overlap):
    scorer = RecordingScorer(lambda rows, texts: torch.full((len(rows), K), 1.5))
    with pytest.raises(ValueError, match=r"outside \[0, 1\] for row 0"):
        _train_programmatic(tmp_path, overlap, scorer=scorer)


def test_the_unscorable_window_still_stops_training(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-loopback-dummy")
    with JudgeServer(script=(None,), fault_rate=1.0, fault_kinds=("bad_request",)) as server:
        with pytest.raises(JudgeUnscorableError, match=r"16 of 16 judge requests were unscorable over the last 1 "
                                                       r"step\(s\).*HTTP 400"):
            _train_with_judge(tmp_path, server, True, cache="cache", judge_num_retries=0)
        assert server.requests == 17  # the probe and one batch: the run stopped at its first step


def test_a_step_that_fails_meanwhile_leaves_no_scoring_running(tmp_path):
    """TRL's step raises while the early scoring is still running (a reward function fails): the error is the
    reward function's, and the scoring job has ended by the time `train()` returns — it cannot leak into a later
    batch or run past the failure."""
    finished = threading.Event()

    def slow_progress(rows, texts):
        threading.Event().wait(0.5)
        finished.set()
        return torch.zeros(len(rows), K)

    def failing_reward(completions, **kwargs):
        raise RuntimeError("reward function failed")

    dataset = make_dataset("multi_countdown", 2, 4, seed=0)
    trainer = build_trainer("ppm", tmp_path, scorer=RecordingScorer(slow_progress), reward_funcs=failing_reward,
                            train_dataset=dataset, **SETTINGS)
    script_generation(trainer, _countdown_completions(dataset))
    with pytest.raises(RuntimeError, match="^reward function failed$"):
        trainer.train()
    assert finished.is_set()
    assert trainer.progress_scorer.calls[0][0] == WORKER


# ------------------------------------------------------------------------------------------------------- PAPO
# PAPO judges only the correct responses, so with `overlap_scoring` it computes the outcome rewards right after
# generation (TRL's reward pass then reuses them) and starts the process scorer on the correct rows at once; the
# advantages collect the scores.
PAPO_SETTINGS = dict(per_device_train_batch_size=8, num_generations=G, max_completion_length=96, max_steps=4,
                     num_iterations=2, learning_rate=1e-3, **TINY_ARGS)
UNREWARDABLE = "???"  # a completion every reward function returns None for (outcome NaN: never judged)


def _papo_completions(dataset):
    """A different mix per prompt: all four correct (different texts), two correct + a wrong and an unrewardable one,
    none correct (no judge call), one correct (judged, but |C| = 1: A_proc = 0)."""
    references = [row["reference"] for row in dataset]
    prompts = [row["prompt"][0]["content"] for row in dataset]

    def completion_for(prompt_text, index):
        row = next(i for i, prompt in enumerate(prompts) if prompt in prompt_text)
        reference = references[row]
        mixes = [[reference, "Solution:\n" + reference, "Check.\n" + reference, reference + "\nDone"],
                 [reference, "nope", "Solution:\n" + reference, UNREWARDABLE],
                 ["nope", "no", "x", "y"],
                 ["Check.\n" + reference, "nope", "no", "x"]]
        return mixes[row % len(mixes)][index % G]

    return completion_for


class CountingOutcome:
    """`env_outcome_reward`, None for the unrewardable text; counts its calls and logs a metric through TRL."""

    __name__ = "counting_outcome"

    def __init__(self):
        self.calls = 0

    def __call__(self, completions, **kwargs):
        self.calls += 1
        rewards = env_outcome_reward(completions, **kwargs)
        rewards = [None if c[0]["content"] == UNREWARDABLE else r for c, r in zip(completions, rewards)]
        kwargs["log_metric"]("outcome_calls_logged", 1.0)
        return rewards


def papo_process_score(text: str) -> float | None:
    """A deterministic fake rubric judge: three grades by length, unscorable (None) for texts that start 'Check.'."""
    return None if text.startswith("Check.") else (1.0, 0.5, 0.0)[len(text) % 3]


def _train_papo(tmp_path, overlap, scorer=None, reward=None, **overrides):
    dataset = make_dataset("multi_countdown", 2, 4, seed=0)
    scorer = scorer if scorer is not None else RecordingScorer(
        lambda rows, texts: [papo_process_score(text) for text in texts])
    reward = reward if reward is not None else CountingOutcome()
    trainer = build_trainer("papo", tmp_path / f"papo_{overlap}", scorer=scorer, reward_funcs=reward,
                            train_dataset=dataset, overlap_scoring=overlap, **{**PAPO_SETTINGS, **overrides})
    script_generation(trainer, _papo_completions(dataset))
    outputs = capture_outputs(trainer)
    trainer.train()
    return trainer, outputs, scorer, reward


def test_papo_overlap_on_and_off_train_identically(tmp_path):
    runs = {overlap: _train_papo(tmp_path, overlap) for overlap in (True, False)}
    (on, on_outputs, on_scorer, on_reward), (off, off_outputs, off_scorer, off_reward) = runs[True], runs[False]
    # Overlapped: each batch's correct rows were scored on the worker; sequential: on the training thread.
    assert [name for name, _ in on_scorer.calls] == [WORKER] * 2
    assert [name for name, _ in off_scorer.calls] == ["training thread"] * 2
    assert [texts for _, texts in on_scorer.calls] == [texts for _, texts in off_scorer.calls]
    judged = [text for _, texts in on_scorer.calls for text in texts]
    assert len(judged) == 4 + 2 + 0 + 1  # the correct responses of the four prompts, nothing else
    assert not {"nope", "no", "x", "y", UNREWARDABLE} & set(judged)
    # The reward functions ran once per generation batch either way: TRL's reward pass reused the early rewards.
    assert on_reward.calls == off_reward.calls == 2
    assert len(on_outputs) == len(off_outputs) == 2
    for a, b in zip(on_outputs, off_outputs, strict=True):
        assert "old_per_token_logps" in a  # the log-prob pass the scoring ran under did run
        assert torch.equal(a["advantages"], b["advantages"])
        assert torch.equal(a["old_per_token_logps"], b["old_per_token_logps"])
    assert _logged(on) == _logged(off)  # losses, PAPO metrics, judge counters, the reward's own metric: all equal
    logged = _logged(on)
    assert any(log.get("loss", 0) != 0 for log in logged)
    assert any(log.get("papo/proc_active_fraction", 0) > 0 for log in logged)  # A_proc really entered
    assert all(log["outcome_calls_logged"] == 1.0 for log in logged if "outcome_calls_logged" in log)
    # Not a trivial agreement: the advantages of a batch differ from row to row, A_proc included.
    assert len({round(v, 4) for v in on_outputs[0]["advantages"].tolist()}) > 3


def _train_papo_with_judge(tmp_path, server, overlap, cache, hook=None, **overrides):
    trainer = build_trainer("papo", tmp_path / "papo_out", reward_funcs=_outcome, train_dataset=_judge_dataset(),
                            overlap_scoring=overlap, process_scorer="judge", judge_model="openai/loopback-judge",
                            judge_api_base=server.api_base, judge_cache_dir=str(tmp_path / cache), judge_timeout=10,
                            **{**PAPO_SETTINGS, "max_completion_length": BUDGET, **overrides})
    # The loopback judge's rubric grade: every reference line → 1, the boxed answer only → 0.5, else 0.
    script_generation(trainer, lambda prompt, index: PAPO_JUDGE_COMPLETIONS[index % G])
    outputs = capture_outputs(trainer)
    if hook is not None:
        hook(trainer)
    trainer.train()
    return trainer, outputs


PAPO_JUDGE_COMPLETIONS = ["alpha\nbeta\n\\boxed{7}", "So \\boxed{7}", "alpha, then \\boxed{7}", "no idea"]


def test_papo_overlap_on_and_off_train_identically_with_the_loopback_judge(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-loopback-dummy")
    on, on_graded = _on_and_off_with_the_loopback_judge(tmp_path, _train_papo_with_judge)
    assert len(on_graded) == 3 * 2  # three correct responses per prompt, one generation batch of two prompts
    assert not any(PAPO_JUDGE_COMPLETIONS[3] in body for body in on_graded)  # the wrong one is never judged
    assert any(log.get("papo/judge_requests", 0) > 0 for log in _logged(on))
    assert any(log.get("papo/proc_active_fraction", 0) > 0 for log in _logged(on))  # grades 1, .5, .5 differ


@pytest.mark.parametrize("overlap", [True, False])
@pytest.mark.parametrize("scores, error, message", [
    (None, ConnectionError("judge exploded on row 3"), "^judge exploded on row 3$"),
    (lambda rows, texts: [1.5] * len(texts), None, r"process scorer returned 1\.5 for row 0; scores must lie in"),
    (lambda rows, texts: [1.0], None, r"process scorer returned 1 scores for 6 responses"),
])
def test_papo_scorer_errors_are_the_same_with_overlap_on_and_off(tmp_path, overlap, scores, error, message):
    scorer = RecordingScorer(scores, error=error)
    with pytest.raises(type(error) if error is not None else ValueError, match=message):
        _train_papo(tmp_path, overlap, scorer=scorer)
    assert [name == WORKER for name, _ in scorer.calls] == [overlap]


def test_papo_step_that_fails_in_the_log_prob_pass_leaves_no_scoring_running(tmp_path):
    """The log-prob pass raises while the early scoring still runs: the error is the pass's, and the scoring job
    has ended by the time `train()` returns."""
    finished = threading.Event()

    def slow_scores(rows, texts):
        threading.Event().wait(0.5)
        finished.set()
        return [1.0] * len(texts)

    def failing_pass(module, inputs):
        if not torch.is_grad_enabled():
            raise RuntimeError("log-prob pass failed")

    scorer = RecordingScorer(slow_scores)
    dataset = make_dataset("multi_countdown", 2, 4, seed=0)
    trainer = build_trainer("papo", tmp_path, scorer=scorer, train_dataset=dataset, **PAPO_SETTINGS)
    script_generation(trainer, _papo_completions(dataset))
    trainer.model.register_forward_pre_hook(failing_pass)
    with pytest.raises(RuntimeError, match="^log-prob pass failed$"):
        trainer.train()
    assert finished.is_set() and scorer.calls[0][0] == WORKER


def test_papo_arg_rewards_and_judges_the_final_rows_early(tmp_path):
    """ARG replaces the rows of all-failure groups in `on_rollout`; the early rewards and the early process scoring
    see the inserted reference (correct), not the failures it replaced."""
    reference = "Add them.\nSo $3+4=7$.\n\\boxed{7}"
    dataset = Dataset.from_dict({
        "prompt": [[{"role": "user", "content": f"What is 3+4? (#{i})"}] for i in range(2)],
        "answer": ["7"] * 2, "reference": [reference] * 2,
    })
    results = {}
    for overlap in (True, False):
        scorer = RecordingScorer(lambda rows, texts: [1.0 if "So $3+4=7$" in t else 0.5 for t in texts])
        trainer = build_trainer("papo+arg", tmp_path / str(overlap), scorer=scorer, reward_funcs=[accuracy_reward],
                                train_dataset=dataset, overlap_scoring=overlap, **ARG_SETTINGS)
        _script_failures_then_guesses(trainer)
        outputs = capture_outputs(trainer)
        trainer.train()
        results[overlap] = scorer, outputs[0], _logged(trainer)
    scorer, out, logged = results[True]
    assert len(scorer.calls) == 1 and scorer.calls[0][0] == WORKER
    assert sum(reference in text for text in scorer.calls[0][1]) == 2  # the inserted (final) rows, judged early
    assert "old_per_token_logps" in out
    assert scorer.calls[0][1] == results[False][0].calls[0][1]
    assert torch.equal(out["advantages"], results[False][1]["advantages"])
    assert logged == results[False][2]


def test_papo_with_a_rollout_funcs_extra_fields_rewards_at_trls_pass(tmp_path):
    """A `rollout_func`'s extra fields join the rows only just before TRL's rewards: no early rewards then (PAPO
    scores in `compute_advantages`, as with the switch off), and asking for them is one clear error naming the fields."""
    dataset = make_dataset("multi_countdown", 2, 4, seed=0)
    scorer, reward = RecordingScorer(lambda rows, texts: [1.0] * len(texts)), CountingOutcome()
    trainer = build_trainer("papo", tmp_path, scorer=scorer, reward_funcs=reward, train_dataset=dataset,
                            **PAPO_SETTINGS)
    rows = [dict(dataset[0]) for _ in range(G)]
    rollout = Rollout(rows=rows, prompts=[row["prompt"] for row in rows], prompt_ids=[[1]] * G,
                      completion_ids=[[2]] * G, tool_mask=None,
                      completions=[[{"role": "assistant", "content": row["reference"]}] for row in rows],
                      logprobs=None, extra_fields={"env_reward": [1.0] * G}, images=None, tool_images=None)
    trainer.on_final_rollout(rollout)
    assert reward.calls == 0 and not scorer.started.is_set()
    with pytest.raises(ValueError, match=r"extra fields \(\['env_reward'\]\)"):
        trainer.compute_rewards_early(rollout)


# ------------------------------------------------------------------------------------------- PPM and PAPO alike
# Per method: the config's settings, a scorer of neutral values, the scripted completions, training with the judge.
METHODS = {
    "ppm": dict(settings=SETTINGS, neutral=lambda rows, texts: torch.zeros(len(rows), K),
                completions=_countdown_completions, train_with_judge=_train_with_judge),
    "papo": dict(settings=PAPO_SETTINGS, neutral=lambda rows, texts: [1.0] * len(texts),
                 completions=_papo_completions, train_with_judge=_train_papo_with_judge),
}


@pytest.mark.parametrize("method", list(METHODS))
def test_judge_requests_reach_the_server_before_the_log_prob_pass_runs(tmp_path, monkeypatch, method):
    """The old-policy log-prob pass (a no-grad forward of the policy; generation is scripted, so the only one) waits
    until the judge server has seen a grading (PPM) or rubric (PAPO) request. Overlapped, the requests are already
    out; sequential code would send them only after that pass (PAPO: after TRL's rewards, which come after it), so
    the wait would time out and the test fail."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-loopback-dummy")
    seen_before_pass = []

    def hook(trainer):
        probe_requests = server.requests

        def before_forward(module, args):
            if not torch.is_grad_enabled():  # the log-prob passes run under no_grad, training forwards do not
                seen_before_pass.append(_wait_until(lambda: server.requests > probe_requests, seconds=20))

        trainer.model.register_forward_pre_hook(before_forward)

    with JudgeServer(latency=0.2) as server:
        METHODS[method]["train_with_judge"](tmp_path, server, True, cache="cache", hook=hook, max_steps=2)
    assert seen_before_pass == [True]  # one generation batch, one old-log-prob pass


@pytest.mark.parametrize("method", list(METHODS))
def test_the_scorer_starts_before_the_log_prob_pass_and_is_on_by_default(tmp_path, method):
    """The same ordering without HTTP: the no-grad log-prob forward waits for the scorer to have started."""
    order = []
    scorer = RecordingScorer(METHODS[method]["neutral"])
    trainer = build_trainer(method, tmp_path, scorer=scorer, **{**METHODS[method]["settings"], "max_steps": 2})
    assert trainer.args.overlap_scoring  # on by default
    script_generation(trainer, METHODS[method]["completions"](trainer.train_dataset))
    trainer.model.register_forward_pre_hook(
        lambda module, inputs: order.append(scorer.started.wait(20)) if not torch.is_grad_enabled() else None)
    trainer.train()
    assert order == [True] and scorer.calls[0][0] == WORKER


@pytest.mark.parametrize("method", list(METHODS))
def test_evaluation_starts_no_scoring_and_rewards_once(tmp_path, method):
    dataset = make_dataset("multi_countdown", 2, 4, seed=0)
    scorer, reward = RecordingScorer(METHODS[method]["neutral"]), CountingOutcome()
    trainer = build_trainer(method, tmp_path, scorer=scorer, reward_funcs=reward, train_dataset=dataset,
                            eval_dataset=dataset, per_device_eval_batch_size=8, **METHODS[method]["settings"])
    script_generation(trainer, METHODS[method]["completions"](dataset))
    trainer.evaluate()
    assert scorer.calls == [] and not scorer.started.is_set()
    assert reward.calls == 2  # 16 eval rows in two batches of 8: TRL's own reward pass, nothing early
