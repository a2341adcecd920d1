"""Reasoning points and the obsoletion graph of Progressive Point Matching (PPM paper §4, App. C, App. D).

A problem's reference solution is distilled into `n` reasoning points (1-based; point `n` is the goal, the final
answer). The state of a completion prefix is the set of points it has reached. Shortcutting (§4): "a point is
considered reached if all points that depend on this point have already been reached. In particular, reaching the
goal makes all reasoning points reached." The dependencies are given as obsoletion rules (App. D prompt)::

    <makes_obsolete_graph>
    <rule if_all="4" makes_obsolete="2,3"/>
    </makes_obsolete_graph>

meaning: once items 4 (and every other `if_all` item) are reached, items 2 and 3 count as reached. Rules are applied
to a fixed point, so chains propagate (App. C GSM-Infinite: rules 2→1, 3→2, 4→3; reaching only item 3 gives 3/4).

phi(prefix) = |closure(reached)| (eq. 1); `progress` returns phi / n so that it lies in [0, 1].
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import torch

Rule = tuple[tuple[int, ...], tuple[int, ...]]

_WRAPPER_RE = re.compile(r"<\s*makes_obsolete_graph\s*>(.*?)<\s*/\s*makes_obsolete_graph\s*>", re.DOTALL)
_WRAPPER_OPEN_RE = re.compile(r"<\s*makes_obsolete_graph\s*>")
_RULE_RE = re.compile(r"<\s*rule\b([^<>]*)>")  # greedy, '/' stripped after: a lazy group backtracks quadratically
_RULE_START_RE = re.compile(r"<\s*rule\b")
_ATTR_RE = re.compile(r"([A-Za-z_][\w-]*)\s*=\s*(?:\"([^\"]*)\"|'([^']*)'|([^\s\"'/>]+))")


def _item_list(value, what: str) -> tuple[int, ...]:
    """Normalise one side of a rule (ints, a comma string "2,3", or a single int) to a sorted tuple of ints."""
    if isinstance(value, str):
        parts = [p.strip() for p in value.split(",")]
        if any(not re.fullmatch(r"[+-]?\d+", p) for p in parts):
            raise ValueError(f"{what}: {value!r} is not a comma-separated list of item numbers (e.g. \"2,3\")")
        items = [int(p) for p in parts]
    elif isinstance(value, numbers.Integral) and not isinstance(value, bool):
        items = [int(value)]
    elif isinstance(value, Iterable) and not isinstance(value, Mapping):
        items = []
        for v in value:
            if isinstance(v, bool) or not isinstance(v, numbers.Integral):
                raise ValueError(f"{what}: item {v!r} is not an integer item number")
            items.append(int(v))
    else:
        raise ValueError(f"{what}: expected a list of integer item numbers, got {type(value).__name__} {value!r}")
    return tuple(sorted(set(items)))


@dataclass(frozen=True)
class ReasoningGraph:
    """`num_points` reasoning points plus obsoletion rules `(if_all, makes_obsolete)` with 1-based item numbers."""

    num_points: int
    rules: tuple[Rule, ...] = ()
    # Closure cache keyed by the reached bitmask; cheap, and groups of 16 completions share many states.
    _cache: dict = field(default_factory=dict, init=False, repr=False, compare=False, hash=False)

    def __post_init__(self):
        if isinstance(self.num_points, bool) or not isinstance(self.num_points, numbers.Integral):
            raise ValueError(f"num_points must be an integer >= 1, got {self.num_points!r}")
        if self.num_points < 1:
            raise ValueError(f"num_points must be >= 1, got {self.num_points}")
        object.__setattr__(self, "num_points", int(self.num_points))
        if self.rules is None or isinstance(self.rules, (str, Mapping)):
            raise ValueError(f"rules must be a list of (if_all, makes_obsolete) pairs, got {self.rules!r}")
        normalised = []
        for index, rule in enumerate(self.rules):
            where = f"rule {index} {rule!r}"
            if isinstance(rule, (str, Mapping)) or not isinstance(rule, Sequence) or len(rule) != 2:
                raise ValueError(f"{where}: expected a pair (if_all, makes_obsolete); dict records go through from_records")
            if_all = _item_list(rule[0], f"{where} if_all")
            obsolete = _item_list(rule[1], f"{where} makes_obsolete")
            where = f"rule {index} (if_all={list(if_all)}, makes_obsolete={list(obsolete)})"
            if not if_all:
                raise ValueError(f"{where}: if_all is empty; a rule needs at least one premise item")
            if not obsolete:
                raise ValueError(f"{where}: makes_obsolete is empty; a rule must obsolete at least one item")
            for item in if_all + obsolete:
                if not 1 <= item <= self.num_points:
                    raise ValueError(f"{where}: item {item} is out of range; items are 1..{self.num_points}")
            own = sorted(set(if_all) & set(obsolete))
            if own:
                raise ValueError(f"{where}: obsoletes its own premise item(s) {own}")
            normalised.append((if_all, obsolete))
        object.__setattr__(self, "rules", tuple(normalised))
        masks = tuple((_mask(a), _mask(b)) for a, b in normalised)
        object.__setattr__(self, "_masks", masks)

    # ----------------------------------------------------------------------------------------------- parsing
    @classmethod
    def from_xml(cls, text: str, num_points: int) -> ReasoningGraph:
        """Parse `<rule if_all="4" makes_obsolete="2,3"/>` lines (App. D obsoletion-graph prompt).

        If the text has a `<makes_obsolete_graph>` block, only the rules inside the last complete block count (a judge
        may restate the example first); otherwise every `<rule .../>` tag in the text does. Empty text means no rules.
        """
        if not isinstance(text, str):
            raise ValueError(f"reasoning graph XML must be a string, got {type(text).__name__}")
        body = text
        blocks = _WRAPPER_RE.findall(text)
        if blocks:
            body = blocks[-1]
        elif _WRAPPER_OPEN_RE.search(text):
            raise ValueError("unparseable reasoning graph: <makes_obsolete_graph> is never closed (truncated output?)")
        tags = [tag.rstrip().removesuffix("/") for tag in _RULE_RE.findall(body)]
        if len(tags) != len(_RULE_START_RE.findall(body)):
            raise ValueError(f"unparseable reasoning graph: a <rule tag is not closed with '/>' in {body.strip()!r}")
        if not tags and body.strip() and not blocks:
            raise ValueError(
                "unparseable reasoning graph: no <rule if_all=\"...\" makes_obsolete=\"...\"/> tag and no "
                f"<makes_obsolete_graph> block in {text[:200]!r}"
            )
        rules = []
        for index, attrs_text in enumerate(tags):
            attrs = {m.group(1): next(g for g in m.groups()[1:] if g is not None)
                     for m in _ATTR_RE.finditer(attrs_text)}
            leftover = _ATTR_RE.sub("", attrs_text).strip()
            missing = [k for k in ("if_all", "makes_obsolete") if k not in attrs]
            unknown = sorted(set(attrs) - {"if_all", "makes_obsolete"})
            problem = (f"missing {missing}" if missing else f"unknown attribute(s) {unknown}" if unknown
                       else f"cannot read {leftover!r}" if leftover else "")
            if problem:
                raise ValueError(
                    f"unparseable rule {index} <rule{attrs_text}/>: expected if_all=\"i,j\" makes_obsolete=\"a,b\" "
                    f"({problem})"
                )
            rules.append((_item_list(attrs["if_all"], f"rule {index} if_all"),
                          _item_list(attrs["makes_obsolete"], f"rule {index} makes_obsolete")))
        return cls(num_points, rules)

    @classmethod
    def from_records(cls, records, num_points: int) -> ReasoningGraph:
        """Build from the dataset column form `[{"if_all": [4], "makes_obsolete": [2, 3]}, ...]`."""
        if records is None or isinstance(records, (str, Mapping)) or not isinstance(records, Iterable):
            raise ValueError(
                f"reasoning_graph must be a list of {{'if_all': [...], 'makes_obsolete': [...]}} records, got {records!r}"
            )
        rules = []
        for index, record in enumerate(records):
            if not isinstance(record, Mapping) or "if_all" not in record or "makes_obsolete" not in record:
                raise ValueError(f"rule {index} {record!r}: expected a mapping with keys 'if_all' and 'makes_obsolete'")
            rules.append((record["if_all"], record["makes_obsolete"]))
        return cls(num_points, rules)

    def to_records(self) -> list[dict[str, list[int]]]:
        return [{"if_all": list(a), "makes_obsolete": list(b)} for a, b in self.rules]

    def to_xml(self) -> str:
        lines = [f'<rule if_all="{",".join(map(str, a))}" makes_obsolete="{",".join(map(str, b))}"/>'
                 for a, b in self.rules]
        return "\n".join(["<makes_obsolete_graph>", *lines, "</makes_obsolete_graph>"])

    # ------------------------------------------------------------------------------------------------ closure
    def closure(self, reached: Iterable[int], shortcut: bool = True) -> frozenset[int]:
        """Points counted as reached. Without shortcutting, just `reached`; with it, the rules' fixed point plus the
        goal rule (point `num_points` reached ⇒ every point reached)."""
        mask = self._reached_mask(reached)
        if shortcut:
            mask = self._closure_mask(mask)
        return frozenset(i + 1 for i in range(self.num_points) if mask >> i & 1)

    def progress(self, reached: Iterable[int], shortcut: bool = True) -> float:
        """phi / n = |closure(reached)| / num_points (paper eq. 1, normalised to [0, 1])."""
        mask = self._reached_mask(reached)
        if shortcut:
            mask = self._closure_mask(mask)
        return mask.bit_count() / self.num_points

    def progress_batch(self, reached_sets: Iterable[Iterable[int] | None], shortcut: bool = True,
                       dtype: torch.dtype = torch.float32, device=None) -> torch.Tensor:
        """Progress of many reached-sets at once; `None` (unscorable, e.g. a failed judge call) becomes NaN."""
        values = [math.nan if r is None else self.progress(r, shortcut) for r in reached_sets]
        return torch.tensor(values, dtype=dtype, device=device)

    def _reached_mask(self, reached: Iterable[int]) -> int:
        if isinstance(reached, (str, bytes)) or not isinstance(reached, Iterable):
            raise ValueError(f"reached must be an iterable of 1-based item numbers, got {reached!r}")
        mask = 0
        for item in reached:
            if isinstance(item, bool) or not isinstance(item, numbers.Integral) or not 1 <= item <= self.num_points:
                raise ValueError(f"reached item {item!r} is not an item number in 1..{self.num_points}")
            mask |= 1 << (int(item) - 1)
        return mask

    def _closure_mask(self, mask: int) -> int:
        cached = self._cache.get(mask)
        if cached is not None:
            return cached
        full = (1 << self.num_points) - 1
        goal = 1 << (self.num_points - 1)
        state = mask
        while True:
            if state & goal:
                state = full
                break
            before = state
            for premise, obsolete in self._masks:
                if state & premise == premise:
                    state |= obsolete
            if state == before:
                break
        self._cache[mask] = state
        return state


def _mask(items: Iterable[int]) -> int:
    mask = 0
    for item in items:
        mask |= 1 << (item - 1)
    return mask


def progress_matrix(graphs: Sequence[ReasoningGraph], reached: Sequence[Sequence[Iterable[int] | None]],
                    shortcut: bool = True, dtype: torch.dtype = torch.float32, device=None) -> torch.Tensor:
    """(N, K) progress m_k for N completions (row i judged against `graphs[i]`) and K prefixes each.

    `reached[i][k]` is the set of points prefix c_1..c_k of completion i reached before closure, or None when it could
    not be scored (→ NaN). Rows of a group usually share one graph object, so its closure cache is reused.
    """
    if len(graphs) != len(reached):
        raise ValueError(f"progress_matrix: {len(graphs)} graphs but {len(reached)} rows of reached sets")
    widths = {len(row) for row in reached}
    if len(widths) > 1:
        raise ValueError(f"progress_matrix: every row needs the same number of prefixes K, got lengths {sorted(widths)}")
    width = widths.pop() if widths else 0
    values = [[math.nan if r is None else g.progress(r, shortcut) for r in row] for g, row in zip(graphs, reached)]
    return torch.tensor(values, dtype=dtype, device=device).reshape(len(values), width)
