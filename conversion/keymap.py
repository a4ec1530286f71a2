"""Declarative checkpoint key maps and the planner that accounts for every tensor.

A key map is a list of rules from stock names to fivefold names. A pattern names a module or a tensor; `{}`
stands for a layer (or expert) index; a module pattern carries the rest of the key (`.weight`, `.bias`) over.
A rule whose target is None drops the tensor on purpose. Rules may turn n stock tensors into m of ours through a
named transform with an inverse, so the same map also exports back to the stock layout.
"""

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import torch

from .errors import ConversionError

Shape = tuple[int, ...]


@dataclass(frozen=True)
class Transform:
    """How n source tensors become m target tensors, and back."""

    name: str
    apply: Callable[[list[torch.Tensor]], list[torch.Tensor]]
    shapes: Callable[[list[Shape]], list[Shape]]
    inverse_name: str
    dtype: torch.dtype | None = None  # what its outputs are, whatever the sources' (a dequantization); None: theirs


def _split_shapes(parts: int, dim: int) -> Callable[[list[Shape]], list[Shape]]:
    def shapes(src: list[Shape]) -> list[Shape]:
        (s,) = src
        if s[dim] % parts:
            raise ConversionError(f"cannot split a tensor of shape {s} into {parts} equal parts along dim {dim}")
        return [(*s[:dim], s[dim] // parts, *s[dim + 1 :])] * parts

    return shapes


def _concat_shapes(dim: int) -> Callable[[list[Shape]], list[Shape]]:
    def shapes(src: list[Shape]) -> list[Shape]:
        return [(*src[0][:dim], sum(s[dim] for s in src), *src[0][dim + 1 :])]

    return shapes


def _transpose_shapes(src: list[Shape]) -> list[Shape]:
    return [tuple(reversed(s)) if len(s) == 2 else s for s in src]


TRANSFORMS: dict[str, Transform] = {
    "identity": Transform("identity", lambda t: list(t), lambda s: list(s), "identity"),
    # GPT-2's Conv1D stores (in, out); a Linear stores (out, in). Vectors (biases) pass unchanged.
    "transpose": Transform(
        "transpose", lambda t: [x.t() if x.dim() == 2 else x for x in t], _transpose_shapes, "transpose"
    ),
}
for _n in (2, 3):
    TRANSFORMS[f"split{_n}"] = Transform(
        f"split{_n}", lambda t, n=_n: list(t[0].chunk(n, dim=0)), _split_shapes(_n, 0), f"concat{_n}"
    )
    TRANSFORMS[f"concat{_n}"] = Transform(
        f"concat{_n}", lambda t: [torch.cat(list(t), dim=0)], _concat_shapes(0), f"split{_n}"
    )


def _then(first: Transform, second: Transform, inverse_name: str) -> Transform:
    """`first`, then `second` on its results."""
    return Transform(
        f"{first.name}_{second.name}",
        lambda t: second.apply(first.apply(t)),
        lambda s: second.shapes(first.shapes(s)),
        inverse_name,
    )


# GPT-2's fused Conv1D c_attn [C, 3C] -> q, k, v Linears [C, C] each (and its bias [3C] -> 3 x [C]), and back.
TRANSFORMS["transpose_split3"] = _then(TRANSFORMS["transpose"], TRANSFORMS["split3"], "concat3_transpose")
TRANSFORMS["concat3_transpose"] = _then(TRANSFORMS["concat3"], TRANSFORMS["transpose"], "transpose_split3")


@dataclass(frozen=True)
class Rule:
    source: tuple[str, ...]
    target: tuple[str, ...] | None  # None: dropped on purpose
    transform: str = "identity"
    # Read only: a second stock layout of tensors another rule already writes back (stock's fused experts).
    import_only: bool = False
    # Read only where the checkpoint lacks the other stock name of the same tensor, which stock's model reads
    # when both are there (BERT's `cls.predictions.bias` beside `cls.predictions.decoder.bias`); else dropped.
    fallback: bool = False

    def inverse(self) -> "Rule":
        if self.target is None:
            raise ValueError("a dropping rule has no inverse")
        return Rule(self.target, self.source, TRANSFORMS[self.transform].inverse_name)


def renames(mapping: Mapping[str, str | None]) -> list[Rule]:
    """{stock pattern: our pattern or None} as one-to-one rules."""
    return [Rule((src,), None if dst is None else (dst,)) for src, dst in mapping.items()]


def _pattern_regex(pattern: str) -> re.Pattern:
    # A pattern matches a whole key, or a key's leading modules followed by ".rest".
    body = re.escape(pattern).replace(r"\{\}", r"(\d+)")
    return re.compile(rf"^{body}(\..+)?$")


def _fill(pattern: str, indices: tuple[str, ...]) -> str:
    return pattern.format(*indices)


@dataclass(frozen=True)
class Step:
    """One unit of conversion work: these source tensors become those target tensors."""

    sources: tuple[str, ...]
    targets: tuple[str, ...]
    transform: str = "identity"


@dataclass
class Plan:
    steps: list[Step] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    # (source, kept source): a second stock name for a tensor another rule already converts, neither a fallback;
    # the two must hold the same values.
    aliases: list[tuple[str, str]] = field(default_factory=list)
    # The other stock name of a tensor a fallback rule would have read, where the checkpoint holds the preferred one.
    unread: list[str] = field(default_factory=list)

    def target_shapes(self, source_shapes: Mapping[str, Shape]) -> dict[str, Shape]:
        out: dict[str, Shape] = {}
        for step in self.steps:
            shapes = TRANSFORMS[step.transform].shapes([tuple(source_shapes[s]) for s in step.sources])
            out.update(zip(step.targets, shapes, strict=True))
        return out

    def target_dtypes(self, source_dtype: Callable[[str], torch.dtype]) -> dict[str, torch.dtype]:
        """Each target's dtype: its transform's, or its first source's."""
        return {
            t: TRANSFORMS[step.transform].dtype or source_dtype(step.sources[0])
            for step in self.steps
            for t in step.targets
        }

    def run(self, step: Step, get: Callable[[str], torch.Tensor]) -> dict[str, torch.Tensor]:
        tensors = TRANSFORMS[step.transform].apply([get(s) for s in step.sources])
        return dict(zip(step.targets, tensors, strict=True))


class KeyMap:
    """Rules between stock names and ours, each side relative to its prefix (`bert.` / `model.`) for the
    base-model part, absolute for the heads."""

    def __init__(self, base: Iterable[Rule], heads: Iterable[Rule] = (), legacy: Callable[[str], str] | None = None):
        self.base = list(base)
        self.heads = list(heads)
        self.legacy = legacy or (lambda key: key)

    def plan(
        self,
        keys: Iterable[str],
        stock_prefix: str,
        our_prefix: str,
        inverse: bool = False,
    ) -> Plan:
        """Plans stock -> ours (or ours -> stock with inverse=True). `*_prefix` is "" for a bare base model.

        Raises ConversionError naming every key no rule accounts for and every incomplete group.
        """
        src_prefix, dst_prefix = (our_prefix, stock_prefix) if inverse else (stock_prefix, our_prefix)
        tables = [(self.base, True), (self.heads, False)]
        compiled = []
        for rules, is_base in tables:
            for rule in rules:
                if inverse and (rule.target is None or rule.import_only):
                    continue
                rule = rule.inverse() if inverse else rule
                compiled.append((rule, is_base, [_pattern_regex(p) for p in rule.source]))

        groups: dict[tuple, dict[int, str]] = {}
        plan, unknown = Plan(), []
        for original in keys:
            key = original if inverse else self.legacy(original)
            match = self._match(key, src_prefix, compiled)
            if match is None:
                unknown.append(original)
                continue
            rule, is_base, slot, indices, suffix = match
            if rule.target is None:
                plan.dropped.append(original)
                continue
            group = groups.setdefault((rule, is_base, indices, suffix), {})
            if slot in group:
                raise ConversionError(f"tensors {group[slot]!r} and {original!r} map to the same place")
            group[slot] = original

        if unknown:
            raise ConversionError(
                f"{len(unknown)} tensor(s) in the checkpoint match no conversion rule: {', '.join(sorted(unknown)[:8])}"
            )
        produced: dict[tuple[str, ...], tuple[Rule, Step]] = {}
        for (rule, is_base, indices, suffix), members in groups.items():
            if len(members) != len(rule.source):
                absent = [_fill(p, indices) + suffix for i, p in enumerate(rule.source) if i not in members]
                raise ConversionError(f"incomplete tensor group: missing {', '.join(absent)}")
            prefix = dst_prefix if is_base else ""
            targets = tuple(_join(prefix, _fill(p, indices) + suffix) for p in rule.target)
            sources = tuple(members[i] for i in range(len(rule.source)))
            step = Step(sources, targets, rule.transform)
            if targets in produced:
                first_rule, first = produced[targets]
                if not (rule.fallback or first_rule.fallback):
                    plan.aliases.extend(zip(sources, first.sources, strict=True))
                    continue
                if rule.fallback:  # the other stock name is there, and stock's model reads that one
                    plan.unread.extend(sources)
                    continue
                plan.unread.extend(first.sources)
                plan.steps.remove(first)
            produced[targets] = (rule, step)
            plan.steps.append(step)
        clash = _first_duplicate(t for step in plan.steps for t in step.targets)
        if clash is not None:
            raise ConversionError(f"two rules produce the same tensor {clash!r}")
        return plan

    @staticmethod
    def _match(key: str, src_prefix: str, compiled):
        best = None
        for rule, is_base, regexes in compiled:
            if is_base:
                if src_prefix and not key.startswith(src_prefix + "."):
                    # Legacy files hold base-model tensors without the prefix; accept both.
                    candidate = key
                else:
                    candidate = key[len(src_prefix) + 1 :] if src_prefix else key
            else:
                candidate = key
            for slot, regex in enumerate(regexes):
                m = regex.match(candidate)
                if m is None:
                    continue
                *indices, suffix = m.groups()
                specificity = len(rule.source[slot]) + (1000 if suffix is None else 0)
                if best is None or specificity > best[0]:
                    best = (specificity, (rule, is_base, slot, tuple(indices), suffix or ""))
        return None if best is None else best[1]


def _first_duplicate(items: Iterable[str]) -> str | None:
    seen: set[str] = set()
    for item in items:
        if item in seen:
            return item
        seen.add(item)
    return None


def _join(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


_LEGACY_NORM = re.compile(r"(LayerNorm|layer_norm|norm)\.(gamma|beta)$")


def legacy_norm_names(key: str) -> str:
    """Old TF-converted checkpoints name LayerNorm parameters gamma/beta."""
    return _LEGACY_NORM.sub(lambda m: f"{m[1]}.{'weight' if m[2] == 'gamma' else 'bias'}", key)
