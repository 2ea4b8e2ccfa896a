"""Symbolic shapes: axis sizes as exact expressions over named axes, and what layers' shape rules share.

- `dims`: `Dim` (an integer polynomial over axis names and floor quotients), `Constraint`, `as_dim`;
- `rules`: `Shape`, `RuleError`, `Ctx`, `expect` and the helpers a layer's shape rule is written with.

This room imports nothing of the engine: `engine.nn` declares each layer's rule with it
(`engine.nn.spec`), `engine.design` runs the rules on a design, `engine.interop` reads the dims.
"""
from .dims import Constraint, Dim, Floor, as_dim
from .rules import RuleError, RuleResult, Shape, dims_text

__all__ = ["Constraint", "Dim", "Floor", "as_dim", "RuleError", "RuleResult", "Shape", "dims_text"]
