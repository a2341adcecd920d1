"""Multi-turn multi_countdown / matrix through TRL's environment/tool loop, and PPM turn segments end to end."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import TINY_ARGS, capture_outputs

from ppm_trl.envs import get_env, make_dataset
from ppm_trl.envs.multiturn import (
    MULTITURN_ENVIRONMENTS,
    MatrixTurnEnv,
    MultiCountdownTurnEnv,
    make_multiturn_dataset,
    multiturn_config_kwargs,
)
from ppm_trl.ppm.ppm_config import PPMConfig
from ppm_trl.rewards import env_outcome_reward
from ppm_trl.tiny import build_tiny_model_and_tokenizer, build_tiny_tokenizer

CALL = {"multi_countdown": "next_problem", "matrix": "next_operation"}


def _turn(text: str, tool: str | None) -> str:
    """One scripted assistant turn: its text, then (unless it is the last) a Qwen-style tool call."""
    if tool is None:
        return text
    return text + '\n<tool_call>\n{"name": "' + tool + '", "arguments": {}}\n</tool_call>'


def _tool_result(text: str) -> str:
    """What the tiny tool template appends after a turn's <|im_end|> (TRL's `_get_tool_suffix_ids`)."""
    return f"<|im_start|>user\n<tool_response>\n{text}\n</tool_response><|im_end|>\n<|im_start|>assistant\n"


# ----------------------------------------------------------------------------------------------------- dataset
@pytest.mark.parametrize("name", ["multi_countdown", "matrix"])
def test_rows_keep_the_single_turn_columns_and_split_the_problem(name):
    single = make_dataset(name, 3, 3, seed=5)
    multi = make_multiturn_dataset(name, 3, 3, seed=5)
    for column in ("answer", "reference", "reasoning_points", "reasoning_graph", "env", "n", "task"):
        assert multi[column] == single[column], column
    for row, single_row in zip(multi, single):
        assert row["environment"] == name and len(row["subproblems"]) == 3
        prompt = row["prompt"][0]["content"]
        assert row["subproblems"][0] in prompt and row["subproblems"][1] not in prompt
        assert CALL[name] in prompt and "\\boxed{" in prompt
        assert row["subproblems"][2].endswith("(the last one)")
        # The single-turn prompt's content is all there, one sub-problem per turn.
        for k, text in enumerate(row["subproblems"], start=1):
            assert text.startswith(("Problem" if name == "multi_countdown" else "Operation") + f" {k} of 3: ")
        if name == "matrix":
            operations = [line.split(". ", 1)[1] for line in single_row["prompt"][0]["content"].split("\n")[-3:]]
            assert [s.split(": ", 1)[1].removesuffix(" (the last one)") for s in row["subproblems"]] == operations
        else:
            task_numbers = [" ".join(map(str, p["numbers"])) for p in json.loads(row["task"])["problems"]]
            assert [s.split("numbers ")[1].split(",")[0] for s in row["subproblems"]] == task_numbers


def test_unknown_env_is_a_clear_error():
    with pytest.raises(ValueError, match="chain.*accepted names: multi_countdown, matrix"):
        make_multiturn_dataset("chain", 2, 1)


# ------------------------------------------------------------------------------------------------- environment
@pytest.mark.parametrize("name", ["multi_countdown", "matrix"])
def test_env_presents_one_subproblem_per_call_then_says_done(name):
    row = make_multiturn_dataset(name, 3, 1, seed=2)[0]
    env = MULTITURN_ENVIRONMENTS[name]()
    assert env.reset(**row) is None  # sub-problem 1 is in the prompt
    call = getattr(env, CALL[name])
    assert [call(), call()] == row["subproblems"][1:]
    assert env.shown == 3 and env.extra_calls == 0
    assert "no next" in call() and env.extra_calls == 1
    env.reset(**row)  # a pooled instance starts over
    assert env.shown == 1 and env.extra_calls == 0 and call() == row["subproblems"][1]


def test_env_text_reaches_no_point_and_is_not_an_answer():
    """Tool results are part of the completion the matcher reads: they alone must score nothing."""
    for name in ("multi_countdown", "matrix"):
        for row in make_multiturn_dataset(name, 4, 5, seed=3):
            env = MULTITURN_ENVIRONMENTS[name]()
            env.reset(**row)
            env_text = "".join(_tool_result(getattr(env, CALL[name])()) for _ in range(4))  # 3 sub-problems + "done"
            assert get_env(name).match_points(row, env_text) == set()
            assert not get_env(name).verify(row, env_text)


def test_reset_rejects_rows_it_cannot_serve():
    countdown = make_multiturn_dataset("multi_countdown", 2, 1)[0]
    with pytest.raises(ValueError, match="MatrixTurnEnv serves env 'matrix'.*'multi_countdown'"):
        MatrixTurnEnv().reset(**countdown)
    with pytest.raises(ValueError, match="column `subproblems`"):
        MultiCountdownTurnEnv().reset(**{**countdown, "subproblems": []})
    single_turn = make_dataset("multi_countdown", 2, 1)[0]
    with pytest.raises(ValueError, match="column `subproblems`"):
        MultiCountdownTurnEnv().reset(**single_turn)


def test_config_kwargs_give_one_segment_per_turn_and_a_per_turn_budget(tmp_path):
    kwargs = multiturn_config_kwargs(4, tokens_per_turn=512, tool_tokens_per_turn=100)
    assert kwargs["num_segments"] == 4 and kwargs["segmentation"] == "turns"
    assert kwargs["max_tool_calling_iterations"] == 3
    assert kwargs["max_completion_length"] == 4 * 512 + 3 * 100
    assert kwargs["generation_kwargs"] == {"max_new_tokens": 512}
    assert multiturn_config_kwargs(2, 8, use_vllm=True)["generation_kwargs"] == {"max_tokens": 8}
    with pytest.raises(ValueError, match="tokens_per_turn"):
        multiturn_config_kwargs(2, 0)
    PPMConfig(output_dir=str(tmp_path), num_generations=2, per_device_train_batch_size=2, **kwargs, **TINY_ARGS)
    # A method without fields of its own gets the turn budget only; a composed method its PPM part's fields
    assert set(multiturn_config_kwargs(4, 512, method="grpo")) == {
        "max_tool_calling_iterations", "max_completion_length", "generation_kwargs"}
    assert multiturn_config_kwargs(3, 8, method="ppm+arg")["num_segments"] == 3
    with pytest.raises(ValueError, match="unknown method 'nope'"):
        multiturn_config_kwargs(2, 8, method="nope")


MULTITURN_FLAGS = ["--env_name", "multi_countdown", "--env_n", "3", "--multiturn", "true", "--tokens_per_turn", "32",
                   "--tool_tokens_per_turn", "48", "--use_cpu", "true"]


@pytest.mark.parametrize("method", ["ppm", "ppm+arg", "papo", "grpo"])
def test_the_command_line_derives_the_multiturn_fields_before_the_config_validates(tmp_path, method):
    from ppm_trl.train import parse_train_args

    _, args, _ = parse_train_args(["--method", method, "--output_dir", str(tmp_path), *MULTITURN_FLAGS])
    assert (args.max_tool_calling_iterations, args.max_completion_length) == (2, 3 * 32 + 2 * 48)
    assert args.generation_kwargs == {"max_new_tokens": 32}
    if method.startswith("ppm"):
        assert (args.segmentation, args.num_segments) == ("turns", 3)
    else:
        assert not hasattr(args, "segmentation")


def test_a_multiturn_field_the_user_sets_wins_and_is_validated(tmp_path):
    from ppm_trl.flags import UsageError
    from ppm_trl.train import parse_train_args

    base = ["--method", "ppm", "--output_dir", str(tmp_path), *MULTITURN_FLAGS]
    _, args, _ = parse_train_args([*base, "--max_completion_length", "100", "--num_segments", "2"])
    assert (args.max_completion_length, args.num_segments, args.segmentation) == (100, 2, "turns")
    config = tmp_path / "run.yaml"
    config.write_text("num_segments: 5\n")
    _, args, _ = parse_train_args([*base, "--config", str(config)])
    assert args.num_segments == 5  # the YAML's key, too
    # The derived values pass through PPMConfig's checks (they used to be set after it had validated)
    with pytest.raises(UsageError, match="num_segments must be >= 1"):
        parse_train_args([*base, "--num_segments", "0"])
    with pytest.raises(UsageError, match="`multiturn` needs env_name in"):
        parse_train_args([*base, "--env_name", "multi_add"])


# ---------------------------------------------------------------------------------------------- tool template
def test_tool_template_keeps_plain_rendering_and_parses_calls():
    from trl.chat_template_utils import is_chat_template_prefix_preserving, parse_response, supports_tool_calling

    plain, tools = build_tiny_tokenizer(), build_tiny_tokenizer(tool_calling=True)
    conversation = [{"role": "system", "content": "S"}, {"role": "user", "content": "hi"},
                    {"role": "assistant", "content": "yo"}, {"role": "user", "content": "more"}]
    for messages in (conversation[1:2], conversation):
        assert (tools.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
                == plain.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))
    assert plain.apply_chat_template(conversation[1:2], tokenize=False, add_generation_prompt=True) == (
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    assert supports_tool_calling(tools) and is_chat_template_prefix_preserving(tools)
    assert not supports_tool_calling(plain)
    env = MultiCountdownTurnEnv()
    rendered = tools.apply_chat_template(conversation[1:2], tools=[env.next_problem], tokenize=False)
    assert rendered.startswith("<|im_start|>system\n# Tools") and '"name": "next_problem"' in rendered
    prompt = tools.apply_chat_template(conversation[1:2], add_generation_prompt=True)
    ids = tools(_turn("P1: 1+2 = 3", "next_problem") + "<|im_end|>", add_special_tokens=False)["input_ids"]
    parsed = parse_response(tools, ids, prefix=prompt)
    assert parsed["content"] == "P1: 1+2 = 3"
    assert parsed["tool_calls"] == [{"type": "function", "function": {"name": "next_problem", "arguments": {}}}]
    assert "tool_calls" not in parse_response(tools, tools("\\boxed{3}<|im_end|>")["input_ids"], prefix=prompt)


# ------------------------------------------------------------------------------------------------- end to end
N, G = 3, 4


def _scripts(row):
    """Per rollout, its turns; R3 stops after two turns (no tool call), leaving its third segment empty."""
    s1, s2, s3, box = row["reference"].split("\n")
    if row["env"] == "multi_countdown":
        wrong, wrong_box = ["P1: 1+1 = 2", "P2: 1 = 1", "P3: 2 = 2"], "\\boxed{1, 2, 3}"
    else:
        wrong, wrong_box = ["M1: [[0]]", "M2: [[0]]", "M3: [[0]]"], "\\boxed{[[0]]}"
    return [[s1, s2, s3 + "\n" + box], [wrong[0], s2, s3 + "\n" + wrong_box], [s1, wrong[1], wrong[2]],
            [wrong[0], "I give up."]]


# Rewards r_k = m_k - m_{k-1} + outcome, advantages r_k - group mean of r_k (scale_rewards="none"), by hand.
# multi_countdown, 4 points (3 problems + goal; the goal obsoletes the rest):
#   m: R0 [1/4, 2/4, 1] (outcome 1), R1 [0, 1/4, 2/4], R2 [1/4, 1/4, 1/4], R3 [0, 0, -]
#   r: R0 [5/4, 5/4, 3/2], R1 [0, 1/4, 1/4], R2 [1/4, 0, 0], R3 [0, 0, 0]; means [3/8, 3/8, 7/16]
# matrix, 3 points in a chain (Mk obsoletes M1..Mk-1): R1's second turn also collects M1, and its correct M3 line
# reaches the last point (progress 1) although its box is wrong (outcome 0)
#   m: R0 [1/3, 2/3, 1] (outcome 1), R1 [0, 2/3, 1], R2 [1/3, 1/3, 1/3], R3 [0, 0, -]
#   r: R0 [4/3, 4/3, 4/3], R1 [0, 2/3, 1/3], R2 [1/3, 0, 0], R3 [0, 0, 0]; means [5/12, 1/2, 5/12]
EXPECTED_ADVANTAGES = {
    "multi_countdown": [[7 / 8, 7 / 8, 17 / 16], [-3 / 8, -1 / 8, -3 / 16], [-1 / 8, -3 / 8, -7 / 16], [-3 / 8, -3 / 8]],
    "matrix": [[11 / 12, 5 / 6, 11 / 12], [-5 / 12, 1 / 6, -1 / 12], [-1 / 12, -1 / 2, -5 / 12], [-5 / 12, -1 / 2]],
}


def _script_rollouts(trainer, dataset):
    """Scripted `_generate_single_turn`: the real TRL tool loop calls it once per turn with the rollouts still going."""
    tokenizer = trainer.processing_class
    state = {"active": [], "turn_calls": []}

    def row_of(prompt_text):
        matches = [row for row in dataset if row["prompt"][0]["content"] in prompt_text]
        assert len(matches) == 1
        return matches[0]

    def scripted(prompt_ids, images=None, multimodal_fields=None, num_generations=1, has_tool_images=False):
        texts = [tokenizer.decode(ids) for ids in prompt_ids]
        turn = texts[0].count("<tool_response>")
        if turn == 0:
            state["active"] = list(range(len(prompt_ids)))
        else:  # TRL continues exactly the rollouts whose last turn called the tool
            state["active"] = [i for i in state["active"] if len(_scripts(row_of(texts[0]))[i % G]) > turn]
        assert len(state["active"]) == len(prompt_ids)
        state["turn_calls"].append(len(prompt_ids))
        completions = []
        for i, text in zip(state["active"], texts):
            row = row_of(text)
            if turn > 0:  # the env's answer to the previous turn was appended before this turn
                assert text.endswith(_tool_result(row["subproblems"][turn]))
            turns = _scripts(row)[i % G]
            tool = CALL[row["env"]] if turn + 1 < len(turns) else None
            completions.append(tokenizer(_turn(turns[turn], tool), add_special_tokens=False)["input_ids"]
                               + [tokenizer.eos_token_id])
        return completions, None

    trainer.sample_completion_ids = scripted
    return state


@pytest.mark.parametrize("name, steps", [("multi_countdown", 2), ("matrix", 1)])
def test_turn_segments_and_advantages_end_to_end(tmp_path, name, steps):
    """Real TRL tool loop + the multi-turn env + programmatic matcher → per-turn advantages by hand."""
    from ppm_trl.ppm.ppm_trainer import PPMGRPOTrainer

    dataset = make_multiturn_dataset(name, N, 2, seed=0)
    model, tokenizer = build_tiny_model_and_tokenizer(max_position_embeddings=4096, tool_calling=True)
    args = PPMConfig(output_dir=str(tmp_path), per_device_train_batch_size=G, num_generations=G, max_steps=steps,
                     **multiturn_config_kwargs(N, tokens_per_turn=128, tool_tokens_per_turn=128), **TINY_ARGS)
    trainer = PPMGRPOTrainer(model=model, processing_class=tokenizer, reward_funcs=env_outcome_reward, args=args,
                             train_dataset=dataset, environment_factory=MULTITURN_ENVIRONMENTS[name])
    state = _script_rollouts(trainer, dataset)
    outputs = capture_outputs(trainer)
    trainer.train()

    assert state["turn_calls"] == [4, 4, 3] * steps  # per step: 4 first turns, 4 second, 3 third (R3 stopped)
    assert [env.shown for env in trainer.environments] == [3, 3, 3, 2]  # the env's tool really ran
    for out in outputs:
        prompt_text = tokenizer.decode(out["prompt_ids"][0], skip_special_tokens=False)
        row = next(r for r in dataset if r["prompt"][0]["content"] in prompt_text)
        for i in range(G):
            turns = _scripts(row)[i]
            # Expected completion, built by hand: turn k + EOS (model, tool_mask 1), then the env's next sub-problem
            # (tool_mask 0); every token of turn k and of the tool result answering it carries turn k's advantage.
            ids, tool_mask, advantages = [], [], []
            for k, text in enumerate(turns):
                last = k + 1 == len(turns)
                model_ids = tokenizer(_turn(text, None if last else CALL[name]),
                                      add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
                env_ids = [] if last else tokenizer(_tool_result(row["subproblems"][k + 1]),
                                                    add_special_tokens=False)["input_ids"]
                ids += model_ids + env_ids
                tool_mask += [1] * len(model_ids) + [0] * len(env_ids)
                advantages += [EXPECTED_ADVANTAGES[name][i][k]] * (len(model_ids) + len(env_ids))
            length = int(out["completion_mask"][i].sum())
            assert length == len(ids)
            assert out["completion_ids"][i, :length].tolist() == ids
            assert out["tool_mask"][i, :length].tolist() == tool_mask  # the tool loop ran: zeros on env tokens
            assert torch.allclose(out["advantages"][i, :length], torch.tensor(advantages), atol=1e-6), i
            assert torch.all(out["advantages"][i, length:] == 0)
    # Advantages differ across the turns of one rollout according to what each turn solved.
    assert len(set(EXPECTED_ADVANTAGES[name][1])) == 3 and len(set(EXPECTED_ADVANTAGES[name][2])) == 3
