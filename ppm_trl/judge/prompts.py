"""Judge prompt templates (PPM paper App. D; PAPO paper A.3) and the functions that fill them.

The template text lives in `prompts/*.txt`, copied from the papers (the PDF extraction's lost spaces restored).
Slots are `{problem}`, `{solution}`, `{rubric}`, `{student_solution}` and `{tagged_chunk}`. They are filled in
one pass, so a slot value that happens to contain "{rubric}" is never expanded again, and LaTeX braces in the
templates need no escaping. Untrusted text (rollouts, student solutions) is neutralised by `escaping` before it
goes into a slot, and so is dataset text (problems, reference solutions, rubric points: `escape_dataset_text`),
so that a poisoned dataset row cannot close a tag or plant prompt structure either.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import cache
from importlib import resources

from ppm_trl.judge.escaping import escape_dataset_text, escape_papo_solution, escape_process_chunk, escape_rollout

SLOTS = ("problem", "solution", "rubric", "student_solution", "tagged_chunk")
_SLOT_PATTERN = re.compile(r"\{(" + "|".join(SLOTS) + r")\}")

# name -> (system template or None, user template)
TEMPLATES = {
    "rubric_generation": ("rubric_generation_system.txt", "rubric_generation_user.txt"),
    "obsoletion_graph": ("obsoletion_graph_system.txt", "obsoletion_graph_user.txt"),
    "ppm_grading": ("ppm_grading_system.txt", "ppm_grading_user.txt"),
    "standard_rubric": ("standard_rubric_system.txt", "standard_rubric_user.txt"),
    "process_reward": ("process_reward_system.txt", "process_reward_user.txt"),
    "papo_three_tier": (None, "papo_three_tier.txt"),
    "papo_five_tier": (None, "papo_five_tier.txt"),
}

# PAPO A.3: the score set each rubric allows.
PAPO_TIERS = {
    "three_tier": ("papo_three_tier", (0.0, 0.5, 1.0)),
    "five_tier": ("papo_five_tier", (0.0, 0.25, 0.5, 0.75, 1.0)),
}


@cache
def load_template(filename: str) -> str:
    return resources.files("ppm_trl.judge").joinpath("prompts", filename).read_text(encoding="utf-8").strip()


def fill_template(template: str, **slots: str) -> str:
    """Replace `{name}` slots in one pass; every slot in the template must be given, and only those."""
    present = set(_SLOT_PATTERN.findall(template))
    missing, extra = present - set(slots), set(slots) - present
    if missing or extra:
        raise ValueError(f"template slots {sorted(present)} do not match the values given {sorted(slots)}")
    return _SLOT_PATTERN.sub(lambda m: slots[m.group(1)], template)


def build_messages(name: str, **slots: str) -> list[dict[str, str]]:
    """Chat messages for template `name` (a key of TEMPLATES), the system prompt first when the paper has one."""
    if name not in TEMPLATES:
        raise ValueError(f"unknown prompt {name!r}; accepted: {sorted(TEMPLATES)}")
    system_file, user_file = TEMPLATES[name]
    messages = [] if system_file is None else [{"role": "system", "content": load_template(system_file)}]
    messages.append({"role": "user", "content": fill_template(load_template(user_file), **slots)})
    return messages


def format_rubric(points: Sequence[str]) -> str:
    """'1. first point\\n2. second point' — the numbered list the App. D prompts expect (each point on one line,
    escaped as dataset text)."""
    return "\n".join(f"{i}. {rubric_point(point)}" for i, point in enumerate(points, start=1))


def rubric_point(point: str) -> str:
    """A rubric point as the prompts show it: on one line, escaped as dataset text."""
    return escape_dataset_text(" ".join(str(point).split()))


def ppm_grading_messages(problem: str, points: Sequence[str], prefix: str) -> list[dict[str, str]]:
    """PPM prefix grading (App. D): which rubric points the partial rollout reaches."""
    return build_messages(
        "ppm_grading", problem=escape_dataset_text(problem), rubric=format_rubric(points),
        student_solution=escape_rollout(prefix),
    )


def standard_rubric_messages(problem: str, points: Sequence[str], prefix: str) -> list[dict[str, str]]:
    """The 'standard rubric prompt' the paper compares against in §5.3 (plain numbered YES/NO list)."""
    return build_messages(
        "standard_rubric", problem=escape_dataset_text(problem), rubric=format_rubric(points),
        student_solution=escape_rollout(prefix),
    )


def papo_rubric_messages(problem: str, reference: str, response: str, tier: str = "three_tier") -> list[dict[str, str]]:
    """PAPO A.3 rubric prompt (3-tier default, 5-tier ablation); the score comes back in the last \\boxed{}."""
    if tier not in PAPO_TIERS:
        raise ValueError(f"unknown rubric tier {tier!r}; accepted: {sorted(PAPO_TIERS)}")
    return build_messages(
        PAPO_TIERS[tier][0], problem=escape_dataset_text(problem, "papo"), solution=escape_dataset_text(reference, "papo"),
        student_solution=escape_papo_solution(response),
    )


def process_reward_messages(problem: str, parts: Sequence[str]) -> list[dict[str, str]]:
    """Process-reward baseline (App. B.1 / D): the chunk's parts tagged <part_i>…</part_i>."""
    if not parts:
        raise ValueError("process reward needs at least one part to review")
    tagged = "\n\n".join(f"<part_{i}>\n{escape_process_chunk(part)}\n</part_{i}>" for i, part in enumerate(parts, start=1))
    return build_messages("process_reward", problem=escape_dataset_text(problem, "process"), tagged_chunk=tagged)


def rubric_generation_messages(problem: str, reference: str) -> list[dict[str, str]]:
    """App. D rubric (reasoning points) generation from a reference solution."""
    return build_messages("rubric_generation", problem=escape_dataset_text(problem, "process"),
                          solution=escape_dataset_text(reference, "process"))


def obsoletion_graph_messages(problem: str, points: Sequence[str]) -> list[dict[str, str]]:
    """App. D obsoletion graph generation; the rubric is wrapped in <rubric> tags as in the paper's example."""
    return build_messages("obsoletion_graph", problem=escape_dataset_text(problem, "process"),
                          rubric=f"<rubric>\n{format_rubric(points)}\n</rubric>")
