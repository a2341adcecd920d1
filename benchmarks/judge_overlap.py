"""Judge latency hidden inside the PPM or PAPO step (issue #17 part 3, issue 24 item 4): step time with the judge
called after TRL's rewards (sequential, `overlap_scoring=False`) against the judge started as soon as the
completions exist and run while TRL computes the reference model's log-probs (`overlap_scoring=True`, the default),
in ONE run.

One trainer (hidden 512, 4 layers, 128 rows = 16 prompts × 8, 64-token budget, beta > 0 so the reference log-prob
pass runs) trains against the loopback judge server (tests/judge_server.py, in its own process, `openai_http`
transport, 128 requests in flight), no cache hit (every step's completions are new). `--method ppm` (default): a
PPMGRPOTrainer, K = 4 segments, ~4 new grading requests per row. `--method papo`: a PAPOTrainer with the rubric
judge (`process_scorer=judge`), 3 of 4 rows correct, one rubric request per correct row; overlapped, its outcome
rewards are computed right after generation and the judge starts on the correct rows. The steps alternate between
the two modes at each latency L ∈ {0, 0.25, 1.0} s, after one warm-up step. Completions are scripted (the same text
shapes every step), so the steps differ only by the mode and the latency.

Timers inside the step, per step: the judge (the scorer call, on whichever thread it ran), the log-prob passes (every
no-grad forward of the policy and the reference model; generation is scripted, so these are TRL's log-prob passes
only), and the hook where the overlapped step collects the grades, i.e. waits for what was not hidden (`collect_s`:
`compute_advantages`, which also does the method's advantage math, milliseconds). Hidden judge time = judge − the overlapped step's collect time; the
fraction hidden is that over min(judge, log-prob). The step-time saving (sequential − overlapped) over the same
minimum is reported as well.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/judge_overlap.py [--method papo] [--repeats 4] [--json out.json]
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/judge_overlap.py --quick     # CI smoke (seconds; timings noise)
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import statistics
import sys
import tempfile
import time
from collections import defaultdict

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("OPENAI_API_KEY", "sk-loopback-dummy")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

FULL = dict(hidden_size=512, num_hidden_layers=4, prompts=16, num_generations=8, budget=64, latencies=[0.0, 0.25, 1.0],
            repeats=4, concurrency=128)
QUICK = dict(hidden_size=64, num_hidden_layers=2, prompts=2, num_generations=4, budget=64, latencies=[0.0, 0.05],
             repeats=1, concurrency=64)
K = 4
POINTS = ['computes "alpha"', 'computes "beta"', 'states the final answer "\\boxed{7}"']


def serve(connection) -> None:
    """Child process: the loopback judge; commands over the pipe: ('latency', seconds), ('count',), ('stop',)."""
    from judge_server import JudgeServer

    with JudgeServer(max_lifetime=3600, max_requests=10_000_000) as server:
        connection.send(server.api_base)
        while (command := connection.recv())[0] != "stop":
            if command[0] == "latency":
                server.latency = command[1]
            connection.send(server.requests)


def ask(connection, *command):
    connection.send(command)
    return connection.recv()


PATTERNS = {  # per row (i mod 4), one line per segment; PAPO's: three correct (with the box), one wrong
    "ppm": [["alpha", "beta", "\\boxed{7}"], ["x", "alpha", "y"], ["beta"], ["alpha", "beta", "z"]],
    "papo": [["alpha", "beta", "\\boxed{7}"], ["x", "alpha", "\\boxed{7}"], ["beta", "\\boxed{7}"], ["alpha", "beta", "z"]],
}


def completion_texts(step: int, rows: int, budget: int, method: str = "ppm") -> list[str]:
    """Row i of generation call `step`: a progress pattern over K segments, tagged so every prefix is a new request."""
    width = budget // K
    patterns = PATTERNS[method]
    texts = []
    for i in range(rows):
        parts = [f"{word} {step:x}{i:02x}"[: width - 1].ljust(width - 1) + "\n" for word in patterns[i % len(patterns)]]
        texts.append("".join(parts)[: budget - 1])
    return texts


class StepClock:
    """Per-step timers: whole step (a callback), the judge, the no-grad log-prob forwards and `compute_advantages`."""

    def __init__(self):
        self.steps, self.current = [], defaultdict(float)

    def add(self, name, seconds):
        self.current[name] += seconds

    def timed(self, function, name):
        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                self.add(name, time.perf_counter() - start)

        return wrapper

    def watch_forwards(self, model):
        """Time every no-grad forward of `model` (TRL's log-prob passes; training forwards have grad enabled)."""
        import torch

        def before(module, inputs):
            if not torch.is_grad_enabled():
                module._overlap_bench_start = time.perf_counter()

        def after(module, inputs, output):
            if not torch.is_grad_enabled():
                self.add("logprob_s", time.perf_counter() - module._overlap_bench_start)

        model.register_forward_pre_hook(before)
        model.register_forward_hook(after)


class TimedScorer:
    """The trainer's progress (PPM) or process (PAPO) scorer with its wall time added to the clock (on whichever
    thread it runs)."""

    def __init__(self, inner, clock):
        self.inner, self.clock = inner, clock

    @property
    def stats(self):
        return self.inner.stats

    def __call__(self, rows, texts):
        return self.clock.timed(self.inner, "judge_s")(rows, texts)


def build_trainer(settings, api_base, workdir, connection, plan):
    """The trainer, its scripted generation, the step clock and the (latency, mode) schedule, one step each."""
    from datasets import Dataset
    from transformers import TrainerCallback

    from ppm_trl.papo.papo_config import PAPOConfig
    from ppm_trl.papo.papo_trainer import PAPOTrainer
    from ppm_trl.ppm.ppm_config import PPMConfig
    from ppm_trl.ppm.ppm_trainer import PPMGRPOTrainer
    from ppm_trl.tiny import save_tiny_model

    rows = settings["prompts"] * settings["num_generations"]
    dataset = Dataset.from_list([{
        "prompt": f"P{i}: alpha, beta, answer?", "answer": "7", "reference": "alpha\nbeta\n\\boxed{7}",
        "reasoning_points": POINTS, "reasoning_graph": [{"if_all": [3], "makes_obsolete": [1, 2]}],
    } for i in range(settings["prompts"])] * len(plan))
    model_path = save_tiny_model(os.path.join(workdir, "model"), hidden_size=settings["hidden_size"],
                                 num_hidden_layers=settings["num_hidden_layers"])
    common = dict(
        output_dir=os.path.join(workdir, "out"), use_cpu=True, bf16=False, gradient_checkpointing=False,
        report_to="none", save_strategy="no", logging_steps=10_000, disable_tqdm=True, seed=0, max_steps=len(plan),
        per_device_train_batch_size=rows, num_generations=settings["num_generations"],
        max_completion_length=settings["budget"], beta=0.04, learning_rate=1e-5, judge_model="openai/loopback-judge",
        judge_api_base=api_base, judge_transport="openai_http", judge_max_concurrency=settings["concurrency"],
        judge_timeout=30, judge_probe=False, judge_cache_dir=os.path.join(workdir, "judge_cache"),
        shuffle_dataset=False,
    )
    if settings["method"] == "papo":
        args, trainer_class = PAPOConfig(process_scorer="judge", **common), PAPOTrainer
    else:
        args = PPMConfig(num_segments=K, filter_zero_advantage_groups=False, progress_scorer="judge", **common)
        trainer_class = PPMGRPOTrainer

    def outcome(completions, **kwargs):
        return [1.0 if "\\boxed{7}" in c else 0.0 for c in completions]

    trainer = trainer_class(model=model_path, reward_funcs=outcome, args=args, train_dataset=dataset)
    tokenizer = trainer.processing_class
    calls = []

    def scripted(prompt_ids, images=None, multimodal_fields=None, num_generations=1, has_tool_images=False):
        texts = completion_texts(len(calls), len(prompt_ids), settings["budget"], settings["method"])
        calls.append(len(prompt_ids))
        return [tokenizer(t, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id] for t in texts], None

    trainer.sample_completion_ids = scripted
    clock = StepClock()
    clock.watch_forwards(trainer.model)
    clock.watch_forwards(trainer.ref_model)
    scorer_attr = "process_scorer" if settings["method"] == "papo" else "progress_scorer"
    setattr(trainer, scorer_attr, TimedScorer(getattr(trainer, scorer_attr), clock))
    trainer.compute_advantages = clock.timed(trainer.compute_advantages, "collect_s")  # collects the early grades

    class Schedule(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            latency, overlap = plan[state.global_step]
            trainer.args.overlap_scoring = overlap
            self.requests = ask(connection, "latency", latency)
            clock.current = defaultdict(float)
            self.start = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            latency, overlap = plan[state.global_step - 1]
            clock.steps.append({"latency": latency, "overlap": overlap, "step_s": time.perf_counter() - self.start,
                                "requests": ask(connection, "count") - self.requests, **clock.current})

    trainer.add_callback(Schedule())
    return trainer, clock


def measure(settings) -> dict:
    """Step 0 warms up; then each latency, each mode once per repeat, alternating which mode goes first."""
    context = multiprocessing.get_context("spawn")
    parent, child = context.Pipe()
    process = context.Process(target=serve, args=(child,), daemon=True)
    process.start()
    api_base = parent.recv()
    plan = [(settings["latencies"][0], True)]
    for latency in settings["latencies"]:
        for repeat in range(settings["repeats"]):
            plan += [(latency, overlap) for overlap in ((False, True) if repeat % 2 == 0 else (True, False))]
    load_before = os.getloadavg()
    try:
        with tempfile.TemporaryDirectory() as workdir:
            trainer, clock = build_trainer(settings, api_base, workdir, parent, plan)
            trainer.train()
    finally:
        parent.send(("stop",))
        process.join(10)
    return {"settings": settings, "steps": clock.steps[1:], "load_average_before": load_before,
            "load_average_after": os.getloadavg()}


def summarise(result: dict) -> list[dict]:
    rows = []
    for latency in result["settings"]["latencies"]:
        def median(overlap, key, latency=latency):
            values = [s.get(key, 0.0) for s in result["steps"] if s["latency"] == latency and s["overlap"] == overlap]
            return statistics.median(values)

        judge, logprob = median(True, "judge_s"), median(True, "logprob_s")
        hidden = max(judge - median(True, "collect_s"), 0.0)
        saved = median(False, "step_s") - median(True, "step_s")
        base = min(judge, logprob)
        rows.append({"latency_s": latency, "step_sequential_s": median(False, "step_s"),
                     "step_overlapped_s": median(True, "step_s"), "judge_s": judge,
                     "judge_sequential_s": median(False, "judge_s"), "logprob_s": logprob,
                     "collect_overlapped_s": median(True, "collect_s"),
                     "collect_sequential_s": median(False, "collect_s"), "hidden_s": hidden,
                     "fraction_hidden": min(hidden / base, 1.0) if base > 0 else float("nan"),
                     "step_saving_s": saved, "step_saving_over_min": saved / base if base > 0 else float("nan"),
                     "requests_per_step": median(True, "requests")})
    return rows


def table(rows: list[dict]) -> str:
    from common import markdown_table

    return markdown_table(
        ["L (s)", "step sequential (s)", "step overlapped (s)", "judge (s)", "log-prob (s)",
         "hidden of min(judge, log-prob)", "step saving / min"],
        [[f"{r['latency_s']:g}", f"{r['step_sequential_s']:.2f}", f"{r['step_overlapped_s']:.2f}",
          f"{r['judge_s']:.2f}", f"{r['logprob_s']:.2f}", f"{100 * r['fraction_hidden']:.0f} %",
          f"{100 * r['step_saving_over_min']:.0f} %"] for r in rows])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--method", choices=("ppm", "papo"), default="ppm",
                        help="ppm: the progress judge (K requests per row); papo: the rubric judge of the correct rows")
    parser.add_argument("--quick", action="store_true", help="CI smoke: a tiny model, 8 rows, 2 latencies.")
    parser.add_argument("--repeats", type=int, help="steps per (latency, mode); default 4 (quick: 1)")
    parser.add_argument("--json", help="write settings, every step's timers and the summary here")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    settings = dict(QUICK if args.quick else FULL, method=args.method)
    if args.repeats:
        settings["repeats"] = args.repeats
    started = time.time()
    result = measure(settings)
    result["summary"] = summarise(result)
    result["wall_s"] = time.time() - started
    result["machine"] = {"cpus": os.cpu_count(), "platform": platform.platform(),
                         "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS")}
    print(f"{args.method.upper()}: rows per step {settings['prompts'] * settings['num_generations']}, "
          f"hidden {settings['hidden_size']}, "
          f"{settings['num_hidden_layers']} layers, beta 0.04 (reference log-prob pass), "
          f"{result['summary'][0]['requests_per_step']:.0f} judge requests per step; load average "
          f"{result['load_average_before'][0]:.2f} → {result['load_average_after'][0]:.2f} on {os.cpu_count()} CPUs")
    print(table(result["summary"]))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(result, handle, indent=1)


if __name__ == "__main__":
    main()
