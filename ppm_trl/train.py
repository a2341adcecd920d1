"""`ppm-trl train` (and `examples/train_<method>.py`): parse the YAML + flags the TRL way (`TrlParser`), load and
check the data (`data.py`), build the method's trainer, train, save, and say what to run next.

Every field of the method's config (`PPMConfig`, `PAPOConfig`, `ARGConfig` or TRL's `GRPOConfig`), of TRL's
`ModelConfig` (LoRA: `--use_peft --lora_r ...`) and of `TrainScriptArguments` below is a YAML key and a `--flag`;
flags override the YAML; unknown keys are errors.
"""

from __future__ import annotations

import json
import os
import re
import sys
from dataclasses import dataclass, field

from .data import check_model_source, load_train_dataset, looks_local, prepare_dataset
from .flags import (
    JUDGE_BUDGET_EXIT_CODE,
    UsageError,
    check_config_keys,
    check_config_values,
    check_flags,
    config_path,
    flag_value,
    read_yaml_config,
    user_setting,
)
from .plots import save_training_curves
from .quiet import quiet_third_party
from .registry import METHODS, REWARDS, get_method
from .report import nothing_learned_this_run, training_summary
from .reward_sources import TRL_REWARDS, load_reward


@dataclass
class TrainScriptArguments:
    """What to train on and with which rewards (the method's config holds the training knobs)."""

    method: str = field(default="grpo", metadata={"help": f"One of {', '.join(METHODS)}."})
    env_name: str | None = field(default=None, metadata={"help": "Synthetic env (multi_countdown, matrix, chain, ...)."})
    env_n: int = field(default=2, metadata={"help": "Horizon n of the synthetic env."})
    env_size: int = field(default=256, metadata={"help": "Number of training problems generated."})
    env_seed: int = field(default=0, metadata={"help": "Seed of the env generator."})
    dataset_name: str | None = field(
        default=None, metadata={"help": "A Hub dataset id, a local dataset dir (save_to_disk) or data file."}
    )
    dataset_config: str | None = field(default=None, metadata={"help": "Dataset configuration name."})
    dataset_train_split: str = field(default="train", metadata={"help": "Training split."})
    reward_funcs: list[str] = field(
        default_factory=list,
        metadata={"help": f"Reward functions: ours ({', '.join(REWARDS)}), TRL's ({', '.join(TRL_REWARDS)}) or a "
                  "dotted import path to your own (my_lib.rewards.my_reward, found from the working directory too); "
                  "default: env_outcome for an env, accuracy otherwise (arg: accuracy + format). ARG's verifier is "
                  "the first one."},
    )
    reward_model_name_or_path: str | None = field(
        default=None,
        metadata={"help": "A reward model (Hub id or local directory) that GRPOTrainer loads and scores with, as in "
                  "`trl grpo`: the first reward, or after --reward_funcs for arg (whose first reward is its verifier)."},
    )
    multiturn: bool = field(
        default=False,
        metadata={"help": "Multi-turn form of the env (multi_countdown, matrix): one sub-problem per turn through "
                  "TRL's environment/tool loop; sets the per-turn budget and the method's fields (PPM: "
                  "segmentation=turns, num_segments=n), each unless you set it."},
    )
    tokens_per_turn: int = field(default=256, metadata={"help": "Multi-turn: generation budget of one turn."})
    tool_tokens_per_turn: int = field(default=128, metadata={"help": "Multi-turn: bound on one tool reply."})
    tiny_hidden_size: int = field(default=64, metadata={"help": "Width of `model_name_or_path: tiny`."})
    tiny_num_layers: int = field(default=2, metadata={"help": "Depth of `model_name_or_path: tiny`."})
    problem_column: str | None = field(
        default=None, metadata={"help": "Column holding the problem text; it becomes the chat `prompt` "
                                "(default: the dataset's own `prompt` column)."})
    answer_column: str | None = field(
        default=None, metadata={"help": "Column holding the gold answer (default: `answer`): a bare answer, a GSM8K "
                                "solution ending in `#### 72`, or a solution whose last `\\boxed{}` is the answer."})
    reference_column: str | None = field(
        default=None, metadata={"help": "Column holding the worked reference solution, for ARG and PAPO's judge "
                                "(default: `reference`); a GSM8K `#### 72` last line is read as `\\boxed{72}`."})
    max_prompt_length: int | None = field(
        default=None, metadata={"help": "Longest prompt in tokens (default: the model's context minus "
                                "max_completion_length). Longer prompts are an error unless long_prompts=drop."})
    long_prompts: str = field(
        default="drop", metadata={"help": "What to do with prompts longer than max_prompt_length: `drop` (train "
                                  "without them, counted and named on stderr) or `error` (refuse, naming the rows)."})
    license: str | None = field(
        default=None, metadata={"help": "Licence written into the model card (an SPDX id or Hub licence name, e.g. "
                                "apache-2.0). Default: the licence the base model's own card declares, else "
                                "`unknown`. (The ppm-trl methods' cards; plain grpo keeps TRL's card.)"})


def _config_class(method: str):
    try:
        return get_method(method).config_class()
    except ValueError as error:
        raise UsageError(str(error)) from None


# Flags each subcommand spells differently: the right spelling is named instead of a guess.
TRAIN_RENAMED = {"--split": "--dataset_train_split", "--model": "--model_name_or_path", "--dataset": "--dataset_name",
                 "--env": "--env_name"}


def method_from_argv(argv: list[str]) -> str:
    """`method` decides the config class, so read it before the full parse (flag first, then the YAML)."""
    method = flag_value(argv, "--method")
    if method is not None:
        return method
    path = config_path(argv)
    return read_yaml_config(path).get("method", "grpo") if path else "grpo"


def fit_generation_batch(given: dict, defaults: dict, num_processes: int = 1) -> tuple[dict, str | None]:
    """`ppm_trl.configs.fit_generation_batch` — the configs' own rule for whole groups in TRL's generation batch —
    with the fix spelled as flags and a settings conflict as a UsageError. `train` applies it before the parse for
    every method (TRL's GRPOConfig has no such rule) and prints the line it returns."""
    from .configs import fit_generation_batch as fit

    try:
        return fit(given, defaults, num_processes, flags=True)
    except ValueError as error:
        raise UsageError(str(error)) from None


def parse_train_args(argv: list[str]):
    import dataclasses

    from trl import ModelConfig, TrlParser

    config_class = _config_class(method_from_argv(argv))
    classes = (TrainScriptArguments, config_class, ModelConfig)
    parser = TrlParser(classes, prog="ppm-trl train")
    check_flags(argv, parser, "train", TRAIN_RENAMED)
    path = config_path(argv)
    config = read_yaml_config(path) if path else {}
    check_config_keys(config, parser, path)
    check_config_values(config, classes, path)
    generations = user_setting(argv, config, "num_generations")
    if generations is not None and str(generations).lstrip("-").isdigit() and int(generations) < 1:
        # TRL's own __post_init__ would die on it with a ZeroDivisionError
        raise UsageError(f"num_generations must be >= 1 (samples per prompt; GRPO needs >= 2), got {generations}")
    use_cpu = str(flag_value(argv, "--use_cpu", config.get("use_cpu", False))).lower() in ("true", "1", "yes")
    argv = deepspeed_on_cpu(argv, config, use_cpu)
    parser.set_defaults(bf16=auto_bf16() and not use_cpu)  # the YAML and flags override it
    from .configs import BATCH_KEYS

    given = {key: user_setting(argv, config, key) for key in BATCH_KEYS}
    if all(v is None or str(v).isdigit() for v in given.values()):  # else the parser names the bad value
        defaults = {f.name: f.default for f in dataclasses.fields(config_class) if f.name in BATCH_KEYS}
        derived, note = fit_generation_batch(given, defaults, int(os.environ.get("WORLD_SIZE", "1")))
        parser.set_defaults(**derived)
        if note and os.environ.get("RANK", "0") == "0":
            print(f"ppm-trl train: {note}", file=sys.stderr)
    try:
        script_args, training_args, model_args = parser.parse_args_and_config(argv)
        if script_args.multiturn:
            # What a multi-turn run derives from its turn budget, as defaults that a flag or YAML key overrides; then
            # parsed again, so that the configs validate the values they train with.
            parser.set_defaults(**multiturn_settings(script_args, training_args.use_vllm))
            script_args, training_args, model_args = parser.parse_args_and_config(argv)
    except (ValueError, TypeError) as error:  # unknown YAML keys, and TRL's / our configs' value checks
        raise UsageError(str(error)) from None
    if script_args.long_prompts not in ("error", "drop"):
        raise UsageError(f"long_prompts must be `error` or `drop`, got {script_args.long_prompts!r}")
    return script_args, training_args, model_args


def multiturn_settings(script_args, use_vllm: bool) -> dict:
    """The config fields of `script_args.method` for its multi-turn env (`envs.multiturn.multiturn_config_kwargs`)."""
    from .envs.multiturn import MULTITURN_ENVIRONMENTS, multiturn_config_kwargs

    if script_args.env_name not in MULTITURN_ENVIRONMENTS:
        raise UsageError(f"`multiturn` needs env_name in {sorted(MULTITURN_ENVIRONMENTS)}, got {script_args.env_name!r}")
    return multiturn_config_kwargs(script_args.env_n, script_args.tokens_per_turn, script_args.tool_tokens_per_turn,
                                   use_vllm=use_vllm, method=script_args.method)


def deepspeed_on_cpu(argv: list[str], config: dict, use_cpu: bool) -> list[str]:
    """`argv` with what DeepSpeed needs on a machine without CUDA, when `accelerate launch` runs it (e.g.
    configs/accelerate/cpu_zero3.yaml): no `use_cpu` (the Trainer would size DeepSpeed's batch for one process and
    DeepSpeed asserts; accelerate and DeepSpeed use the CPU by themselves) and the gloo backend unless one is set. The
    same config then runs under DDP, DeepSpeed or a single process unchanged."""
    import torch

    if os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() != "true" or torch.cuda.is_available():
        return argv
    extra, said = [], []
    if use_cpu:
        extra += ["--use_cpu", "false"]
        said.append("use_cpu off (DeepSpeed runs on the CPU by itself)")
    if flag_value(argv, "--ddp_backend", config.get("ddp_backend")) is None:
        extra += ["--ddp_backend", "gloo"]
        said.append("ddp_backend gloo")
    if said and os.environ.get("RANK", "0") == "0":
        print(f"ppm-trl train: DeepSpeed without CUDA: {', '.join(said)}", file=sys.stderr)
    return [*argv, *extra]


def auto_bf16() -> bool:
    """bf16 when a CUDA device supports it, else fp32 (TRL's default, bf16=True, fails on CPU)."""
    import torch

    return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())


def check_prompt_lengths(dataset, tokenizer, model_path: str, script_args, training_args):
    """Refuse (or with long_prompts=drop, drop and count) prompts that do not fit; returns the dataset."""
    from transformers import AutoConfig

    positions = getattr(AutoConfig.from_pretrained(model_path), "max_position_embeddings", None)
    limits = []
    if script_args.max_prompt_length is not None:
        limits.append((script_args.max_prompt_length, f"max_prompt_length={script_args.max_prompt_length}"))
    if positions is not None:
        room = positions - training_args.max_completion_length
        limits.append((room, f"the model's {positions} positions minus max_completion_length="
                             f"{training_args.max_completion_length}"))
    if not limits:
        return dataset
    limit, why = min(limits)
    if limit < 1:
        raise UsageError(f"no room for a prompt: {why} leaves {limit} tokens; lower max_completion_length")
    texts = [p if isinstance(p, str) else tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True)
             for p in dataset["prompt"]]
    # verbose=False: our own line reports the long prompts (the tokenizer warned "Token indices sequence length" first)
    lengths = [len(ids) for ids in tokenizer(texts, add_special_tokens=False, verbose=False)["input_ids"]]
    too_long = [i for i, n in enumerate(lengths) if n > limit]
    if not too_long:
        return dataset
    message = (f"{len(too_long)} of {len(lengths)} prompts are longer than {limit} tokens ({why}); first: row "
               f"{too_long[0]} with {lengths[too_long[0]]} tokens")
    if script_args.long_prompts == "drop":
        if len(too_long) == len(lengths):
            raise UsageError(f"every prompt is too long: {message}; raise --max_prompt_length or lower "
                             "--max_completion_length")
        if os.environ.get("RANK", "0") == "0":  # every process drops the same rows; one says so
            print(f"ppm-trl train: leaving out the prompts that do not fit: {message} (--long_prompts error refuses "
                  "them instead)", file=sys.stderr)
        return dataset.select(sorted(set(range(len(lengths))) - set(too_long)))
    raise UsageError(f"{message}. They would train on clipped completions only; shorten them, raise "
                     "--max_prompt_length / lower --max_completion_length, or pass --long_prompts drop")


def resolve_model(script_args, model_args, training_args) -> str:
    """`tiny` builds the offline tiny model into the output dir; a local path must exist and becomes absolute."""
    from .trainers.common import resolve_model_path

    name = model_args.model_name_or_path
    if name in (None, "", "tiny"):
        return resolve_model_path("tiny", training_args, hidden_size=script_args.tiny_hidden_size,
                                  num_hidden_layers=script_args.tiny_num_layers, tool_calling=script_args.multiturn)
    if looks_local(name) and not os.path.exists(os.path.expanduser(name)):
        raise UsageError(f"model path {name!r} does not exist (give a local directory with config.json, "
                         "a Hub id such as Qwen/Qwen3-1.7B, or `tiny`)")
    check_model_source(name, "--model_name_or_path")
    return resolve_model_path(os.path.expanduser(name), training_args)


def reward_names(script_args) -> list[str]:
    names = list(script_args.reward_funcs)
    if not names:
        names = ["env_outcome"] if script_args.env_name else ["accuracy"]
        names += get_method(script_args.method).extra_rewards
    for name in names:  # a user's import path is imported now: its error comes before any model is loaded
        if name not in REWARDS:
            load_reward(name)
    return names


def build_reward_funcs(script_args, training_args):
    functions = [load_reward(n) for n in reward_names(script_args)]  # ARG weighs `format` itself
    model = script_args.reward_model_name_or_path
    if model:
        method = get_method(script_args.method)
        verifier_first = "arg" in (method.parts or (method.name,))
        functions = [*functions, model] if verifier_first else [model, *functions]
    return functions


def build_trainer(script_args, training_args, model_args):
    from transformers import AutoTokenizer
    from trl import get_peft_config

    source = script_args.dataset_name or f"env {script_args.env_name!r}"
    train_dataset = prepare_dataset(script_args, training_args, load_train_dataset(script_args),
                                    reward_names(script_args), source)
    model = resolve_model(script_args, model_args, training_args)
    if not script_args.multiturn:  # tool-calling prompts are templated with their tools by TRL
        tokenizer = AutoTokenizer.from_pretrained(model)
        train_dataset = check_prompt_lengths(train_dataset, tokenizer, model, script_args, training_args)
    if model_args.dtype not in (None, "auto") or model_args.attn_implementation:
        training_args.model_init_kwargs = {
            **(training_args.model_init_kwargs or {}),
            **({"dtype": model_args.dtype} if model_args.dtype not in (None, "auto") else {}),
            **({"attn_implementation": model_args.attn_implementation} if model_args.attn_implementation else {}),
        }
    extra = {}
    if script_args.multiturn:  # its config fields were set by parse_train_args
        from .envs.multiturn import MULTITURN_ENVIRONMENTS

        extra["environment_factory"] = MULTITURN_ENVIRONMENTS[script_args.env_name]
    trainer_class = get_method(script_args.method).trainer_class()
    trainer = trainer_class(
        model=model,
        reward_funcs=build_reward_funcs(script_args, training_args),
        args=training_args,
        train_dataset=train_dataset,
        peft_config=get_peft_config(model_args),
        callbacks=[log_last_step_callback()],
        **extra,
    )
    from .trainers.base import MethodTrainer, RunReport

    trainer.remove_callback(RunReport)  # `report_done` says the same under the command's name, with the eval to run
    if isinstance(trainer, MethodTrainer):  # what its model card records (an env describes itself)
        trainer.model_card_dataset = script_args.dataset_name
        trainer.model_card_license = script_args.license
    return trainer


def run_training(script_args, training_args, model_args):
    """Build the trainer, train (resuming when asked), save, push to the Hub when asked; returns (trainer, result).
    `resume_from_checkpoint: last` (or `true`) resumes from the newest complete checkpoint of output_dir; which one
    is said on stderr, and a missing or incomplete checkpoint is an error before any model is loaded."""
    from .trainers.base import output_dir_lock, resolve_resume_checkpoint

    checkpoint, message = resolve_resume_checkpoint(training_args.resume_from_checkpoint, training_args.output_dir)
    main_process = os.environ.get("RANK", "0") == "0"
    if message and main_process:
        print(f"ppm-trl train: {message}", file=sys.stderr, flush=True)
    # Held from before the model loads to after the push: a second run into this output_dir stops at once.
    with output_dir_lock(training_args.output_dir, enabled=main_process):
        trainer = build_trainer(script_args, training_args, model_args)
        result = trainer.train(resume_from_checkpoint=checkpoint)
        trainer.save_model(training_args.output_dir)
        if training_args.push_to_hub:
            trainer.push_to_hub(dataset_name=script_args.dataset_name or script_args.env_name)
    return trainer, result


def run_example(method: str, argv: list[str] | None = None) -> dict:
    """`examples/train_<method>.py`: parse YAML + flags for one method, train, save, print `train_<method>: done`."""
    quiet_third_party()
    argv = list(sys.argv[1:] if argv is None else argv)
    path = config_path(argv)
    for said in (read_yaml_config(path).get("method") if path else None, flag_value(argv, "--method")):
        if said not in (None, "grpo", method):  # "grpo" is the field's default: not a choice the user made
            raise SystemExit(f"train_{method}.py trains `{method}`, but the config says method: {said}")
    # The same parse, checks and bf16 default as `ppm-trl train`.
    script_args, training_args, model_args = parse_train_args([*argv, "--method", method])
    trainer, result = run_training(script_args, training_args, model_args)
    summary = training_summary(trainer, result, method)
    if trainer.accelerator.is_main_process:
        report_done(f"train_{method}", summary, trainer, script_args)
    if stopped_early(trainer):
        raise SystemExit(JUDGE_BUDGET_EXIT_CODE)
    return summary


def train(argv: list[str]) -> None:
    quiet_third_party()
    script_args, training_args, model_args = parse_train_args(argv)
    trainer, result = run_training(script_args, training_args, model_args)
    if trainer.accelerator.is_main_process:
        report_done("ppm-trl train", training_summary(trainer, result, script_args.method), trainer, script_args)
    if stopped_early(trainer):  # the model is saved, but the run did not finish: not status 0
        raise SystemExit(JUDGE_BUDGET_EXIT_CODE)


def stopped_early(trainer) -> list[str]:
    """Why a callback (the judge budget) ended training before max_steps; empty when none did."""
    return [callback.stopped for callback in getattr(getattr(trainer, "callback_handler", None), "callbacks", [])
            if getattr(callback, "stopped", None)]


def report_done(prefix: str, summary: dict, trainer, script_args) -> None:
    """`<prefix>: done {json}` on stdout (naming `training_curves.png` when drawn); on stderr a warning when nothing
    was learned, and the `eval` to run next."""
    curves, no_curves = save_training_curves(trainer.state.log_history, summary["output_dir"],
                                             f"{summary.get('method', prefix)}: {os.path.basename(summary['output_dir'])}")
    if curves:
        summary["training_curves"] = curves
    print(f"{prefix}: done " + json.dumps(summary), flush=True)
    if no_curves:
        print(f"{prefix}: {no_curves}", file=sys.stderr)
    for reason in stopped_early(trainer):
        print(f"{prefix}: stopped early (exit status {JUDGE_BUDGET_EXIT_CODE}): {in_flag_spelling(reason)}",
              file=sys.stderr)
    problem = nothing_learned_this_run(trainer)
    if problem:
        print(f"{prefix}: warning: nothing was learned: {in_flag_spelling(problem)}", file=sys.stderr)
    print(f"{prefix}: evaluate with: {eval_command(summary['output_dir'], script_args)}", file=sys.stderr, flush=True)


def eval_command(output_dir: str, script_args) -> str:
    """The `ppm-trl eval` line for a trained model: the env on held-out seeds, or the user's held-out data."""
    import shlex

    if script_args.env_name:
        data = f"--env {script_args.env_name} --env_n {script_args.env_n}"
    else:
        data = "--dataset_name HELD_OUT_DATA" + "".join(
            f" --{flag} {shlex.quote(value)}" for flag, value in (("problem_column", script_args.problem_column),
                                                                  ("answer_column", script_args.answer_column)) if value)
    return f"ppm-trl eval --model {shlex.quote(output_dir)} {data} --num_samples 8 --k 1 8"


def log_last_step_callback():
    """A callback that logs the last step when it is not a logging step: TRL's metrics since the last log would be
    dropped, and the `done` summary of a run shorter than `logging_steps` would have none."""
    from transformers import TrainerCallback

    class LogLastStep(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if (state.global_step >= state.max_steps and args.logging_strategy == "steps"
                    and state.global_step % state.logging_steps):
                control.should_log = True
            return control

    return LogLastStep()


def train_fields(argv: list[str] | None = None) -> set[str]:
    """The names `ppm-trl train` takes as `--flags`: its script arguments, TRL's ModelConfig and the method's config
    (every method's when `argv` names none that can be read)."""
    import dataclasses

    classes = [TrainScriptArguments]
    try:
        from trl import ModelConfig

        classes.append(ModelConfig)
        methods = [method_from_argv(argv)] if argv is not None else list(METHODS)
        classes += [get_method(name).config_class() for name in methods]
    except (ImportError, ValueError, UsageError):  # an unknown method or config file: the fields known so far
        pass
    return {f.name for cls in classes for f in dataclasses.fields(cls)}


# A setting a library message suggests in Python spelling: `name=True`, `name="judge"`, `name: drop` (YAML).
_PYTHON_SETTING = re.compile(r"""(?<![\w.-])([a-z][a-z0-9]*(?:_[a-z0-9]+)+)(?:=|: )(?:"([^"]*)"|'([^']*)'|"""
                             r"""(True|False|true|false|[\w.+-]+))(?=[\s`.,;:)]|$)""")
_SETTING_NAME = re.compile(r"(?<=\()([a-z][a-z0-9]*(?:_[a-z0-9]+)+)(?=\))")  # "(judge_max_cost_usd)"


def in_flag_spelling(message: str, argv: list[str] | None = None) -> str:
    """A library message as `ppm-trl train` is used: a config field it names as the flag that sets it
    (`arg_skip_invalid_references=True` → `--arg_skip_invalid_references true`, `progress_scorer="judge"` →
    `--progress_scorer judge`, `(judge_max_cost_usd)` → `(--judge_max_cost_usd)`); a YAML key the message is
    about (`num_segments`) stays. The library raises in Python
    spelling, for Python users; only the command line translates."""
    if not _PYTHON_SETTING.search(message) and not _SETTING_NAME.search(message):
        return message
    fields = train_fields(argv)

    def setting(match):
        name, value = match.group(1), next(v for v in match.group(2, 3, 4) if v is not None)
        # A suggestion, not a description such as "a batch of per_device_train_batch_size=8 × 1 process".
        suggested = (match.group(2, 3) != (None, None) or value in ("True", "False")
                     or message[: match.start()].endswith(("set ", "with ", "pass ", "or ", "`")))
        if name not in fields or not suggested:
            return match.group(0)
        return f"--{name} {value.lower() if value in ('True', 'False') else value}"

    message = _PYTHON_SETTING.sub(setting, message)
    return _SETTING_NAME.sub(lambda m: f"--{m.group(1)}" if m.group(1) in fields else m.group(0), message)
