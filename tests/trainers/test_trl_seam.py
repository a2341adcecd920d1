"""The contract with TRL: every private TRL member the seam (the package `ppm_trl/trainers/base/`) uses exists with
the parameters it passes, the rollout tuple has the order `Rollout` names, no other code uses TRL internals (private members or
parameters, unexported submodule names, undocumented trainer state, writes into TRL's objects: AST rules, each
shown to catch planted violations), and an unsupported TRL is refused at import."""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest
import transformers
import trl
from helpers import TINY_ARGS
from trl import GRPOConfig, GRPOTrainer

from ppm_trl.tiny import build_tiny_model_and_tokenizer
from ppm_trl.trainers import base

SEAM = Path(base.__file__).resolve().parent  # the seam is a package: every file in it may use TRL's internals
SEAM_FILES = sorted(SEAM.glob("*.py"))
PACKAGE = SEAM.parents[1]
SUPPORTED = (f"ppm_trl's base trainer supports trl{base.TRL_SUPPORTED}; installed: trl {trl.__version__}, "
             f"transformers {transformers.__version__}")
# TRL's documented class attributes for a subclass's model card (every TRL trainer sets them): not internals.
MODEL_CARD_ATTRIBUTES = {"_tag_names", "_name", "_paper"}


@pytest.fixture(scope="module")
def plain_trainer(tmp_path_factory):
    from datasets import Dataset

    model, tokenizer = build_tiny_model_and_tokenizer()
    args = GRPOConfig(output_dir=str(tmp_path_factory.mktemp("seam")), per_device_train_batch_size=2,
                      num_generations=2, max_completion_length=8, **TINY_ARGS)
    return GRPOTrainer(model=model, processing_class=tokenizer, reward_funcs=lambda completions, **kw: [0.0] * len(
        completions), args=args, train_dataset=Dataset.from_dict({"prompt": ["a", "b"]}))


PRIVATE_SIGNATURES = {**base.TRL_PRIVATE_METHODS, **base.TRL_PRIVATE_PARAMETERS}


@pytest.mark.parametrize("name", sorted(PRIVATE_SIGNATURES))
def test_private_method_signatures(name):
    """Each private TRL method, and each public one whose private parameter the base passes (`save_model`'s
    `_internal_call`), starts with the parameters the base passes."""
    member = getattr(GRPOTrainer, name, None)
    assert member is not None, f"GRPOTrainer.{name} is gone. {SUPPORTED}"
    parameters = tuple(inspect.signature(member).parameters)
    expected = PRIVATE_SIGNATURES[name]
    assert parameters[: len(expected)] == expected, (
        f"GRPOTrainer.{name}{parameters} no longer starts with {expected}. {SUPPORTED}")


def test_private_attributes_of_a_constructed_trainer(plain_trainer):
    for name in base.TRL_PRIVATE_ATTRIBUTES:
        assert hasattr(plain_trainer, name), f"a constructed GRPOTrainer has no `{name}`. {SUPPORTED}"
    assert all(hasattr(plain_trainer._logs["advantages"], m) for m in ("pop", "extend")), SUPPORTED
    assert hasattr(plain_trainer._metrics["train"], "__getitem__"), SUPPORTED
    from trl.generation.vllm_generation import VLLMGeneration

    assert "max_completion_length" in inspect.signature(VLLMGeneration).parameters, SUPPORTED
    source = inspect.getsource(VLLMGeneration)
    for name in base.VLLM_GENERATION_ATTRIBUTES:
        assert f"self.{name} = " in source, f"VLLMGeneration no longer sets `{name}`. {SUPPORTED}"


def test_rollout_tuple_order_and_logged_statistics():
    """`Rollout` names TRL's `_generate` 8-tuple by position; the statistics the base re-logs are TRL's names."""
    source = inspect.getsource(GRPOTrainer._generate)
    names = [f for f in base.Rollout.__dataclass_fields__ if f not in ("rows", "prompts")]
    assert f"return {', '.join(names)}\n" in source, f"GRPOTrainer._generate returns another tuple. {SUPPORTED}"
    for name in (*base.COMPLETION_STATISTICS, "num_tokens", "num_input_tokens_seen"):
        assert f'"{name}"' in source or name in source, f"GRPOTrainer._generate no longer logs {name}. {SUPPORTED}"


def test_log_prob_passes_run_between_generation_and_rewards():
    """`on_final_rollout` work (PPM's early judge requests) overlaps TRL's old/reference log-prob passes only because
    `_generate_and_score_completions` runs them after `_generate` and before `_calculate_rewards`."""
    source = inspect.getsource(GRPOTrainer._generate_and_score_completions)
    generate = source.find("self._generate(")
    old_logps = source.find("old_per_token_logps, _, _ = self._get_per_token_logps_and_entropies(")
    ref_logps = source.find("ref_per_token_logps, _, _ = self._get_per_token_logps_and_entropies(")
    rewards = source.find("self._calculate_rewards(")
    assert -1 not in (generate, old_logps, ref_logps, rewards), f"a step of the rollout is gone. {SUPPORTED}"
    assert generate < old_logps < ref_logps < rewards, (
        f"TRL no longer computes the log-probs between generation and rewards. {SUPPORTED}")


# ---------------------------------------------------------------------------------------------- the seam, closed
# Outside the seam (ppm_trl/trainers/base/) no project code depends on TRL / transformers internals. The rules are AST checks
# (`SeamScan`), each shown to fire on planted violations below, then run on every project file:
#   import     `from trl.<sub> import X`, `from trl import X`, `import trl.<sub>`, `trl.<sub>.…`: X must be a name
#              `trl` exports (`trl.__all__`, submodules excluded);
#   private    a TRL/Trainer private member on a trainer (`self`/`super()` in a trainer class, a `trainer` variable,
#              the trainer classes), a TRL private method overridden, or a private parameter passed (`_x=`) or
#              received (`def f(self, _x)`: overriding a signature with a private parameter);
#   state      trainer state TRL/transformers set but do not document (`self.reward_weights`): only Trainer's
#              "Important attributes", constructor arguments and `base.DOCUMENTED_TRAINER_STATE` may be read;
#   write      assigning into an object TRL owns (`self.vllm_generation.max_completion_length = …`, directly, via a
#              local alias or `setattr`), or rebinding TRL's own attribute (`self.args = …`).
PROJECT = PACKAGE.parent
# The library and what users copy; tests/ and benchmarks/ instrument TRL on purpose (they script and time it).
SCANNED = [PACKAGE, PROJECT / "examples", PROJECT / "scripts"]
TRAINER_ROOTS = {"Trainer", "GRPOTrainer", "MethodTrainer"}
# Each entry must still occur (the test fails on a stale one).
PENDING: set[tuple[str, str, str]] = set()  # (file, rule, code) allowed while a trainer moves to an accessor


def _is_name(node, names) -> bool:
    return isinstance(node, ast.Name) and node.id in ((names,) if isinstance(names, str) else names)


def _last_name(node) -> str:
    return node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")


def trainer_classes(trees) -> set[str]:
    """The classes that are trainers: deriving from one, or mixed into one (a fixpoint over all the modules)."""
    bases: dict[str, set[str]] = {}
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                bases.setdefault(node.name, set()).update(_last_name(b) for b in node.bases)
    found = set(TRAINER_ROOTS)
    while True:
        grown = found | {name for name, of in bases.items() if of & found}
        grown |= {b for name in found for b in bases.get(name, ()) if b in bases}
        if grown == found:
            return found
        found = grown


@dataclass(frozen=True)
class Seam:
    """What the rules compare against: TRL's exports, private members, state, and the documented part of it."""

    exports: frozenset
    private: frozenset
    state: frozenset
    documented: frozenset

    @property
    def undocumented(self) -> frozenset:
        return frozenset(n for n in self.state if not n.startswith("_")) - self.documented


class SeamScan(ast.NodeVisitor):
    """One module: every use of TRL that only the seam may make, as (line, rule, code)."""

    def __init__(self, seam: Seam, trainers: set[str]):
        self.seam, self.trainers = seam, trainers
        self.found: list[tuple[int, str, str]] = []
        self._in_trainer = [False]
        self._aliases: list[set[str]] = [set()]

    def report(self, node, rule: str, code: str) -> None:
        self.found.append((node.lineno, rule, code))

    def is_trainer(self, node) -> bool:
        """`self` or `super()` in a trainer class, or a variable named `trainer`."""
        if isinstance(node, ast.Name):
            return node.id == "trainer" or (node.id == "self" and self._in_trainer[-1])
        return isinstance(node, ast.Call) and _is_name(node.func, "super") and self._in_trainer[-1]

    def owned(self, node) -> bool:
        """Whether `node` is (inside) an object TRL owns: `self.X…` with X TRL's state, or a local alias of one."""
        while isinstance(node, (ast.Attribute, ast.Subscript)):
            if isinstance(node, ast.Attribute) and self.is_trainer(node.value):
                return node.attr in self.seam.state
            node = node.value
        return _is_name(node, self._aliases[-1])

    # scopes
    def visit_ClassDef(self, node):
        self._in_trainer.append(node.name in self.trainers)
        if self._in_trainer[-1]:  # a class attribute overriding a TRL private one (`_step = 0`)
            for statement in node.body:
                for target in getattr(statement, "targets", [getattr(statement, "target", None)]):
                    if _is_name(target, self.seam.private - MODEL_CARD_ATTRIBUTES):
                        self.report(target, "private", target.id)
        self.generic_visit(node)
        self._in_trainer.pop()

    def visit_FunctionDef(self, node):
        if self._in_trainer[-1] and node.name in self.seam.private:
            self.report(node, "private", f"def {node.name}")
        arguments = node.args
        for argument in (*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs, arguments.vararg,
                         arguments.kwarg):
            if argument is not None and argument.arg.startswith("_") and set(argument.arg) != {"_"}:
                self.report(argument, "private", f"parameter {argument.arg}")
        self._aliases.append(set(self._aliases[-1]))
        self.generic_visit(node)
        self._aliases.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    # imports
    def visit_ImportFrom(self, node):
        module = node.module or ""
        if node.level == 0 and (module == "trl" or module.startswith("trl.")):
            for alias in node.names:
                if alias.name not in self.seam.exports:
                    self.report(node, "import", f"from {module} import {alias.name}")
        self.generic_visit(node)

    def visit_Import(self, node):
        for alias in node.names:
            if alias.name.startswith("trl."):
                self.report(node, "import", f"import {alias.name}")
        self.generic_visit(node)

    # reads
    def visit_Attribute(self, node):
        receiver = node.value
        on_trainer = self.is_trainer(receiver) or _is_name(receiver, self.trainers)
        if on_trainer and node.attr in self.seam.private - MODEL_CARD_ATTRIBUTES:
            self.report(node, "private", ast.unparse(node))
        elif self.is_trainer(receiver) and node.attr in self.seam.undocumented:
            self.report(node, "state", ast.unparse(node))
        if _is_name(receiver, "trl") and not node.attr.startswith("__") and node.attr not in self.seam.exports:
            self.report(node, "import", ast.unparse(node))
        self.generic_visit(node)

    def visit_Call(self, node):
        for keyword in node.keywords:
            if keyword.arg is not None and keyword.arg.startswith("_"):
                self.report(node, "private", f"{keyword.arg}=")
        named = isinstance(node.args[1], ast.Constant) if len(node.args) > 1 else False
        if _is_name(node.func, ("getattr", "hasattr", "setattr", "delattr")) and named and isinstance(
                node.args[1].value, str) and self.is_trainer(node.args[0]):
            name = node.args[1].value
            if name in self.seam.private - MODEL_CARD_ATTRIBUTES:
                self.report(node, "private", f"{node.func.id}(…, {name!r})")
            elif name in self.seam.undocumented:
                self.report(node, "state", f"{node.func.id}(…, {name!r})")
        if _is_name(node.func, ("setattr", "delattr")) and node.args and self.owned(node.args[0]):
            self.report(node, "write", ast.unparse(node))
        if _last_name(node.func) == "import_module" and node.args and isinstance(node.args[0], ast.Constant) \
                and str(node.args[0].value).startswith("trl."):
            self.report(node, "import", ast.unparse(node))
        self.generic_visit(node)

    # writes
    def check_target(self, target) -> None:
        if isinstance(target, (ast.Tuple, ast.List)):
            for element in target.elts:
                self.check_target(element)
        elif isinstance(target, ast.Starred):
            self.check_target(target.value)
        elif isinstance(target, (ast.Attribute, ast.Subscript)) and self.owned(target.value):
            self.report(target, "write", ast.unparse(target))
        elif isinstance(target, ast.Attribute) and self.is_trainer(target.value) and target.attr in self.seam.state:
            self.report(target, "write", ast.unparse(target))

    def bind(self, target, value) -> None:
        if isinstance(target, ast.Name):
            (self._aliases[-1].add if value is not None and self.owned(value) else self._aliases[-1].discard)(
                target.id)

    def visit_Assign(self, node):
        for target in node.targets:
            self.check_target(target)
            self.bind(target, node.value)
        self.generic_visit(node)

    def visit_AnnAssign(self, node):
        self.check_target(node.target)
        self.bind(node.target, node.value)
        self.generic_visit(node)

    def visit_AugAssign(self, node):
        self.check_target(node.target)
        self.generic_visit(node)

    def visit_Delete(self, node):
        for target in node.targets:
            self.check_target(target)
        self.generic_visit(node)

    def visit_For(self, node):
        self.bind(node.target, node.iter)  # `for x in self.X: x.y = …` writes into TRL's objects too
        self.generic_visit(node)

    def visit_With(self, node):
        for item in node.items:
            if item.optional_vars is not None:
                self.bind(item.optional_vars, item.context_expr)
        self.generic_visit(node)


def scan(source: str, seam: Seam, trainers: set[str] | None = None) -> list[tuple[int, str, str]]:
    tree = ast.parse(source)
    visitor = SeamScan(seam, trainer_classes([tree]) if trainers is None else trainers)
    visitor.visit(tree)
    return visitor.found


def documented_state() -> set[str]:
    """Trainer's documented "Important attributes", the constructor arguments, and the base's reasoned list."""
    doc = transformers.Trainer.__doc__
    important = set(re.findall(r"- \*\*(\w+)\*\* --", doc[doc.index("Important attributes"):]))
    assert {"model", "model_wrapped", "is_in_train"} <= important, f"Trainer's docstring changed. {SUPPORTED}"
    arguments = {*inspect.signature(GRPOTrainer.__init__).parameters,
                 *inspect.signature(transformers.Trainer.__init__).parameters} - {"self"}
    return important | arguments | set(base.DOCUMENTED_TRAINER_STATE)


def trl_state(trainer) -> set[str]:
    """Every attribute TRL / transformers set on a trainer: a built one's, and every `self.X = ` of their classes
    (the attributes set only in some configurations, e.g. `vllm_generation`), less the seam's own attributes (those
    of `MethodTrainer` and of the parts it is made of)."""
    names = set(vars(trainer))
    for cls in GRPOTrainer.__mro__:
        if cls.__module__.split(".")[0] in ("trl", "transformers"):
            for node in ast.walk(ast.parse(textwrap.dedent(inspect.getsource(cls)))):
                if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and _is_name(node.value, "self"):
                    names.add(node.attr)
    own = {name for cls in base.MethodTrainer.__mro__ if cls.__module__.startswith(base.__name__) for name in vars(cls)}
    return names - own


@pytest.fixture(scope="module")
def seam(plain_trainer) -> Seam:
    private = {name for name in {*dir(GRPOTrainer), *vars(plain_trainer)} if name.startswith("_")
               and not name.startswith("__")}
    exports = {name for name in trl.__all__ if not inspect.ismodule(getattr(trl, name))}
    return Seam(frozenset(exports), frozenset(private), frozenset(trl_state(plain_trainer)),
                frozenset(documented_state()))


PLANTED = [  # (source, rule, code): each rule, several ways in
    ("from trl.trainer.utils import get_config_model_id", "import", "from trl.trainer.utils import get_config_model_id"),
    ("from trl.trainer.utils import pad as p", "import", "from trl.trainer.utils import pad"),
    ("from trl import trainer", "import", "from trl import trainer"),
    ("import trl.trainer.utils", "import", "import trl.trainer.utils"),
    ("import trl\nx = trl.trainer.utils.pad", "import", "trl.trainer"),
    ("import importlib\nimportlib.import_module('trl.trainer.utils')", "import",
     "importlib.import_module('trl.trainer.utils')"),
    ("def f(trainer):\n    trainer.save_model('out', _internal_call=True)", "private", "_internal_call="),
    ("class T(MethodTrainer):\n    def save_model(self, output_dir=None, _internal_call=False):\n        pass",
     "private", "parameter _internal_call"),
    ("class T(MethodTrainer):\n    def f(self):\n        return self._metrics", "private", "self._metrics"),
    ("class T(MethodTrainer):\n    def f(self):\n        return super()._calculate_rewards(1, 2, 3, 4)", "private",
     "super()._calculate_rewards"),
    ("class T(MethodTrainer):\n    def _generate(self, prompts):\n        pass", "private", "def _generate"),
    ("class T(MethodTrainer):\n    _step = 0", "private", "_step"),
    ("x = GRPOTrainer._generate_single_turn", "private", "GRPOTrainer._generate_single_turn"),
    ("class T(MethodTrainer):\n    def f(self):\n        return getattr(self, '_logs')", "private",
     "getattr(…, '_logs')"),
    ("class T(MethodTrainer):\n    def f(self):\n        return self.reward_weights", "state", "self.reward_weights"),
    ("class T(MethodTrainer):\n    def f(self):\n        return self.eos_token_ids[0]", "state", "self.eos_token_ids"),
    ("class T(MethodTrainer):\n    def f(self):\n        return self.mask_truncated_completions", "state",
     "self.mask_truncated_completions"),
    ("class T(MethodTrainer):\n    def f(self):\n        return self.temperature", "state", "self.temperature"),
    ("class Mixin:\n    def f(self):\n        return self.use_vllm\nclass T(Mixin, MethodTrainer):\n    pass", "state",
     "self.use_vllm"),
    ("class A(MethodTrainer):\n    pass\nclass B(A):\n    def f(self):\n        return super().reward_weights",
     "state", "super().reward_weights"),
    ("def f(trainer):\n    return trainer.vllm_mode", "state", "trainer.vllm_mode"),
    ("class T(MethodTrainer):\n    def f(self):\n        return getattr(self, 'beta')", "state", "getattr(…, 'beta')"),
    ("class T(MethodTrainer):\n    def f(self):\n        self.vllm_generation.max_completion_length = 4", "write",
     "self.vllm_generation.max_completion_length"),
    ("class T(MethodTrainer):\n    def f(self):\n        generation = self.vllm_generation\n"
     "        generation.max_completion_length = 4", "write", "generation.max_completion_length"),
    ("class T(MethodTrainer):\n    def f(self):\n        args = self.args\n        args.temperature += 1", "write",
     "args.temperature"),
    ("class T(MethodTrainer):\n    def f(self):\n        self.args.max_completion_length = 4", "write",
     "self.args.max_completion_length"),
    ("class T(MethodTrainer):\n    def f(self):\n        self.state.log_history[0] = {}", "write",
     "self.state.log_history[0]"),
    ("class T(MethodTrainer):\n    def f(self):\n        setattr(self.args, 'seed', 1)", "write",
     "setattr(self.args, 'seed', 1)"),
    ("class T(MethodTrainer):\n    def f(self):\n        self.args = None", "write", "self.args"),
    ("def f(trainer):\n    for callback in trainer.callback_handler.callbacks:\n        callback.x = 1", "write",
     "callback.x"),
]

CLEAN = [  # the same shapes, allowed
    "from trl import GRPOConfig, GRPOTrainer",
    "from trl.trainer.grpo_trainer import GRPOTrainer",  # exported by trl: a spelling, not an internal
    "import trl\nv = trl.__version__",
    "class T(MethodTrainer):\n    _tag_names = ['x']\n    _name = 'X'\n    def f(self):\n"
    "        return self.args.max_completion_length, self.num_generations, self.accelerator, self.state.global_step,"
    " self.model, self.processing_class, self.outcome_reward_weights, self.eos_ids, self._own",
    "class T(MethodTrainer):\n    def f(self):\n        self._own = 1\n        self.scorer = self.args\n"
    "        total = self.state.global_step\n        total += 1\n        args = self.args\n        args = {}\n"
    "        args['x'] = 1",
    "class Judge:\n    def f(self):\n        self.reward_weights = self.temperature\n        self._metrics = {}\n"
    "        return self._logs",  # not a trainer: its own attributes
    "def f(trainer):\n    trainer.add_callback(None)\n    return trainer.state.log_history, trainer.callback_handler",
    "def f(scorer):\n    scorer._private = 1\n    return scorer.reward_weights",
    "def f(x, y=1, *rest, **options):\n    return x",
    "def on_step_end(self, *_, **__):\n    return None",
]


@pytest.mark.parametrize("source,rule,code", PLANTED, ids=[code for *_, code in PLANTED])
def test_each_seam_rule_catches_a_planted_violation(seam, source, rule, code):
    assert (rule, code) in [(r, c) for _, r, c in scan(source, seam)], (source, scan(source, seam))


@pytest.mark.parametrize("source", CLEAN)
def test_seam_rules_allow_documented_use(seam, source):
    assert scan(source, seam) == []


def test_project_code_uses_trl_only_through_the_base(seam):
    """No module outside the seam's package (nor examples/, scripts/) breaks a rule above."""
    files = [path for folder in SCANNED if folder.is_dir() for path in sorted(folder.rglob("*.py"))
             if path.resolve().parent != SEAM]
    trees = {path: ast.parse(path.read_text(), str(path)) for path in files}
    seam_trees = [ast.parse(path.read_text()) for path in SEAM_FILES]
    trainers = trainer_classes([*trees.values(), *seam_trees])  # the seam's parts (mixins) count too
    assert {"PPMGRPOTrainer", "PAPOTrainer", "ARGTrainer", "PPMARGTrainer"} <= trainers
    offenders, pending_seen = [], set()
    for path, tree in trees.items():
        visitor = SeamScan(seam, trainers)
        visitor.visit(tree)
        name = str(path.relative_to(PROJECT))
        for line, rule, code in visitor.found:
            if (name, rule, code) in PENDING:
                pending_seen.add((name, rule, code))
            else:
                offenders.append(f"{name}:{line}: [{rule}] {code}")
    assert not offenders, ("TRL internals used outside ppm_trl/trainers/base/ (add a MethodTrainer accessor and use "
                           "it):\n" + "\n".join(offenders))
    assert not PENDING - pending_seen, f"stale PENDING entries (remove them): {sorted(PENDING - pending_seen)}"


def test_the_documented_state_is_trl_state_and_the_base_covers_it(seam, plain_trainer):
    """Each reasoned entry is real TRL state; `num_generations` mirrors the config; the accessors return TRL's."""
    assert set(base.DOCUMENTED_TRAINER_STATE) <= seam.state, SUPPORTED
    assert plain_trainer.num_generations == plain_trainer.args.num_generations, SUPPORTED
    assert {"reward_weights", "eos_token_ids", "mask_truncated_completions", "vllm_generation"} <= seam.undocumented
    for accessor, name in (("outcome_reward_weights", "reward_weights"), ("eos_ids", "eos_token_ids"),
                           ("masks_truncated_completions", "mask_truncated_completions")):
        assert isinstance(getattr(base.MethodTrainer, accessor), property)
        assert hasattr(plain_trainer, name), f"a constructed GRPOTrainer has no `{name}`. {SUPPORTED}"


def test_the_base_imports_from_trl_submodules_only_what_it_declares():
    """The seam's own imports of names `trl` does not export are `TRL_SUBMODULE_IMPORTS`, and each still exists."""
    imported = {}
    for path in SEAM_FILES:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("trl."):
                imported.setdefault(node.module, set()).update(alias.name for alias in node.names)
    declared = {module: set(names) for module, names in base.TRL_SUBMODULE_IMPORTS.items()}
    assert imported == declared
    for module, names in declared.items():
        for name in names:
            assert hasattr(importlib.import_module(module), name), f"{module}.{name} is gone. {SUPPORTED}"

def test_unsupported_trl_is_refused_at_import():
    code = "import trl; trl.__version__ = '1.17.0'; import ppm_trl.trainers.base"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode != 0
    assert "ImportError: ppm_trl's trainers support trl<1.17,>=1.16 but trl 1.17.0 is installed" in result.stderr
