"""Symbolic axis sizes: exact integer expressions over the named axes of a design's inputs.

A `Dim` is a polynomial with integer coefficients whose variables are axis names (`batch`,
`seq`) and floor quotients `e // k` of a `Dim` by a positive integer; every named axis stands
for a size >= 1. It is kept in a canonical form, so two sizes are equal exactly when their
`Dim`s are: `(seq - 2) // 2 + 1` is `seq // 2`, `2 * n // 2` is `n`, `(h + 1) // 2 - 1` stays.
A quotient is split into the part the divisor divides and a remainder with coefficients in
`0..k-1` (`(2 * h + 3) // 2` is `h + 1`), which is exact for integer axis sizes. `ceil_div`
is `(e + k - 1) // k`.

`Constraint` is what an input must satisfy for a layer to accept it, in the user's names:
`w must be divisible by 2`, `seq must be even`, `h must be at least 3`.

Rendering: `str(d)` (`h-2`, `16*seq`, `(h+1)//2-1`, as the designer shows dims), `d.python()`
(`h - 2`, with `//`) and `d.rust()` (usize arithmetic: `/` for the quotient, added terms before
subtracted ones so that no intermediate value goes below zero).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["Dim", "Floor", "Constraint", "as_dim"]


@dataclass(frozen=True)
class Floor:
    """The atom `num // den` (den >= 2, num not divisible by den)."""

    num: "Dim"
    den: int

    def key(self) -> tuple:
        return (1, self.num.text(), self.den)


def _akey(atom) -> tuple:
    return (0, atom, 0) if isinstance(atom, str) else atom.key()


def _mono(atoms) -> tuple:
    return tuple(sorted(atoms, key=_akey))


class Dim:
    """An exact integer expression over axis names (see the module docstring)."""

    __slots__ = ("terms", "_hash")

    def __init__(self, terms: dict | None = None):
        # monomial (sorted tuple of atoms; () is the constant) -> non-zero int coefficient
        self.terms = {m: c for m, c in (terms or {}).items() if c}
        self._hash = None

    # ------------------------------------------------------------------ making
    @staticmethod
    def const(v: int) -> "Dim":
        return Dim({(): int(v)})

    @staticmethod
    def name(n: str) -> "Dim":
        return Dim({(n,): 1})

    # ------------------------------------------------------------------ reading
    def is_const(self) -> bool:
        return all(m == () for m in self.terms)

    def value(self) -> int:
        """The constant (only for `is_const()`)."""
        return self.terms.get((), 0)

    def names(self) -> set:
        out = set()
        for m in self.terms:
            for a in m:
                out |= {a} if isinstance(a, str) else a.num.names()
        return out

    def evaluate(self, env: dict) -> int:
        """The size for concrete axis sizes `env` ({name: int})."""
        total = 0
        for m, c in self.terms.items():
            p = c
            for a in m:
                p *= env[a] if isinstance(a, str) else a.num.evaluate(env) // a.den
            total += p
        return total

    def linear_in_one_name(self):
        """(name, a, b) when the Dim is `a * name + b` with a > 0, else None."""
        nonconst = [(m, c) for m, c in self.terms.items() if m != ()]
        if len(nonconst) != 1:
            return None
        (m, c), = nonconst
        if len(m) != 1 or not isinstance(m[0], str) or c <= 0:
            return None
        return m[0], c, self.terms.get((), 0)

    # ------------------------------------------------------------------ arithmetic
    def __add__(self, other) -> "Dim":
        other = as_dim(other)
        terms = dict(self.terms)
        for m, c in other.terms.items():
            terms[m] = terms.get(m, 0) + c
        return Dim(terms)

    __radd__ = __add__

    def __neg__(self) -> "Dim":
        return Dim({m: -c for m, c in self.terms.items()})

    def __sub__(self, other) -> "Dim":
        return self + (-as_dim(other))

    def __rsub__(self, other) -> "Dim":
        return as_dim(other) - self

    def __mul__(self, other) -> "Dim":
        other = as_dim(other)
        terms: dict = {}
        for m1, c1 in self.terms.items():
            for m2, c2 in other.terms.items():
                m = _mono(m1 + m2)
                terms[m] = terms.get(m, 0) + c1 * c2
        return Dim(terms)

    __rmul__ = __mul__

    def __floordiv__(self, k) -> "Dim":
        if isinstance(k, Dim):
            if not k.is_const():
                raise TypeError("a Dim can only be divided by an integer")
            k = k.value()
        k = int(k)
        if k <= 0:
            raise ZeroDivisionError(f"floor division of a size by {k}")
        if k == 1:
            return self
        exact, rest = {}, {}
        for m, c in self.terms.items():
            q, r = divmod(c, k)
            if q:
                exact[m] = q
            if r:
                rest[m] = r
        out = Dim(exact)
        remainder = Dim(rest)
        if remainder.terms and not remainder.is_const():
            # a common factor of the remainder and k cancels: (2*h) // 4 is h // 2
            g = k
            for c in remainder.terms.values():
                g = math.gcd(g, c)
            if g > 1:
                remainder = Dim({m: c // g for m, c in remainder.terms.items()})
                k //= g
            out = out + Dim({(Floor(remainder, k),): 1})
        # a constant remainder lies in 0..k-1: its quotient is 0
        return out

    def ceil_div(self, k: int) -> "Dim":
        return (self + (int(k) - 1)) // int(k)

    def divisible_by(self, k: int) -> bool:
        """Whether every coefficient is a multiple of `k` (so the size always is)."""
        return all(c % k == 0 for c in self.terms.values())

    # ------------------------------------------------------------------ comparing
    def __eq__(self, other) -> bool:
        if isinstance(other, int) and not isinstance(other, bool):
            return self.is_const() and self.value() == other
        if isinstance(other, Dim):
            return self.terms == other.terms
        return NotImplemented

    def __hash__(self) -> int:
        if self._hash is None:
            self._hash = hash(frozenset(self.terms.items()))
        return self._hash

    # ------------------------------------------------------------------ text
    def _parts(self, style: str) -> list[tuple[int, str]]:
        """(sign, unsigned text) per term: added non-constant terms, the constant, subtracted ones."""
        mul = "*" if style == "text" else " * "

        def atom_text(a, alone: bool) -> str:
            if isinstance(a, str):
                return a
            num = a.num._render(style)
            if len(a.num.terms) > 1 or any(c != 1 or len(m) > 1 for m, c in a.num.terms.items()):
                num = f"({num})"
            div = {"text": "//", "python": " // ", "rust": " / "}[style]
            t = f"{num}{div}{a.den}"
            return t if alone else f"({t})"

        def mono_text(m, c) -> str:
            alone = abs(c) == 1 and len(m) == 1
            factors = ([str(abs(c))] if abs(c) != 1 else []) + [atom_text(a, alone) for a in m]
            return mul.join(factors)

        pos, neg = [], []
        terms = self._absorbed()
        items = sorted(((m, c) for m, c in terms.items() if m != ()), key=lambda mc: [_akey(a) for a in mc[0]])
        for m, c in items:
            (pos if c > 0 else neg).append((1 if c > 0 else -1, mono_text(m, c)))
        const = terms.get((), 0)
        if const > 0:
            pos.append((1, str(const)))
        elif const < 0:
            neg.append((-1, str(-const)))
        return pos + neg

    def _absorbed(self) -> dict:
        """The terms to show: a subtracted constant moves into the one quotient it follows,
        `(h+1)//2-2` shows as `(h-3)//2` (the same value; only the text changes)."""
        const = self.terms.get((), 0)
        floors = [m for m, c in self.terms.items() if c == 1 and len(m) == 1 and isinstance(m[0], Floor)]
        if const >= 0 or len(floors) != 1:
            return self.terms
        (f,), = floors
        terms = {m: c for m, c in self.terms.items() if m not in ((), (f,))}
        terms[(Floor(f.num + const * f.den, f.den),)] = 1
        return terms

    def _render(self, style: str) -> str:
        parts = self._parts(style)
        if not parts:
            return "0"
        plus, minus = ("+", "-") if style == "text" else (" + ", " - ")
        out = ""
        for i, (sign, t) in enumerate(parts):
            if i == 0:
                out = t if sign > 0 else f"-{t}"
            else:
                out += (plus if sign > 0 else minus) + t
        return out

    def text(self) -> str:
        return self._render("text")

    def python(self) -> str:
        return self._render("python")

    def rust(self) -> str:
        return self._render("rust")

    def __str__(self) -> str:
        return self.text()

    def __repr__(self) -> str:
        return f"Dim({self.text()!r})"

    def label(self):
        """An int for a constant, else the text: the form `SymTensor.dims` holds."""
        return self.value() if self.is_const() else self.text()


def as_dim(v) -> Dim:
    """A Dim from a Dim, an int, or an axis name."""
    if isinstance(v, Dim):
        return v
    if isinstance(v, bool):
        raise TypeError(f"not a size: {v!r}")
    if isinstance(v, int):
        return Dim.const(v)
    if isinstance(v, str):
        return Dim.name(v)
    raise TypeError(f"not a size: {v!r}")


@dataclass(frozen=True)
class Constraint:
    """`dim` must be a multiple of `value` (kind "multiple"), at least it ("min") or at most ("max")."""

    dim: Dim
    kind: str
    value: int

    def holds(self, env: dict) -> bool:
        v = self.dim.evaluate(env)
        if self.kind == "multiple":
            return v % self.value == 0
        if self.kind == "min":
            return v >= self.value
        return v <= self.value

    def decided(self):
        """True / False when the constraint does not depend on the input sizes, else None."""
        if self.kind == "multiple":
            if self.dim.divisible_by(self.value):
                return True
            return (self.dim.value() % self.value == 0) if self.dim.is_const() else None
        if self.dim.is_const():
            return self.holds({})
        if self.kind == "min" and self._lower_bound() >= self.value:
            return True
        return None

    def _lower_bound(self) -> int | float:
        """A lower bound of the Dim over sizes >= 1 (for polynomials with non-negative coefficients)."""
        if any(c < 0 for m, c in self.dim.terms.items() if m != ()):
            return -math.inf
        if any(not isinstance(a, str) for m in self.dim.terms for a in m):
            return -math.inf
        return sum(self.dim.terms.values())

    def text(self) -> str:
        if self.kind == "multiple":
            k = self.value
            return f"{self.dim} must be even" if k == 2 else f"{self.dim} must be divisible by {k}"
        lin = self.dim.linear_in_one_name()
        what = "at least" if self.kind == "min" else "at most"
        if lin is not None:
            name, a, b = lin
            # a*name + b >= v  <=>  name >= ceil((v - b) / a);  a*name + b <= v  <=>  name <= floor((v - b) / a)
            bound = -((b - self.value) // a) if self.kind == "min" else (self.value - b) // a
            return f"{name} must be {what} {bound}"
        return f"{self.dim} must be {what} {self.value}"

    def __str__(self) -> str:
        return self.text()
