"""Automatic layout: rows by topological generation (`networkx.topological_generations`).

Data flows top to bottom: generation `g` is the row at `y = g * ROW`; the nodes of a row are
spread `COLUMN` apart and centred on x = 0, in the order that keeps them near the average
column of the nodes feeding them.
"""
from __future__ import annotations

import networkx as nx

from .graph import Design

__all__ = ["auto_layout", "ROW", "COLUMN"]

ROW = 90.0
COLUMN = 220.0


def auto_layout(design: Design) -> dict:
    """Set every node's position; returns {name: (x, y)}."""
    index = {n: i for i, n in enumerate(design.graph.nodes)}
    placed: dict[str, tuple[float, float]] = {}
    for g, generation in enumerate(nx.topological_generations(design.graph)):

        def key(n):
            preds = [placed[p][0] for p in design.graph.predecessors(n) if p in placed]
            return (sum(preds) / len(preds) if preds else 0.0, index[n])

        row = sorted(generation, key=key)
        width = (len(row) - 1) * COLUMN
        for i, n in enumerate(row):
            placed[n] = (i * COLUMN - width / 2, g * ROW)
    for n, pos in placed.items():
        design.set_position(n, pos)
    return placed
