"""Name and layout tables between Hugging Face checkpoints and Ember models, as data.

A `WeightMap` is a list of `Rule`s. A rule pairs a Hugging Face tensor name template with an
Ember parameter path template and the transforms that turn the stored array into the
parameter (applied in order when loading; inverted in reverse order when saving):

    Rule("model.layers.{i}.self_attn.q_proj.weight", "layers.{i}.self_attn.query.weight",
         [RopePermute(n_heads=32, head_dim=128), Transpose()])

`{name}` placeholders match layer indices (`[0-9]+`); both templates of a rule use the same
placeholders. Every transform says its output shape from its input shape, so that a loader can
check every size from the file's header before it reads anything.

- `Transpose()`: PyTorch's `nn.Linear` stores `[out, in]`, Ember's (Burn's) Linear `[in, out]`.
- `RopePermute(n_heads, head_dim, axis=0)`: Hugging Face's rotary embedding rotates the two
  halves of each head (`i`, `i + head_dim/2`), Ember's (Burn's) interleaved pairs (`2i`, `2i+1`).
  Rows of `q_proj` / `k_proj` (and their biases) are permuted per head: viewed as
  `[n_heads, 2, head_dim/2]`, the last two axes swapped. Applied to the stored layout.
- `Split(axis, index, parts, sizes=None)`: one of `parts` equal slices (GPT-2's fused `c_attn` holds
  q, k, v), or of slices of `sizes` (Phi-3's `qkv_proj` with fewer key/value heads);
  on saving, the rules that share one stored name are concatenated in `index` order. A `Split`
  comes first in its rule's transforms.
- `Reshape(stored, ember)`: the same values in another shape (ViT's `cls_token` `[1, 1, d]`).

`WeightMap(rules, ignore=[regex, ...], aliases=[(regex, replacement), ...])`: stored tensors
matching an `ignore` pattern (buffers such as `rotary_emb.inv_freq`) are skipped; any other
stored tensor that no rule uses is an error when loading, so a checkpoint that does not fit the
configuration never loads partly. `aliases` rename stored names before the rules see them (an
`engine.store.KeyRemapper`), for the other spellings files of one family use: the original
GPT-2 files without `transformer.`, old BERT files' `LayerNorm.gamma` / `beta`. Saving always
writes the rules' names (what transformers writes today).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

__all__ = ["Reshape", "RopePermute", "Rule", "Split", "Transform", "Transpose", "WeightMap"]

_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


class Transform:
    """A reversible change of layout. Subclasses define `shape`, `forward`, `inverse`."""

    def shape(self, stored: tuple[int, ...]) -> tuple[int, ...]:
        """The output shape for an input of shape `stored`; ValueError when it does not fit."""
        raise NotImplementedError

    def stored_shape(self, ember: tuple[int, ...]) -> tuple[int, ...]:
        """The input shape that gives output shape `ember` (the inverse of `shape`)."""
        raise NotImplementedError

    def forward(self, array: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def inverse(self, array: np.ndarray) -> np.ndarray:
        raise NotImplementedError


@dataclass(frozen=True)
class Transpose(Transform):
    def shape(self, stored):
        if len(stored) != 2:
            raise ValueError(f"a transpose needs a rank-2 tensor, found dims {list(stored)}")
        return (stored[1], stored[0])

    def stored_shape(self, ember):
        return (ember[1], ember[0])

    def forward(self, array):
        return array.T  # a view: matmul reads a transposed (Fortran-ordered) weight as it is

    def inverse(self, array):
        return array.T


@dataclass(frozen=True)
class RopePermute(Transform):
    n_heads: int
    head_dim: int
    axis: int = 0

    def shape(self, stored):
        if not stored or self.axis >= len(stored):
            raise ValueError(f"a rotary permutation along axis {self.axis} needs rank > {self.axis}, found "
                             f"dims {list(stored)}")
        if self.head_dim % 2:
            raise ValueError(f"a rotary permutation needs an even head_dim, found {self.head_dim}")
        if stored[self.axis] != self.n_heads * self.head_dim:
            raise ValueError(f"a rotary permutation of {self.n_heads} heads of {self.head_dim} needs "
                             f"{self.n_heads * self.head_dim} along axis {self.axis}, found dims {list(stored)}")
        return tuple(stored)

    def stored_shape(self, ember):
        return tuple(ember)

    def _permute(self, array, halves_first: bool):
        a = np.moveaxis(np.asarray(array), self.axis, 0)
        rest = a.shape[1:]
        h, half = self.n_heads, self.head_dim // 2
        view = a.reshape((h, 2, half) + rest) if halves_first else a.reshape((h, half, 2) + rest)
        out = np.swapaxes(view, 1, 2).reshape((h * self.head_dim,) + rest)
        return np.ascontiguousarray(np.moveaxis(out, 0, self.axis))

    def forward(self, array):
        return self._permute(array, True)

    def inverse(self, array):
        return self._permute(array, False)


@dataclass(frozen=True)
class Split(Transform):
    axis: int
    index: int
    parts: int
    sizes: tuple[int, ...] | None = None  # the parts' sizes when they differ (Phi-3's q, k, v); None: equal

    def __post_init__(self):
        if self.sizes is not None and (len(self.sizes) != self.parts or any(int(n) < 1 for n in self.sizes)):
            raise ValueError(f"a split into {self.parts} parts needs {self.parts} positive sizes, found "
                             f"{list(self.sizes)}")

    def _bounds(self, total: int) -> tuple[int, int]:
        if self.sizes is None:
            n = total // self.parts
            return self.index * n, (self.index + 1) * n
        start = sum(int(n) for n in self.sizes[:self.index])
        return start, start + int(self.sizes[self.index])

    def shape(self, stored):
        if self.axis >= len(stored):
            raise ValueError(f"a split along axis {self.axis} needs rank > {self.axis}, found dims {list(stored)}")
        if self.sizes is not None:
            if stored[self.axis] != sum(self.sizes):
                raise ValueError(f"a split into parts of {list(self.sizes)} along axis {self.axis} needs "
                                 f"{sum(self.sizes)} there, found dims {list(stored)}")
        elif stored[self.axis] % self.parts:
            raise ValueError(f"a split into {self.parts} along axis {self.axis} needs a multiple of {self.parts}, "
                             f"found dims {list(stored)}")
        out = list(stored)
        lo, hi = self._bounds(stored[self.axis])
        out[self.axis] = hi - lo
        return tuple(out)

    def stored_shape(self, ember):  # one part's shape: the saver concatenates the parts
        return tuple(ember)

    def forward(self, array):
        lo, hi = self._bounds(array.shape[self.axis])
        index = [slice(None)] * array.ndim
        index[self.axis] = slice(lo, hi)
        return np.ascontiguousarray(array[tuple(index)])

    def inverse(self, array):  # the concatenation is done by the saver, over the rules of one name
        return array


@dataclass(frozen=True)
class Reshape(Transform):
    stored: tuple[int, ...]
    ember: tuple[int, ...]

    def shape(self, stored):
        if tuple(stored) != tuple(self.stored):
            raise ValueError(f"expected dims {list(self.stored)} to reshape into {list(self.ember)}, "
                             f"found {list(stored)}")
        return tuple(self.ember)

    def stored_shape(self, ember):
        return tuple(self.stored)

    def forward(self, array):
        return np.ascontiguousarray(array.reshape(self.ember))

    def inverse(self, array):
        return np.ascontiguousarray(array.reshape(self.stored))


def _pattern(template: str, prefix: str = "") -> str:
    """The regex text of `template`: its placeholders as groups `prefix + name` of digits."""
    pieces, last = [], 0
    for m in _PLACEHOLDER.finditer(template):
        pieces.append(re.escape(template[last:m.start()]))
        pieces.append(f"(?P<{prefix}{m.group(1)}>[0-9]+)")
        last = m.end()
    pieces.append(re.escape(template[last:]))
    return "".join(pieces) + r"\Z"


def _compile(template: str) -> tuple[re.Pattern, tuple[str, ...]]:
    return re.compile(_pattern(template)), tuple(_PLACEHOLDER.findall(template))


def _filler(template: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(literal texts, placeholder names) of `template`: literals[0] + value of names[0] + literals[1]
    + ... fills it (one more literal than names)."""
    parts = _PLACEHOLDER.split(template)
    return tuple(parts[0::2]), tuple(parts[1::2])


@dataclass
class Rule:
    """One stored tensor (template `hf`) to one Ember parameter (template `ember`)."""

    hf: str
    ember: str
    transforms: list = field(default_factory=list)

    def __post_init__(self):
        self.transforms = list(self.transforms)
        self._hf_re, hf_names = _compile(self.hf)
        self._ember_re, ember_names = _compile(self.ember)
        # the text after the last placeholder, which every path the rule covers ends with: `find`
        # tries each rule on each parameter, and most fail on it without a regex match
        self._ember_tail = _PLACEHOLDER.split(self.ember)[-1]
        self._hf_fill = _filler(self.hf)
        if sorted(hf_names) != sorted(ember_names):
            raise ValueError(f"rule {self.hf!r} -> {self.ember!r}: both templates must use the same placeholders")
        for i, t in enumerate(self.transforms):
            if not isinstance(t, Transform):
                raise TypeError(f"rule {self.hf!r}: transform {i} is a {type(t).__name__}, not a Transform")
            if isinstance(t, Split) and i != 0:
                raise ValueError(f"rule {self.hf!r}: a Split must be the first transform")

    @property
    def split(self) -> Split | None:
        return self.transforms[0] if self.transforms and isinstance(self.transforms[0], Split) else None

    def match_ember(self, path: str) -> str | None:
        """The stored name for Ember path `path`, or None when the rule does not cover it."""
        if not path.endswith(self._ember_tail):
            return None
        m = self._ember_re.match(path)
        if m is None:
            return None
        return self.hf_name(m.group)

    def hf_name(self, value) -> str:
        """The stored name with each placeholder `name` filled by `value(name)`."""
        literals, names = self._hf_fill
        if not names:
            return literals[0]
        out = [literals[0]]
        for name, literal in zip(names, literals[1:]):
            out += (value(name), literal)
        return "".join(out)

    def ember_shape(self, stored: tuple[int, ...]) -> tuple[int, ...]:
        shape = tuple(map(int, stored))
        for t in self.transforms:
            shape = t.shape(shape)
        return shape

    def stored_shape(self, ember: tuple[int, ...]) -> tuple[int, ...]:
        """The stored shape of an Ember value of shape `ember` (for a split rule: its part's)."""
        shape = tuple(int(d) for d in ember)
        for t in reversed(self.transforms):
            shape = t.stored_shape(shape)
        return shape

    def load(self, array: np.ndarray, dtype=None) -> np.ndarray:
        """The Ember value of a stored array (in `dtype` when given), with as few copies as the
        transforms allow: a transpose is a view (matmul reads the Fortran-ordered weight as it
        is); the q/k rows' rotary permutation and the dtype conversion are one pass."""
        ts = self.transforms
        if ts and isinstance(ts[0], RopePermute) and ts[0].axis == 0 and array.ndim == 2:
            # the rows' permutation moves whole rows (contiguous): one pass that also converts
            rope = ts[0]
            rows, cols = array.shape
            h, half = rope.n_heads, rope.head_dim // 2
            out = np.empty((h, half, 2, cols), dtype=array.dtype if dtype is None else dtype)
            np.copyto(out, array.reshape(h, 2, half, cols).transpose(0, 2, 1, 3), casting="unsafe")
            array, ts, dtype = out.reshape(rows, cols), ts[1:], None
        for t in ts:
            array = t.forward(array)
        if dtype is not None and array.dtype != dtype:
            array = array.astype(dtype, order="K")
        return array

    def save(self, array: np.ndarray) -> np.ndarray:
        """The stored layout of an Ember value (for a split rule: this rule's slice of it)."""
        for t in reversed(self.transforms):
            array = t.inverse(array)
        return np.ascontiguousarray(array)


class WeightMap:
    """The rules of one architecture (see the module docstring)."""

    def __init__(self, rules, ignore=(), aliases=()):
        from ..store.remap import KeyRemapper  # noqa: PLC0415

        self.rules: list[Rule] = list(rules)
        for r in self.rules:
            if not isinstance(r, Rule):
                raise TypeError(f"WeightMap expects Rules, got {type(r).__name__}")
        self.ignore = [re.compile(p) for p in ignore]
        self.aliases = aliases if isinstance(aliases, KeyRemapper) else KeyRemapper(aliases)
        self._matcher: tuple[list, re.Pattern] | None = None  # (the rules it was made of, their one regex)

    def canonical(self, stored_names) -> dict[str, str]:
        """{name the rules use: name in the file} for a checkpoint's tensor names (through the
        aliases; two file names with one meaning raise RecordError naming both)."""
        names = list(stored_names)
        if not len(self.aliases) and "" not in names and len(set(names)) == len(names):
            return dict(zip(names, names))  # no aliases: each name is its own (what mapping() would check holds)
        return {new: old for old, new in self.aliases.mapping(names).items()}

    def __len__(self) -> int:
        return len(self.rules)

    def __repr__(self) -> str:
        return f"WeightMap({len(self.rules)} rules, {len(self.ignore)} ignored patterns)"

    def find(self, ember_path: str) -> tuple[Rule, str] | None:
        """(rule, stored name) for an Ember parameter path; None when no rule covers it. The first
        rule (in order) whose Ember template matches wins: all the rules' templates are one regex
        of alternatives tried in order (one match per path, not one per rule)."""
        made = self._matcher
        if made is None or made[0] != self.rules:
            made = self._matcher_of_rules()
        m = made[1].match(ember_path)
        if m is None:
            return None
        rule, form, groups = made[2][m.lastindex]  # rule k's outer group closes last
        if not groups:
            return rule, form
        return rule, form % ((m.group(groups[0]),) if len(groups) == 1 else m.group(*groups))

    def _matcher_of_rules(self) -> tuple:
        """(the rules, their one regex, {outer group index: (rule, stored name as a %-format,
        the groups of its placeholders in that order)}), made again when the rules list changed."""
        made = self._matcher
        if made is None or made[0] != self.rules:
            rules, texts, table, index = list(self.rules), [], {}, 1
            for k, r in enumerate(rules):
                names = _PLACEHOLDER.findall(r.ember)  # the groups, numbered in the template's order
                texts.append(f"(?P<r{k}>{_pattern(r.ember, f'r{k}_')})")
                literals, hf_names = r._hf_fill
                form = "%s".join(t.replace("%", "%%") for t in literals)
                table[index] = (r, form, tuple(index + 1 + names.index(n) for n in hf_names))
                index += 1 + len(names)
            made = self._matcher = (rules, re.compile("|".join(texts) or r"(?!)"), table)
        return made

    def ignored(self, stored_name: str) -> bool:
        return any(p.search(stored_name) for p in self.ignore)

    def kept(self, stored_names) -> list[str]:
        """The names `ignored` does not skip, in order (one regex pass over each name)."""
        if not self.ignore:
            return list(stored_names)
        if len(self.ignore) == 1:
            search = self.ignore[0].search
            return [n for n in stored_names if not search(n)]
        return [n for n in stored_names if not self.ignored(n)]
