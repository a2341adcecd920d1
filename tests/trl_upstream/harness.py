"""Runs TRL's own GRPO tests (test_grpo_trainer.py, vendored) against our trainers, offline (ours, not TRL's).

conftest.py hands pytest the hooks and fixtures defined here. Each test of TRL's file runs once per selected trainer,
with `GRPOTrainer` and `GRPOConfig` of the test module swapped for the trainer and its config (`trl_method`), and the
method active: PPM's segment advantages and PAPO's decoupled advantages from the text scorers of offline.py (TRL's
random tiny model reaches none of a task's reasoning points, so the built-in programmatic scorers would give 0
everywhere), ARG's reference guidance of all-failure groups. A trainer that trains must call its method's hooks
(`METHOD_HOOKS`), or the test fails. The datasets carry the methods' columns (offline.py); every TRL field the test
does not set keeps TRL's default (the test was written against `GRPOConfig`). `grpo` is TRL's own trainer.

What runs (environment variables; `make test-trl-upstream` sets them):
* `TRL_UPSTREAM_METHODS` (default `ppm,papo,arg`): the trainers;
* `TRL_UPSTREAM_FULL` (default: one of them, chosen by the commit: `full_method()`): the trainer that runs the whole
  file; the others run `CORE`. `all`: the whole file for every trainer; a trainer not in the list: `CORE` only.

README.md ("TRL's own GRPO tests") holds two tables this reads: "Expected refusals" (such a test must raise an error
whose message names the option and the alternative the row gives; it fails when it passes — the refusal is gone,
remove the row — and when it fails otherwise) and "Not run here" (skipped, or strict xfail). Every other failure is
a failure.
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
from pathlib import Path
from typing import NamedTuple

import pytest

from . import offline

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
UPSTREAM_MODULE = "test_grpo_trainer"

# The trainers, in the order the full file rotates through them (`full_method`); `grpo` is TRL's, the baseline.
METHODS = ("ppm", "papo", "arg", "ppm+arg", "papo+arg", "verifree", "opsd", "grpo")
DEFAULT_METHODS = "ppm,papo,arg"

# Tests of TRL's file that need no trainer: run once, not per trainer.
NO_TRAINER_CLASSES = {"TestTransformersContinuousBatchingContract"}

# The tests every selected trainer runs on every run (patterns on TRL's test names, `*` matching anything):
# construction without args and TRL's argument checks; the reward paths (a reward function, several with weights
# or returning None, a function beside a reward model, another reward model, an extra dataset column, the logged
# weighted reward, reward processing classes); the advantage paths (a sequence-normalised loss type and the
# sequence-level ones PPM refuses, scale_rewards, normalize_then_sum, sequence-level importance sampling, the
# off-policy mask); and the multi-turn paths (a tool, environment_factory, environment-owned reward and data). The
# rest of the file — training-loop variants that reach our code only through TRL's loop (evaluation, iterable
# datasets, PEFT, entropy terms, gradient accumulation, generation kwargs, reference-model sync, more variants of
# the same tests) — runs for one trainer per run (`full_method`).
CORE = (
    "test_generate_rollout_func_raises_when_required_keys_are_missing",
    "test_init_minimal",
    "test_train_dataset_format[conversational_prompt_only]",
    "test_train_loss_types[dapo-False]",
    "test_train_loss_types[luspo-False]",
    "test_train_loss_types[vespo-False]",
    "test_train_reward_func_standard",
    "test_train_multiple_reward_funcs_with_None_output",
    "test_train_multiple_reward_funcs_with_weights",
    "test_reward_metric_reflects_reward_weights[*]",
    "test_train_multiple_mixed_reward_funcs",
    "test_train_reward_func_additional_column",
    "test_train_different_reward_model",
    "test_train_with_off_policy_mask",
    "test_train_normalize_then_sum_aggregation",
    "test_train_scale_rewards[group]",
    "test_train_scale_rewards[none]",
    "test_train_sequence_importance_sampling",
    "test_warning_raised_all_rewards_none",
    "test_train_with_tools[tools0]",
    "test_train_with_environment_factory",
    "test_train_with_environment_owned_reward",
    "test_train_with_environment_owned_data",
    "test_no_reward_source_raises",
    "test_dataset_required_without_environment",
    "test_environment_owned_data_requires_max_steps",
    "test_mismatched_reward_processing_classes_length",
    "test_correct_reward_processing_classes_list",
)

# Left out of every run but `TRL_UPSTREAM_FULL=all`: the slowest test of the file (two dataloader worker processes
# re-import torch and TRL: 25-35 s idle, minutes under load), about TRL's data loading, which our trainers leave alone.
FULL_ONLY = ("test_train_multiple_dataloader_workers",)


def in_core(name: str) -> bool:
    return any(_matches(pattern, name) for pattern in CORE)


# What does not run here, and why, is README.md's "Not run here" table (read by `readme_tables`), beside TRL's own
# skip markers (GPU, vLLM, liger, bitsandbytes, kernels, deepspeed), which stay as TRL wrote them. A test whose
# parameters name a Hub model without a local stand-in (offline.HUB_MODELS) is skipped too, naming the model.
HUB_ORGS = ("trl-internal-testing", "Qwen", "HuggingFaceTB")


def selected_methods() -> list[str]:
    names = [name.strip() for name in os.environ.get("TRL_UPSTREAM_METHODS", DEFAULT_METHODS).split(",") if name.strip()]
    unknown = [name for name in names if name not in METHODS]
    if unknown:
        raise pytest.UsageError(f"TRL_UPSTREAM_METHODS: unknown trainer(s) {unknown}; accepted: {', '.join(METHODS)}")
    return names


def full_method(methods: list[str]) -> str:
    """The trainer that runs TRL's whole file: `TRL_UPSTREAM_FULL`, else one of `methods` chosen by the commit
    (the commit hash modulo their number: every commit picks one, and successive commits spread over all)."""
    chosen = os.environ.get("TRL_UPSTREAM_FULL", "").strip()
    if chosen:
        if chosen != "all" and chosen not in METHODS:
            raise pytest.UsageError(f"TRL_UPSTREAM_FULL={chosen!r}; accepted: all, {', '.join(METHODS)}")
        return chosen
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                                timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    return methods[int(commit, 16) % len(methods)] if re.fullmatch(r"[0-9a-f]{40}", commit) else methods[0]


# ------------------------------------------------------------------------------------ the README's refusal table
class Refusal(NamedTuple):
    test: str  # TRL's test name (a pattern: `*` matches anything), parameters included
    trainers: tuple[str, ...]
    option: str  # the refusal's message names it...
    alternative: str  # ...and this
    reason: str


class NotRun(NamedTuple):
    test: str
    trainers: tuple[str, ...]
    marked: str  # `skip`, or `xfail` (strict: it must keep failing)
    reason: str


def readme_tables(text: str | None = None) -> tuple[list[Refusal], list[NotRun]]:
    """The "Expected refusals" and "Not run here" tables of README.md's section "TRL's own GRPO tests"."""
    text = README.read_text(encoding="utf-8") if text is None else text
    section = text.split("\n## TRL's own GRPO tests\n", 1)
    if len(section) != 2:
        raise ValueError("README.md has no section \"## TRL's own GRPO tests\"")
    body = re.split(r"\n## ", section[1], maxsplit=1)[0]
    refusals = [Refusal(test, trainers, option, alternative, reason)
                for test, trainers, option, alternative, reason in _table(body, "Expected refusals", 5)]
    not_run = [NotRun(test, trainers, marked, reason) for test, trainers, marked, reason in _table(body, "Not run here", 4)]
    for row in refusals:
        if not row.option or not row.alternative:
            raise ValueError(f"README.md expected refusal {row}: the option and the alternative must be given")
    for row in not_run:
        if row.marked not in ("skip", "xfail"):
            raise ValueError(f"README.md \"Not run here\" row {row}: `marked` must be skip or xfail")
    return refusals, not_run


def _table(body: str, title: str, width: int) -> list[list]:
    """The rows (cells, backticks removed; the trainers cell as a tuple) of the table after the line `title`."""
    lines = body.split(f"\n{title}", 1)
    if len(lines) != 2:
        raise ValueError(f"README.md, \"TRL's own GRPO tests\": no \"{title}\" table")
    rows = []
    for line in lines[1].splitlines()[1:]:
        line = line.strip()
        if not line.startswith("|"):
            if rows:  # the first line after the table ends it
                break
            continue
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if len(cells) != width:
            raise ValueError(f"README.md, \"{title}\": a row of {len(cells)} cells, not {width}: {line}")
        if set(cells[0]) <= set("-: ") or cells[0] == "Test":
            continue
        trainers = tuple(_code(t) for t in cells[1].split(","))
        trainers = METHODS if trainers == ("all",) else trainers
        unknown = [t for t in trainers if t not in METHODS]
        if unknown:
            raise ValueError(f"README.md, \"{title}\": unknown trainer(s) {unknown} in {line}")
        rows.append([_code(cells[0]), trainers, *(_code(cell) for cell in cells[2:])])
    if not rows:
        raise ValueError(f"README.md, \"TRL's own GRPO tests\": the \"{title}\" table has no rows")
    return rows


def _code(cell: str) -> str:
    cell = cell.strip()
    return cell[1:-1] if len(cell) >= 2 and cell[0] == cell[-1] == "`" else cell


def upstream_name(item) -> str:
    """TRL's own name of a test item, `Class::test[params]`, without our trainer's parameter id."""
    name = item.name
    method = getattr(getattr(item, "callspec", None), "params", {}).get("trl_method") or "none"
    head, bracket, params = name.partition("[")
    if bracket:
        parts = params[:-1].split("-")
        # our id is among the parameter ids (first, as pytest orders them): drop that one token
        for index in range(len(parts) - 1, -1, -1):
            if parts[index] == method:
                del parts[index]
                break
        name = head + (f"[{'-'.join(parts)}]" if parts else "")
    return f"{item.cls.__name__}::{name}" if getattr(item, "cls", None) else name


def _matches(pattern: str, name: str) -> bool:
    """`pattern` (`*`: anything; every other character literal, brackets included) matches TRL's test name, with or
    without its class."""
    regex = ".*".join(re.escape(part) for part in pattern.split("*"))
    return any(re.fullmatch(regex, candidate) for candidate in (name, name.split("::", 1)[-1]))


REFUSAL = pytest.StashKey[Refusal]()
METHOD = pytest.StashKey[str]()


# ------------------------------------------------------------------------------------------------ collection
def pytest_generate_tests(metafunc):
    if metafunc.module.__name__.rsplit(".", 1)[-1] != UPSTREAM_MODULE or "trl_method" not in metafunc.fixturenames:
        return
    if metafunc.cls is not None and metafunc.cls.__name__ in NO_TRAINER_CLASSES:
        metafunc.parametrize("trl_method", [None], ids=["none"], indirect=True)
        return
    metafunc.parametrize("trl_method", selected_methods(), indirect=True)


def pytest_collection_modifyitems(config, items):
    methods = selected_methods()
    full = full_method(methods)
    tables = None
    kept, deselected, matched = [], [], set()
    for item in items:
        if item.module.__name__.rsplit(".", 1)[-1] != UPSTREAM_MODULE:
            kept.append(item)
            continue
        method = item.callspec.params.get("trl_method") if hasattr(item, "callspec") else None
        name = upstream_name(item)
        refusals, not_run = tables = tables or readme_tables()
        if method is not None:
            for index, refusal in enumerate(refusals):
                if method in refusal.trainers and _matches(refusal.test, name):
                    item.stash[REFUSAL] = refusal
                    matched.add((index, method))
                    break
        if method is not None and full != "all" and (
                full != method and not in_core(name) or any(_matches(p, name) for p in FULL_ONLY)):
            deselected.append(item)
            continue
        kept.append(item)
        item.add_marker(pytest.mark.trl_upstream)
        for row in not_run:
            if (method is None or method in row.trainers) and _matches(row.test, name):
                marker = pytest.mark.skip if row.marked == "skip" else pytest.mark.xfail
                item.add_marker(marker(reason=row.reason) if row.marked == "skip"
                                else marker(reason=row.reason, strict=True))
                break
        hub_models = [value for value in getattr(getattr(item, "callspec", None), "params", {}).values()
                      if isinstance(value, str) and value.split("/")[0] in HUB_ORGS and value not in offline.HUB_MODELS]
        if hub_models:
            item.add_marker(pytest.mark.skip(reason=f"offline: needs the Hub model {hub_models[0]} (network)"))
        if method is not None:
            item.stash[METHOD] = method
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = kept
    if tables is not None and _whole_file_collected(config):
        _check_no_stale_refusals(tables[0], matched, methods)


def _whole_file_collected(config) -> bool:
    """No -k / -m / node id narrowed the collection (the CORE / full selection comes after the stale-row check)."""
    return not config.option.keyword and not config.option.markexpr and not any("::" in a for a in config.args)


def _check_no_stale_refusals(refusals: list[Refusal], matched: set, methods: list[str]) -> None:
    """Each README row must name a test of TRL's file for each of its selected trainers: a row TRL's file no longer
    matches (a renamed test, a changed parameter) would otherwise let the run pass without checking anything."""
    stale = []
    for index, refusal in enumerate(refusals):
        for method in refusal.trainers:
            if method in methods and (index, method) not in matched:
                stale.append(f"{refusal.test} ({method})")
    if stale:
        raise pytest.UsageError("README.md, \"TRL's own GRPO tests\": expected-refusal rows that match no test "
                                f"of TRL's file: {', '.join(stale)}")


# ----------------------------------------------------------------------------------------- the trainer swap
def _trainer_and_config(method: str):
    """(trainer class, config factory) of `method`: the factory builds the method's config with TRL's default for
    every TRL field the test leaves unset (the method's own fields keep their defaults)."""
    import torch
    from trl import GRPOConfig, GRPOTrainer

    if method == "grpo":
        trainer, config = GRPOTrainer, GRPOConfig
    else:
        from ppm_trl.registry import get_method

        trainer, config = _with_text_scorers(get_method(method).trainer_class()), get_method(method).config_class()
    trl_fields = {f.name: f for f in dataclasses.fields(GRPOConfig)}
    # TRL 1.16's GRPOConfig turns bf16 on by default, which transformers refuses without a bf16 GPU ("Your setup
    # doesn't support bf16/gpu"); TRL's tests leave it at that default. On a CPU it is off, for every trainer.
    trl_defaults = {} if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else {"bf16": False}
    for f in dataclasses.fields(config) if config is not GRPOConfig else ():
        # gradient_accumulation_steps stays unset (None): our configs then derive it as TRL's 1 where groups fit
        if f.name not in trl_fields or f.name == "gradient_accumulation_steps" or not f.init:
            continue
        ours, theirs = _default(f), _default(trl_fields[f.name])
        if ours is not dataclasses.MISSING and theirs is not dataclasses.MISSING and ours != theirs:
            trl_defaults[f.name] = theirs

    fields = {f.name for f in dataclasses.fields(config)}

    def build_config(*args, **kwargs):
        values = {**trl_defaults, **kwargs}
        if "correct_threshold" in fields:
            # PAPO: a response is correct when its reward is ≥ 1 (a 0/1 verifier), and only correct responses get a
            # process advantage. TRL's tests reward with a random tiny reward model and functions of the text, which
            # no threshold splits reliably (a group all below it has zero advantage: nothing would train). So every
            # response counts as correct: A_out is 0 and A_proc, the text scorer normalised over the group, trains.
            values.setdefault("correct_threshold", float("-inf"))
        if "arg_min_continuation_tokens" in fields:
            # ARG leaves a continuation at least 16 tokens of the budget; TRL's tests use budgets of 8-32 tokens.
            budget = values.get("max_completion_length", trl_fields["max_completion_length"].default)
            values.setdefault("arg_min_continuation_tokens", max(1, min(16, budget // 2)))
        return config(*args, **values)

    build_config.__name__ = build_config.__qualname__ = f"{config.__name__}WithTRLDefaults"
    return trainer, build_config


TRAINERS_BUILT = pytest.StashKey[list]()
_building: list | None = None  # the trainers the running test builds (set by `trl_method`)


def _with_text_scorers(trainer_class):
    """`trainer_class` with the text scorers of offline.py as its default PPM progress / PAPO process scorer (a
    scorer passed explicitly wins); it records every trainer built, for `trl_method`'s check that the method ran."""
    import inspect

    parameters = inspect.signature(trainer_class.__init__).parameters
    scorers = {name: factory for name, factory in (("progress_scorer", offline.TextProgress),
                                                   ("process_scorer", offline.TextProcess)) if name in parameters}
    bases = {klass.__name__ for klass in trainer_class.__mro__}  # a composed trainer passes them on in **kwargs
    if "progress_scorer" not in parameters and "PPMGRPOTrainer" in bases:
        scorers["progress_scorer"] = offline.TextProgress
    if "process_scorer" not in parameters and "PAPOTrainer" in bases:
        scorers["process_scorer"] = offline.TextProcess

    def __init__(self, *args, **kwargs):
        for name, factory in scorers.items():
            if kwargs.get(name) is None:
                kwargs[name] = factory()
        if _building is not None:
            _building.append(self)
        trainer_class.__init__(self, *args, **kwargs)

    namespace = {"__init__": __init__, "__module__": __name__, "__doc__": trainer_class.__doc__}
    for hook in ("compute_advantages", "_guide_failed_groups", "method_loss"):
        if hasattr(trainer_class, hook):
            namespace[hook] = _counted(hook, getattr(trainer_class, hook))
    return type(trainer_class.__name__, (trainer_class,), namespace)


def _counted(name, function):
    def counted(self, *args, **kwargs):
        self.__dict__.setdefault("_method_hook_calls", {}).setdefault(name, 0)
        self._method_hook_calls[name] += 1
        return function(self, *args, **kwargs)

    return counted


# The hooks in which each method does its work: once per training generation batch PPM's, PAPO's and VeriFree's
# advantages (`compute_advantages`) and ARG's guidance of the batch's all-failure groups (`_guide_failed_groups`);
# OPSD's loss (`method_loss`) once per micro-batch.
METHOD_HOOKS = {"ppm": ("compute_advantages",), "papo": ("compute_advantages",), "arg": ("_guide_failed_groups",),
                "ppm+arg": ("compute_advantages", "_guide_failed_groups"),
                "papo+arg": ("compute_advantages", "_guide_failed_groups"),
                "verifree": ("compute_advantages",), "opsd": ("compute_advantages", "method_loss")}


def _default(f: dataclasses.Field):
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


@pytest.fixture(scope="session")
def _offline_hub(tmp_path_factory):
    import huggingface_hub.constants

    root = offline.hub_cache(str(tmp_path_factory.mktemp("hub")))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", root)
        # offline even where huggingface_hub was imported before tests/conftest.py set HF_HUB_OFFLINE (it reads the
        # variable once, at import): nothing of these tests may reach the network
        patch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
        patch.setenv("HF_HUB_OFFLINE", "1")
        yield root


@pytest.fixture(autouse=True)
def trl_method(request, monkeypatch, tmp_path, _offline_hub):
    """The trainer under test (None: a test of TRL's file that builds no trainer)."""
    method = getattr(request, "param", None)
    monkeypatch.chdir(tmp_path)  # a trainer built without args writes to `<model>-<METHOD>` under the cwd
    if method is None:
        yield None
        return
    global _building
    trainer, config = _trainer_and_config(method)
    monkeypatch.setattr(request.module, "GRPOTrainer", trainer)
    monkeypatch.setattr(request.module, "GRPOConfig", config)
    _building = built = []
    try:
        yield method
    finally:
        _building = None
    report = request.node.stash.get(CALL_REPORT, None)
    if report is None or not report.passed or REFUSAL in request.node.stash:
        return
    for instance in built:  # a trainer that trained ran its method's hooks
        steps = getattr(getattr(instance, "state", None), "global_step", 0)
        calls = instance.__dict__.get("_method_hook_calls", {})
        for hook in METHOD_HOOKS.get(method, ()) if steps else ():
            assert calls.get(hook), (f"{type(instance).__name__} trained {steps} step(s) without calling its "
                                     f"method's `{hook}`: the method did not run")


CALL_REPORT = pytest.StashKey[pytest.TestReport]()


# trainer → outcome → count, for the summary at the end of the run
OUTCOMES: dict[str, dict[str, int]] = {}


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.when == "call":
        item.stash[CALL_REPORT] = report
    if UPSTREAM_MODULE in item.nodeid and (report.when == "call" or report.skipped or report.failed):
        method = item.stash.get(METHOD, None) or "none (no trainer)"
        if hasattr(report, "wasxfail"):
            outcome = "xfailed" if report.skipped else "xpassed (strict: failed)"
        elif report.passed:
            outcome = "refused as listed" if REFUSAL in item.stash else "passed"
        else:
            outcome = report.outcome if report.when == "call" or report.skipped else f"error in {report.when}"
        counts = OUTCOMES.setdefault(method, {})
        counts[outcome] = counts.get(outcome, 0) + 1
    return report


def pytest_collection_finish(session):
    if any(UPSTREAM_MODULE in item.nodeid for item in session.items):
        methods = selected_methods()
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(f"TRL's GRPO tests: trainers {', '.join(methods)}; the whole file for "
                                f"{full_method(methods)}, the CORE tests for the others")


def pytest_terminal_summary(terminalreporter):
    if OUTCOMES:
        terminalreporter.write_sep("-", "TRL's GRPO tests by trainer")
        for method, counts in OUTCOMES.items():
            terminalreporter.write_line(f"{method}: " + ", ".join(f"{n} {what}" for what, n in sorted(counts.items())))


# --------------------------------------------------------------------------------------- expected refusals
@pytest.hookimpl(wrapper=True)
def pytest_pyfunc_call(pyfuncitem):
    refusal = pyfuncitem.stash.get(REFUSAL, None)
    if refusal is None:
        return (yield)
    method = pyfuncitem.stash.get(METHOD, None)
    try:
        yield
    except Exception as error:  # noqa: BLE001 - any error is checked against the README row
        judge_refusal(refusal, method, error)
        return True
    judge_refusal(refusal, method, None)


def judge_refusal(refusal: Refusal, method: str, error: BaseException | None) -> None:
    """A listed refusal's outcome: `error` (None: the test passed) must name the row's option and alternative."""
    if error is None:
        pytest.fail(f"README.md lists {refusal.test} as refused by {method} ({refusal.reason}), but it passed: the "
                    "refusal is gone, remove its row from the expected-refusal table", pytrace=False)
    message = str(error)
    missing = [what for what in (refusal.option, refusal.alternative) if what not in message]
    if missing:
        raise AssertionError(
            f"README.md lists {refusal.test} as refused by {method} with a message naming {refusal.option!r} and "
            f"{refusal.alternative!r}; the error does not name {missing}: {type(error).__name__}: {message}"
        ) from error
