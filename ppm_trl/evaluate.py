"""`ppm-trl eval`: sample `num_samples` completions per problem of a synthetic env (held-out seeds) or of a dataset,
verify them, and print (and optionally write) pass@k and avg@n (`evaluation.py` holds the sampling and the maths).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field

from .data import check_model_source, load_train_dataset, prepare_dataset
from .flags import UsageError, check_config_keys, check_config_values, check_flags, config_path, read_yaml_config
from .train import TrainScriptArguments

# Flags `train` spells differently: the right spelling is named instead of a guess.
EVAL_RENAMED = {"--dataset_train_split": "--split", "--dataset-train-split": "--split", "--dataset": "--dataset_name",
                "--model_name_or_path": "--model", "--model-name-or-path": "--model"}


DEFAULT_EVAL_MAX_NEW_TOKENS = 512  # `eval`'s generation budget when neither the flag nor the model card says


@dataclass
class EvalArguments:
    """`ppm-trl eval`: a YAML key or a `--flag` each, like `train` (`--config eval.yaml` works too)."""

    model: str = field(default=None, metadata={"help": "Checkpoint directory (or Hub id) to evaluate. Required."})
    env_name: str | None = field(
        default=None, metadata={"aliases": ["--env"], "help": "Synthetic env to evaluate on (held-out seed); the "
                                "YAML key is `env_name` (TRL's parser keeps `env` for environment variables)."})
    env_n: int = field(default=2, metadata={"help": "Horizon n of the synthetic env."})
    env_size: int = field(default=64, metadata={"help": "Number of synthetic problems."})
    env_seed: int = field(default=10_000, metadata={"help": "Seed of the env generator (training's default is 0)."})
    dataset_name: str | None = field(
        default=None, metadata={"help": "Or a dataset (Hub id, save_to_disk dir, .jsonl/.json/.parquet/.csv file)."})
    dataset_config: str | None = field(default=None, metadata={"help": "Dataset configuration name."})
    split: str = field(default="test", metadata={"help": "Split of a Hub / save_to_disk dataset."})
    problem_column: str | None = field(default=None, metadata={"help": "As in `train`: the problem text column."})
    answer_column: str | None = field(default=None, metadata={"help": "As in `train`: the gold answer column."})
    num_samples: int = field(default=8, metadata={"help": "n, samples per problem."})
    k: list[int] = field(default_factory=lambda: [1, 8], metadata={"help": "The k of pass@k (each <= num_samples)."})
    max_new_tokens: int | None = field(
        default=None, metadata={"help": "Generation budget per sample. Default: the max_completion_length the model "
                                "was trained with, as its model card records it (ppm-trl's cards), else 512."})
    max_problems: int | None = field(
        default=None, metadata={"help": "Evaluate only the first N problems (of the dataset, or of the env's "
                                "env_size); a quick check before a full evaluation."})
    temperature: float = field(default=1.0, metadata={"help": "Sampling temperature (0 = greedy)."})
    top_p: float = field(default=1.0, metadata={"help": "Nucleus sampling."})
    batch_size: int = field(default=64, metadata={"help": "HF generation batch (sequences)."})
    seed: int = field(default=0, metadata={"help": "Sampling seed."})
    backend: str = field(default="auto", metadata={"help": "auto (vLLM on a GPU when installed) | hf | vllm."})
    output: str | None = field(
        default=None, metadata={"help": "Write metrics and per-problem completions and correctness as JSON here."})

    def __post_init__(self):
        if not self.model:
            raise UsageError("--model is required (a checkpoint directory or Hub id)")
        if not self.env_name and not self.dataset_name:
            raise UsageError("give --env NAME (synthetic) or --dataset_name ID_OR_FILE")
        if self.num_samples < 1:
            raise UsageError(f"--num_samples must be >= 1, got {self.num_samples}")
        for flag in ("max_problems", "max_new_tokens"):
            if getattr(self, flag) is not None and getattr(self, flag) < 1:
                raise UsageError(f"--{flag} must be >= 1, got {getattr(self, flag)}")
        bad = [k for k in self.k if not 1 <= k <= self.num_samples]
        if bad:
            raise UsageError(f"--k {' '.join(map(str, bad))}: pass@k needs 1 <= k <= num_samples "
                             f"({self.num_samples}); raise --num_samples or drop those k")
        if self.backend not in ("auto", "hf", "vllm"):
            raise UsageError(f"--backend must be auto, hf or vllm, got {self.backend!r}")



def load_model(path: str):
    """The causal LM at `path`; weights that cannot be loaded are one error naming the folder, not a traceback (a
    pickle `pytorch_model.bin` is read with `weights_only`: anything in it but tensors is refused, never run)."""
    from transformers import AutoModelForCausalLM

    try:
        return AutoModelForCausalLM.from_pretrained(path)
    except Exception as error:  # noqa: BLE001 - weights from a folder the user named: say which, keep --debug's trace
        import pickle

        # torch's own unpickling message suggests weights_only=False, i.e. running the file's code: not repeated
        first = "" if isinstance(error, pickle.UnpicklingError) else str(error).strip().split("\n")[0][:300]
        raise ValueError(f"--model {path}: its weights could not be loaded ({type(error).__name__}"
                         f"{': ' + first if first else ''}). A pickle "
                         "pytorch_model.bin may hold only tensors (it is loaded with weights_only); re-save the model "
                         "with save_pretrained (safetensors)") from error

def parse_eval_args(argv: list[str]) -> EvalArguments:
    from trl import TrlParser

    parser = TrlParser((EvalArguments,), prog="ppm-trl eval")
    check_flags(argv, parser, "eval", EVAL_RENAMED)
    path = config_path(argv)
    if path:
        config = read_yaml_config(path)
        check_config_keys(config, parser, path)
        check_config_values(config, (EvalArguments,), path)
    try:
        (args,) = parser.parse_args_and_config(argv)
    except UsageError:
        raise
    except (ValueError, TypeError) as error:
        raise UsageError(str(error)) from None
    return args


def evaluate(argv: list[str]) -> dict:
    """Sample `num_samples` completions per problem, verify them, print (and optionally write) pass@k and avg@n."""
    args = parse_eval_args(argv)
    from transformers import AutoTokenizer

    from . import evaluation, rewards

    script = TrainScriptArguments(env_name=args.env_name, env_n=args.env_n, env_size=args.env_size, env_seed=args.env_seed,
                                  dataset_name=args.dataset_name, dataset_config=args.dataset_config,
                                  dataset_train_split=args.split, problem_column=args.problem_column,
                                  answer_column=args.answer_column)
    source = args.dataset_name or f"env {args.env_name!r}"
    reward = "env_outcome" if args.env_name else "accuracy"
    check_model_source(args.model, "--model")
    dataset = prepare_dataset(script, None, load_train_dataset(script, "--split"), [reward], source)
    if args.max_problems is not None and args.max_problems < len(dataset):
        dataset = dataset.select(range(args.max_problems))
    max_new_tokens, budget_from = args.max_new_tokens, "--max_new_tokens"
    if max_new_tokens is None:
        trained = evaluation.trained_completion_length(args.model)
        max_new_tokens, budget_from = ((trained, "the max_completion_length its model card records") if trained
                                       else (DEFAULT_EVAL_MAX_NEW_TOKENS, "the default; set --max_new_tokens"))
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    backend = args.backend
    if backend == "auto":
        import importlib.util

        import torch

        backend = "vllm" if torch.cuda.is_available() and importlib.util.find_spec("vllm") else "hf"
    print(f"ppm-trl eval: {len(dataset)} problems from {source}, {args.num_samples} samples each of at most "
          f"{max_new_tokens} new tokens ({budget_from}) ({backend})", file=sys.stderr)
    if backend == "vllm":
        samples = evaluation.sample_completions_vllm(args.model, tokenizer, dataset["prompt"], args.num_samples,
                                                     max_new_tokens, args.temperature, args.top_p, args.seed)
    else:
        model = load_model(args.model)
        samples = evaluation.sample_completions(model, tokenizer, dataset["prompt"], args.num_samples,
                                                max_new_tokens, args.temperature, args.top_p, args.batch_size,
                                                args.seed, progress=True)
    verifier = rewards.env_outcome_reward if args.env_name else rewards.accuracy_reward
    columns = [c for c in dataset.column_names if c != "prompt"]
    correct = []
    for index, completions in enumerate(samples):
        row = dataset[index]
        kwargs = {c: [row[c]] * len(completions) for c in columns}
        correct.append([bool(r) for r in verifier(completions, **kwargs)])
    metrics = evaluation.summarize(correct, args.k)
    report = {"model": args.model, "dataset": source, "problems": len(dataset), "samples_per_problem": args.num_samples,
              "max_new_tokens": max_new_tokens, **metrics}
    print("ppm-trl eval: " + json.dumps(report))
    if args.output:
        problems = [{"index": i, "prompt": dataset[i]["prompt"], "answer": dataset[i].get("answer"),
                     "completions": completions, "correct": flags}
                    for i, (completions, flags) in enumerate(zip(samples, correct))]
        with open(args.output, "w") as f:
            json.dump({**report, "metrics": metrics, "per_problem": problems, "args": vars(args)}, f, indent=1)
    return report
