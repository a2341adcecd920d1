"""`ppm-trl train | eval | prepare`.

`train` parses YAML + flags the TRL way (`TrlParser`): every field of the method's config (`PPMConfig`,
`PAPOConfig`, `ARGConfig` or TRL's `GRPOConfig`), of TRL's `ModelConfig` (LoRA: `--use_peft --lora_r ...`) and of
`TrainScriptArguments` below is a YAML key and a `--flag`; flags override the YAML; unknown keys are errors.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass, field

METHODS = ("grpo", "ppm", "papo", "arg")
REWARD_FUNCS = ("env_outcome", "accuracy", "format", "env_point_fraction")


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
        metadata={"help": f"Reward functions among {', '.join(REWARD_FUNCS)}; default: env_outcome for an env, "
                  "accuracy otherwise (arg: accuracy + format)."},
    )
    multiturn: bool = field(
        default=False,
        metadata={"help": "Multi-turn form of the env (multi_countdown, matrix): one sub-problem per turn through "
                  "TRL's environment/tool loop; sets segmentation=turns, num_segments=n, the per-turn budget."},
    )
    tokens_per_turn: int = field(default=256, metadata={"help": "Multi-turn: generation budget of one turn."})
    tool_tokens_per_turn: int = field(default=128, metadata={"help": "Multi-turn: bound on one tool reply."})
    tiny_hidden_size: int = field(default=64, metadata={"help": "Width of `model_name_or_path: tiny`."})
    tiny_num_layers: int = field(default=2, metadata={"help": "Depth of `model_name_or_path: tiny`."})


def _config_class(method: str):
    from trl import GRPOConfig

    from .configs import ARGConfig, PAPOConfig, PPMConfig

    classes = {"grpo": GRPOConfig, "ppm": PPMConfig, "papo": PAPOConfig, "arg": ARGConfig}
    if method not in classes:
        raise SystemExit(f"ppm-trl train: unknown method {method!r}; accepted: {', '.join(METHODS)}")
    return classes[method]


def _method_from_argv(argv: list[str]) -> str:
    """`method` decides the config class, so read it before the full parse (flag first, then the YAML)."""
    import yaml

    for i, arg in enumerate(argv):
        if arg == "--method" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--method="):
            return arg.split("=", 1)[1]
    for i, arg in enumerate(argv):
        if arg == "--config" and i + 1 < len(argv):
            path = argv[i + 1]
            if not os.path.isfile(path):
                raise SystemExit(f"ppm-trl train: config file {path!r} does not exist")
            with open(path) as f:
                return (yaml.safe_load(f) or {}).get("method", "grpo")
    return "grpo"


def parse_train_args(argv: list[str]):
    from trl import ModelConfig, TrlParser

    config_class = _config_class(_method_from_argv(argv))
    parser = TrlParser((TrainScriptArguments, config_class, ModelConfig), prog="ppm-trl train")
    try:
        script_args, training_args, model_args = parser.parse_args_and_config(argv)
    except ValueError as error:  # TrlParser reports unknown YAML keys as ValueError
        raise SystemExit(f"ppm-trl train: {error}") from None
    return script_args, training_args, model_args


def load_train_dataset(script_args):
    if script_args.env_name and script_args.dataset_name:
        raise SystemExit("ppm-trl train: give either `env_name` or `dataset_name`, not both")
    if script_args.env_name and getattr(script_args, "multiturn", False):
        from .envs.multiturn import make_multiturn_dataset

        return make_multiturn_dataset(script_args.env_name, script_args.env_n, script_args.env_size,
                                      seed=script_args.env_seed)
    if script_args.env_name:
        from .envs import make_dataset

        return make_dataset(script_args.env_name, script_args.env_n, script_args.env_size, seed=script_args.env_seed)
    if not script_args.dataset_name:
        raise SystemExit("ppm-trl train: no data; set `env_name: <name>` (synthetic) or `dataset_name: <id or path>`")
    import datasets

    name = script_args.dataset_name
    if os.path.isdir(name) and os.path.exists(os.path.join(name, "dataset_dict.json")):
        return datasets.load_from_disk(name)[script_args.dataset_train_split]
    if os.path.isdir(name) and os.path.exists(os.path.join(name, "dataset_info.json")):
        return datasets.load_from_disk(name)
    if os.path.isfile(name):
        kind = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}.get(os.path.splitext(name)[1])
        if kind is None:
            raise SystemExit(f"ppm-trl train: cannot read {name!r}; accepted files: .jsonl .json .parquet .csv")
        return datasets.load_dataset(kind, data_files=name, split="train")
    return datasets.load_dataset(name, script_args.dataset_config, split=script_args.dataset_train_split)


def resolve_model(script_args, model_args, training_args) -> str:
    """`tiny` builds the offline tiny model into the output dir; a local path must exist."""
    name = model_args.model_name_or_path
    if name in (None, "", "tiny"):
        from .tiny import save_tiny_model

        path = os.path.join(training_args.output_dir, "initial_tiny_model" + ("_tools" * script_args.multiturn))
        if not os.path.exists(os.path.join(path, "config.json")):
            save_tiny_model(path, seed=training_args.seed, hidden_size=script_args.tiny_hidden_size,
                            num_hidden_layers=script_args.tiny_num_layers, tool_calling=script_args.multiturn)
        return path
    looks_local = name.startswith((".", "/", "~")) or name.count("/") >= 2  # a Hub id is `org/name`
    if looks_local and not os.path.exists(os.path.expanduser(name)):
        raise SystemExit(f"ppm-trl train: model path {name!r} does not exist (give a local directory with config.json, "
                         "a Hub id such as Qwen/Qwen3-1.7B, or `tiny`)")
    return os.path.expanduser(name)


def build_reward_funcs(script_args, training_args):
    from . import rewards

    table = {
        "env_outcome": rewards.env_outcome_reward,
        "accuracy": rewards.accuracy_reward,
        "format": rewards.format_reward,
        "env_point_fraction": rewards.env_point_fraction,
    }
    names = list(script_args.reward_funcs)
    if not names:
        names = ["env_outcome"] if script_args.env_name else ["accuracy"]
        if script_args.method == "arg":
            names.append("format")
            if training_args.reward_weights is None:
                training_args.reward_weights = [1.0, training_args.format_reward_weight]
    unknown = [n for n in names if n not in table]
    if unknown:
        raise SystemExit(f"ppm-trl train: unknown reward function(s) {unknown}; accepted: {', '.join(REWARD_FUNCS)}")
    return [table[n] for n in names]


def build_trainer(script_args, training_args, model_args):
    from trl import GRPOTrainer, get_peft_config

    train_dataset = load_train_dataset(script_args)
    model = resolve_model(script_args, model_args, training_args)
    if model_args.dtype not in (None, "auto") or model_args.attn_implementation:
        training_args.model_init_kwargs = {
            **(training_args.model_init_kwargs or {}),
            **({"dtype": model_args.dtype} if model_args.dtype not in (None, "auto") else {}),
            **({"attn_implementation": model_args.attn_implementation} if model_args.attn_implementation else {}),
        }
    extra = {}
    if script_args.multiturn:
        from .envs.multiturn import MULTITURN_ENVIRONMENTS, multiturn_config_kwargs

        if script_args.env_name not in MULTITURN_ENVIRONMENTS:
            raise SystemExit(f"ppm-trl train: `multiturn` needs env_name in {sorted(MULTITURN_ENVIRONMENTS)}, "
                             f"got {script_args.env_name!r}")
        settings = multiturn_config_kwargs(script_args.env_n, script_args.tokens_per_turn,
                                           script_args.tool_tokens_per_turn, use_vllm=training_args.use_vllm)
        for key, value in settings.items():
            if hasattr(training_args, key):
                setattr(training_args, key, value)
        extra["environment_factory"] = MULTITURN_ENVIRONMENTS[script_args.env_name]
    trainer_class = GRPOTrainer
    if script_args.method == "ppm":
        from .trainers.ppm import PPMGRPOTrainer as trainer_class
    elif script_args.method == "papo":
        from .trainers.papo import PAPOTrainer as trainer_class
    elif script_args.method == "arg":
        from .trainers.arg import ARGTrainer as trainer_class
    return trainer_class(
        model=model,
        reward_funcs=build_reward_funcs(script_args, training_args),
        args=training_args,
        train_dataset=train_dataset,
        peft_config=get_peft_config(model_args),
        **extra,
    )


def run_training(script_args, training_args, model_args):
    """Build the trainer, train (resuming when asked), save, push to the Hub when asked; returns (trainer, result)."""
    trainer = build_trainer(script_args, training_args, model_args)
    result = trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    trainer.save_model(training_args.output_dir)
    if training_args.push_to_hub:
        trainer.push_to_hub(dataset_name=script_args.dataset_name or script_args.env_name)
    return trainer, result


def training_summary(trainer, result, method: str) -> dict:
    """Steps, per-step wall time (TRL's `step_time`), loss, peak GPU memory (and ARG's guidance totals)."""
    import torch

    history = trainer.state.log_history
    summary = {"method": method, "steps": result.global_step, "train_loss": result.training_loss,
               "train_runtime_s": result.metrics.get("train_runtime"),
               "step_time_s": [entry["step_time"] for entry in history if "step_time" in entry],
               "output_dir": trainer.args.output_dir}
    selector = getattr(trainer, "prefix_selector", None)
    if selector is not None:
        summary["guidance_totals"] = {
            name: sum(entry.get(f"arg/{name}", 0.0) for entry in history)
            for name in ("all_failure_groups", "groups_with_accepted", "fallback_groups", "inserted_rows")}
        summary["selector_probs"] = dict(zip(map(str, selector.levels), selector.probs().tolist()))
    if torch.cuda.is_available():
        summary["peak_torch_gpu_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 3)
    return summary


def run_example(method: str, argv: list[str] | None = None) -> dict:
    """`examples/train_<method>.py`: parse YAML + flags for one method, train, save, print `train_<method>: done`."""
    from trl import ModelConfig, TrlParser

    parser = TrlParser((TrainScriptArguments, _config_class(method), ModelConfig))
    script_args, training_args, model_args = parser.parse_args_and_config(argv)
    if script_args.method not in ("grpo", method):  # "grpo" is the field's default: not set by the user
        raise SystemExit(f"train_{method}.py trains `{method}`, but the config says method: {script_args.method}")
    script_args.method = method
    trainer, result = run_training(script_args, training_args, model_args)
    summary = training_summary(trainer, result, method)
    if trainer.accelerator.is_main_process:
        print(f"train_{method}: done " + json.dumps(summary), flush=True)
    return summary


def train(argv: list[str]) -> None:
    script_args, training_args, model_args = parse_train_args(argv)
    trainer, result = run_training(script_args, training_args, model_args)
    if trainer.accelerator.is_main_process:
        summary = {"method": script_args.method, "steps": result.global_step, "train_loss": result.training_loss,
                   "output_dir": training_args.output_dir}
        print("ppm-trl train: done " + json.dumps(summary))


def evaluate(argv: list[str]) -> dict:
    parser = argparse.ArgumentParser(prog="ppm-trl eval", description="pass@k and avg@k of a checkpoint.")
    parser.add_argument("--model", required=True, help="Checkpoint directory (or Hub id).")
    parser.add_argument("--env", help="Synthetic env to evaluate on (held-out seed).")
    parser.add_argument("--env_n", type=int, default=2)
    parser.add_argument("--env_size", type=int, default=64)
    parser.add_argument("--env_seed", type=int, default=10_000, help="Default differs from training's seed 0.")
    parser.add_argument("--dataset_name", help="Or a dataset with `prompt` and `answer` columns.")
    parser.add_argument("--split", default="test")
    parser.add_argument("--num_samples", type=int, default=8, help="n samples per problem.")
    parser.add_argument("--k", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--max_new_tokens", type=int, default=512)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--top_p", type=float, default=1.0)
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--backend", choices=("auto", "hf", "vllm"), default="auto")
    parser.add_argument("--output", help="Write the metrics (and per-problem results) as JSON here.")
    args = parser.parse_args(argv)

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from . import evaluation, rewards

    script = TrainScriptArguments(env_name=args.env, env_n=args.env_n, env_size=args.env_size, env_seed=args.env_seed,
                                  dataset_name=args.dataset_name, dataset_train_split=args.split)
    dataset = load_train_dataset(script)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    backend = args.backend
    if backend == "auto":
        import importlib.util

        import torch

        backend = "vllm" if torch.cuda.is_available() and importlib.util.find_spec("vllm") else "hf"
    if backend == "vllm":
        samples = evaluation.sample_completions_vllm(args.model, tokenizer, dataset["prompt"], args.num_samples,
                                                     args.max_new_tokens, args.temperature, args.top_p, args.seed)
    else:
        model = AutoModelForCausalLM.from_pretrained(args.model)
        samples = evaluation.sample_completions(model, tokenizer, dataset["prompt"], args.num_samples,
                                                args.max_new_tokens, args.temperature, args.top_p, args.batch_size,
                                                args.seed)
    verifier = rewards.env_outcome_reward if args.env else rewards.accuracy_reward
    columns = [c for c in dataset.column_names if c != "prompt"]
    correct = []
    for index, completions in enumerate(samples):
        row = dataset[index]
        kwargs = {c: [row[c]] * len(completions) for c in columns}
        correct.append([bool(r) for r in verifier(completions, **kwargs)])
    metrics = evaluation.summarize(correct, args.k)
    print(json.dumps(metrics))
    if args.output:
        with open(args.output, "w") as f:
            json.dump({"metrics": metrics, "correct": correct, "args": vars(args)}, f, indent=1)
    return metrics


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = ("train", "eval", "prepare")
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in commands:
        print("usage: ppm-trl {train,eval,prepare} ...\n"
              "  train    --config FILE.yaml [--key value ...]  (method: grpo|ppm|papo|arg)\n"
              "  eval     --model DIR --env NAME | --dataset_name ID  (pass@k, avg@k)\n"
              "  prepare  --dataset ID --reference-column COL --judge-model M --out DIR  (points + graph)")
        raise SystemExit(0 if argv and argv[0] in ("-h", "--help") else 2)
    command, rest = argv[0], argv[1:]
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if command == "train":
        train(rest)
    elif command == "eval":
        evaluate(rest)
    else:
        from .prepare import main as prepare_main

        prepare_main(rest)


if __name__ == "__main__":
    main()
