"""Parameter groups: which parameters (and training flags) an operation applies to.

A group matches a value by its `ParamId` and by its path in the module tree (burnpack names:
`conv1.norm.gamma`, `layers.0.weight`). `fuse` returns a new group; `exclude` changes the group
in place (as Burn's does) and returns it.
"""
from __future__ import annotations

import regex as _regex  # a backtracking engine whose matches take a timeout (user patterns come from project files)

from .param import ParamId

# The longest one regex match against one path may take: a pattern such as `^(.*.*)*X$` is
# exponential in the path's length on a plain backtracking engine. A match past this raises
# `ParamGroupError` naming the pattern and the path instead of hanging the caller.
MATCH_TIMEOUT_S = 0.25

__all__ = ["ParamGroup", "ParamGroupError"]


class ParamGroupError(ValueError):
    """A group was built from an invalid pattern or id, or matched without a needed path."""


class _All:
    __slots__ = ()

    def matches(self, pid, path) -> bool:
        return True

    def __repr__(self) -> str:
        return "All"


class _Ids:
    __slots__ = ("ids",)

    def __init__(self, ids):
        self.ids = frozenset(ids)

    def matches(self, pid, path) -> bool:
        return pid in self.ids

    def __repr__(self) -> str:
        return f"Ids({sorted(str(i) for i in self.ids)})"


class _Paths:
    """A path matcher: exact paths (any), substrings (all), or regexes (all)."""

    __slots__ = ("mode", "items", "_compiled")

    def __init__(self, mode: str, items):
        self.mode = mode
        self.items = tuple(items)
        self._compiled = tuple(_regex.compile(p) for p in self.items) if mode == "regex" else ()

    def matches(self, pid, path) -> bool:
        if path is None:
            raise ParamGroupError(f"this group matches by path ({self!r}) but no path was given")
        if self.mode == "exact":
            return path in self.items
        if self.mode == "include":
            return all(s in path for s in self.items)
        for r in self._compiled:
            try:
                if r.search(path, timeout=MATCH_TIMEOUT_S) is None:
                    return False
            except TimeoutError:
                raise ParamGroupError(f"regex {r.pattern!r} took longer than {MATCH_TIMEOUT_S:g} s to match the path "
                                      f"{path!r}: expected a pattern without nested repetition such as (.*.*)*")
        return True

    def __repr__(self) -> str:
        return f"{self.mode.capitalize()}({list(self.items)})"


class _Any:
    __slots__ = ("parts",)

    def __init__(self, parts):
        self.parts = tuple(parts)

    def matches(self, pid, path) -> bool:
        return any(m.matches(pid, path) for m in self.parts)

    def __repr__(self) -> str:
        return " | ".join(repr(p) for p in self.parts)


def _fuse(a, b):
    if isinstance(a, _All) or isinstance(b, _All):
        return _All()
    parts = (a.parts if isinstance(a, _Any) else (a,)) + (b.parts if isinstance(b, _Any) else (b,))
    return _Any(parts)


def _compile_all(patterns) -> list[str]:
    out = []
    for p in patterns:
        if not isinstance(p, str):
            raise ParamGroupError(f"expected a regex pattern string, got {type(p).__name__}")
        try:
            _regex.compile(p)
        except (_regex.error, RecursionError, OverflowError, ValueError) as e:
            raise ParamGroupError(f"invalid regex pattern {p!r}: {e}") from None
        out.append(p)
    return out


class ParamGroup:
    """A set of parameters selected by id and/or path; see the constructors."""

    __slots__ = ("_matcher", "_excludes")

    def __init__(self, matcher=None, excludes=None):
        self._matcher = _All() if matcher is None else matcher
        self._excludes = excludes

    # ---------------------------------------------------------------- constructors
    @staticmethod
    def all() -> "ParamGroup":
        """Every parameter."""
        return ParamGroup(_All())

    @staticmethod
    def from_ids(ids) -> "ParamGroup":
        """The parameters with these ids (ParamId or int)."""
        return ParamGroup(_Ids(ParamId(i) for i in ids))

    @staticmethod
    def ids_from_module(module) -> "ParamGroup":
        """Every parameter of `module`, by id."""
        return ParamGroup.from_ids(p.id for _, p in module.named_params())

    @staticmethod
    def from_path(path: str) -> "ParamGroup":
        """The parameter at exactly this path (e.g. "encoder.linear.weight")."""
        return ParamGroup.from_paths([path])

    @staticmethod
    def from_paths(paths) -> "ParamGroup":
        """The parameters at exactly these paths."""
        if isinstance(paths, str):
            paths = [paths]
        return ParamGroup(_Paths("exact", [str(p) for p in paths]))

    @staticmethod
    def from_predicate(text: str) -> "ParamGroup":
        """The parameters whose path contains `text`."""
        return ParamGroup.from_predicates([text])

    @staticmethod
    def from_predicates(texts) -> "ParamGroup":
        """The parameters whose path contains every one of `texts`."""
        return ParamGroup(_Paths("include", [str(t) for t in texts]))

    @staticmethod
    def from_any_predicates(texts) -> "ParamGroup":
        """The parameters whose path contains any of `texts`."""
        texts = [str(t) for t in texts]
        if not texts:
            return ParamGroup(_Any(()))
        return ParamGroup(_Any([_Paths("include", [t]) for t in texts]))

    @staticmethod
    def from_regex(pattern: str) -> "ParamGroup":
        """The parameters whose path matches the regex (searched, as Rust's `is_match`)."""
        return ParamGroup.from_regexes([pattern])

    @staticmethod
    def from_regexes(patterns) -> "ParamGroup":
        """The parameters whose path matches every one of the regexes."""
        if isinstance(patterns, str):
            patterns = [patterns]
        return ParamGroup(_Paths("regex", _compile_all(patterns)))

    @staticmethod
    def from_any_regexes(patterns) -> "ParamGroup":
        """The parameters whose path matches any of the regexes."""
        if isinstance(patterns, str):
            patterns = [patterns]
        pats = _compile_all(patterns)
        return ParamGroup(_Any([_Paths("regex", [p]) for p in pats]))

    SPEC_KINDS = ("all", "regex", "path", "paths", "predicate")

    @staticmethod
    def from_spec(spec: dict) -> "ParamGroup":
        """The group a JSON group spec describes (the form projects store): `{"kind": "all"}`,
        `{"kind": "regex", "pattern": "^enc\\."}`, `{"kind": "path", "path": "fc1.weight"}`,
        `{"kind": "paths", "paths": [...]}` or `{"kind": "predicate", "text": "attn"}`. A bad
        regex raises `ParamGroupError` with the regex module's message; an unknown kind
        `ValueError`."""
        kind = spec.get("kind")
        if kind == "all":
            return ParamGroup.all()
        if kind == "regex":
            return ParamGroup.from_regex(spec["pattern"])
        if kind == "path":
            return ParamGroup.from_path(spec["path"])
        if kind == "paths":
            return ParamGroup.from_paths(spec["paths"])
        if kind == "predicate":
            return ParamGroup.from_predicate(spec["text"])
        raise ValueError(
            f"unknown parameter group kind {kind!r}: expected one of {', '.join(ParamGroup.SPEC_KINDS)}")

    # ---------------------------------------------------------------- combinators
    def fuse(self, other: "ParamGroup") -> "ParamGroup":
        """Parameters in either group (the exclusions of both are dropped, as Burn does)."""
        return ParamGroup(_fuse(self._matcher, other._matcher))

    def exclude(self, other: "ParamGroup") -> "ParamGroup":
        """Remove the parameters `other` matches from this group (in place, as Burn's
        `exclude(&mut self)`); returns the group so that calls chain."""
        self._excludes = other._matcher if self._excludes is None else _fuse(self._excludes, other._matcher)
        return self

    def matches(self, param_id, path: str | None = None) -> bool:
        """Whether the parameter with this id (and path) belongs to the group."""
        pid = param_id if isinstance(param_id, ParamId) else ParamId(param_id)
        if not self._matcher.matches(pid, path):
            return False
        return self._excludes is None or not self._excludes.matches(pid, path)

    def __repr__(self) -> str:
        ex = f" excluding {self._excludes!r}" if self._excludes is not None else ""
        return f"ParamGroup({self._matcher!r}{ex})"
