"""Fusions: the subgraphs an exporter writes for one layer (GELU, RMSNorm, SiLU) found and imported as that layer."""
from __future__ import annotations

import math

import numpy as np

from .common import MAX_FOLD_ELEMENTS, node_attrs


class Fusions:
    """The fusion finder of the importer (a part of `importer.Importer`)."""

    def _find_fusions(self) -> dict:
        """{anchor node index: (kind, config, input value, output value, params, [indices])}."""
        out = {}
        nodes = self.g.node
        for i, n in enumerate(nodes):
            if n.op_type == "Erf":
                got = self._gelu(i)
            elif n.op_type == "Pow":
                got = self._rms(i)
            elif n.op_type == "Sigmoid":
                got = self._silu(i)
            else:
                continue
            if got is None:
                continue
            members = got[-1]
            if any(m in self.done for m in members):
                continue
            anchor = max(members)
            out[anchor] = got
            self.done.update(m for m in members if m != anchor)
        return out

    def _gelu(self, i):
        nodes, prod = self.g.node, self._producer()
        erf = nodes[i]
        p = prod.get(erf.input[0])
        if p is None:
            return None
        d = nodes[p]
        if d.op_type == "Div" and abs((self.scalar(d.input[1]) or 0) - math.sqrt(2)) < 1e-3:
            x = d.input[0]
        elif d.op_type == "Mul" and self.scalar(d.input[1]) is not None and \
                abs(self.scalar(d.input[1]) - 1 / math.sqrt(2)) < 1e-3:
            x = d.input[0]
        else:
            return None
        if self.single(d.output[0]) != i:
            return None
        a = self.single(erf.output[0])
        if a is None or nodes[a].op_type != "Add" or abs((self.scalar(self.other_input(nodes[a], erf.output[0]) or "")
                                                          or 0) - 1.0) > 1e-6:
            return None
        m1 = self.single(nodes[a].output[0])
        if m1 is None or nodes[m1].op_type != "Mul":
            return None
        other = self.other_input(nodes[m1], nodes[a].output[0])
        if other == x:
            m2 = self.single(nodes[m1].output[0])
            if m2 is None or nodes[m2].op_type != "Mul" or \
                    abs((self.scalar(self.other_input(nodes[m2], nodes[m1].output[0]) or "") or 0) - 0.5) > 1e-6:
                return None
            return ("Gelu", {}, x, nodes[m2].output[0], {}, [p, i, a, m1, m2])
        h = prod.get(other)
        if h is not None and nodes[h].op_type == "Mul" and self.single(other) == m1 and \
                self.other_input(nodes[h], x) is not None and \
                abs((self.scalar(self.other_input(nodes[h], x)) or 0) - 0.5) < 1e-6:
            return ("Gelu", {}, x, nodes[m1].output[0], {}, [h, p, i, a, m1])
        return None

    def _rms(self, i):
        nodes, prod = self.g.node, self._producer()
        pw = nodes[i]
        x = pw.input[0]
        if self.scalar(pw.input[1]) != 2.0 or x in self.consts:
            return None
        dims = self.dims_of(x)
        r = self.single(pw.output[0])
        if r is None or nodes[r].op_type != "ReduceMean":
            return None
        rm = nodes[r]
        at = node_attrs(rm)
        axes = at.get("axes")
        if axes is None and len(rm.input) > 1 and rm.input[1]:
            axes = self.consts.get(rm.input[1])
            axes = None if axes is None else [int(v) for v in axes.reshape(-1)]
        if axes is None or len(axes) != 1 or not at.get("keepdims", 1):
            return None
        if axes[0] != -1 and not (dims and axes[0] == len(dims) - 1):
            return None
        a = self.single(rm.output[0])
        if a is None or nodes[a].op_type != "Add":
            return None
        eps = self.scalar(self.other_input(nodes[a], rm.output[0]) or "")
        if eps is None:
            return None
        s = self.single(nodes[a].output[0])
        if s is None or nodes[s].op_type != "Sqrt":
            return None
        nx_ = self.single(nodes[s].output[0])
        if nx_ is None:
            return None
        members = [i, r, a, s]
        nn_ = nodes[nx_]
        if nn_.op_type == "Reciprocal":
            m = self.single(nn_.output[0])
            if m is None or nodes[m].op_type != "Mul" or self.other_input(nodes[m], nn_.output[0]) != x:
                return None
            members += [nx_, m]
        elif nn_.op_type == "Div" and list(nn_.input[:2]) == [x, nodes[s].output[0]]:
            m = nx_
            members.append(m)
        elif nn_.op_type == "Div" and self.scalar(nn_.input[0]) == 1.0:
            m = self.single(nn_.output[0])
            if m is None or nodes[m].op_type != "Mul" or self.other_input(nodes[m], nn_.output[0]) != x:
                return None
            members += [nx_, m]
        else:
            return None
        out = nodes[m].output[0]
        gamma = None
        w = self.single(out)
        if w is not None and nodes[w].op_type == "Mul":
            g = self.other_input(nodes[w], out)
            if g in self.consts and self.consts[g].ndim == 1 and self.consts[g].dtype == np.float32:
                gamma = self.consts[g]
                members.append(w)
                out = nodes[w].output[0]
        if gamma is None:  # made from the declared dims: a size a file claims, so bounded as a folded constant
            if not dims or not isinstance(dims[-1], int) or not 0 < dims[-1] <= MAX_FOLD_ELEMENTS:
                return None
            gamma = np.ones((dims[-1],), np.float32)
        if dims and isinstance(dims[-1], int) and dims[-1] != gamma.shape[0]:
            return None
        return ("RmsNorm", {"d_model": int(gamma.shape[0]), "epsilon": float(eps)}, x, out, {"gamma": gamma}, members)

    def _silu(self, i):
        nodes = self.g.node
        sg = nodes[i]
        x = sg.input[0]
        m = self.single(sg.output[0])
        if m is None or nodes[m].op_type != "Mul" or self.other_input(nodes[m], sg.output[0]) != x:
            return None
        return ("SiLU", {}, x, nodes[m].output[0], {}, [i, m])

    # ------------------------------------------------------------------ one node
