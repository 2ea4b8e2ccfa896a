"""The rope scalings of a decoder's config.json (`rope_parameters` / `rope_scaling`), checked and
turned into `engine.nn` frequency scalings, as transformers reads them:

- `linear` (`factor`), `llama3` (`factor`, `low_freq_factor`, `high_freq_factor`,
  `original_max_position_embeddings`);
- `yarn` (`factor`, `original_max_position_embeddings`; optional `beta_fast`, `beta_slow`,
  `mscale`, `mscale_all_dim`, `attention_factor`, `truncate`);
- `dynamic` (`factor`: dynamic NTK past `max_position_embeddings`; Ember then allows positions up
  to `factor * max_position_embeddings`);
- `longrope` (`short_factor`, `long_factor`, one per frequency; optional `factor`,
  `attention_factor`).

For llama3 / yarn / longrope a missing `original_max_position_embeddings` is the config's top-level
one when it has one (Phi-3 keeps it there, and transformers gives that one priority), else
`max_position_embeddings`.
"""
from __future__ import annotations

import math

from .. import nn
from .hf_folder import PretrainedError

__all__ = ["check_rope_scaling", "rope_scaling", "rope_length"]

_WHERE = "config.json"
_REQUIRED = {"linear": ("factor",),
             "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
             "yarn": ("factor", "original_max_position_embeddings"),
             "dynamic": ("factor",),
             "longrope": ("original_max_position_embeddings",)}
_OPTIONAL = {"yarn": ("beta_fast", "beta_slow", "mscale", "mscale_all_dim", "attention_factor"),
             "longrope": ("factor", "attention_factor")}
_WITH_ORIGINAL = ("llama3", "yarn", "longrope")


def _number(kind, key, value):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or not math.isfinite(value):
        raise PretrainedError(f"rope scaling {kind!r}: {key!r} must be a positive number, found {value!r}",
                              where=_WHERE)
    return value


def check_rope_scaling(scaling, *, head_dim: int, max_position_embeddings: int,
                       original_max_position_embeddings=None) -> dict | None:
    """The rope scaling of a config (None for plain rope): a dict with `rope_type` and its values,
    every default filled in. A value of the wrong type or an unknown `rope_type` is a
    `PretrainedError` naming the key."""
    if scaling is None:
        return None
    if not isinstance(scaling, dict):
        raise PretrainedError(f"'rope_scaling' must be an object, found {scaling!r}", where=_WHERE)
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "default":
        return None
    if kind not in _REQUIRED:
        raise PretrainedError(f"rope_type {kind!r} is not supported: expected one of default, "
                              f"{', '.join(_REQUIRED)}", where=_WHERE)
    scaling = dict(scaling)
    if kind in _WITH_ORIGINAL:
        if original_max_position_embeddings is not None:
            scaling["original_max_position_embeddings"] = original_max_position_embeddings
        scaling.setdefault("original_max_position_embeddings", max_position_embeddings)
    if kind == "yarn" and scaling.get("factor") is None:
        scaling["factor"] = max_position_embeddings / _number(kind, "original_max_position_embeddings",
                                                              scaling["original_max_position_embeddings"])
    out = {"rope_type": kind}
    for key in _REQUIRED[kind]:
        out[key] = _number(kind, key, scaling.get(key))
    for key in _OPTIONAL.get(kind, ()):
        if scaling.get(key) is not None:
            out[key] = _number(kind, key, scaling[key])
    for key in ("original_max_position_embeddings",):
        if key in out and (isinstance(out[key], float) and not out[key].is_integer()):
            raise PretrainedError(f"rope scaling {kind!r}: {key!r} must be an integer, found {out[key]!r}",
                                  where=_WHERE)
    if kind == "llama3" and not out["high_freq_factor"] > out["low_freq_factor"]:
        raise PretrainedError(f"rope scaling 'llama3': 'high_freq_factor' ({out['high_freq_factor']}) must exceed "
                              f"'low_freq_factor' ({out['low_freq_factor']})", where=_WHERE)
    if kind == "yarn" and "truncate" in scaling:
        if not isinstance(scaling["truncate"], bool):
            raise PretrainedError(f"rope scaling 'yarn': 'truncate' must be true or false, found "
                                  f"{scaling['truncate']!r}", where=_WHERE)
        out["truncate"] = scaling["truncate"]
    if kind == "longrope":
        for key in ("short_factor", "long_factor"):
            values = scaling.get(key)
            if not isinstance(values, list) or len(values) != head_dim // 2:
                raise PretrainedError(f"rope scaling 'longrope': {key!r} must be a list of {head_dim // 2} numbers "
                                      f"(one per frequency of head_dim {head_dim}), found {values!r}", where=_WHERE)
            out[key] = [_number(kind, key, v) for v in values]
    return out


def rope_length(scaling: dict | None, max_position_embeddings: int) -> int:
    """The positions the rotary encoding allows: `max_position_embeddings`, or `factor` times it for
    dynamic NTK (whose point is to go past it)."""
    if scaling and scaling["rope_type"] == "dynamic":
        return max(max_position_embeddings, int(max_position_embeddings * scaling["factor"]))
    return max_position_embeddings


def rope_scaling(scaling: dict | None, theta: float, max_position_embeddings: int):
    """The `engine.nn` frequency scaling of a checked `scaling` dict (None for plain rope)."""
    if not scaling:
        return None
    kind = scaling["rope_type"]
    if kind == "linear":
        return nn.LinearRopeScaling(float(scaling["factor"]))
    if kind == "llama3":
        return nn.Llama3RopeScaling(float(scaling["factor"]), float(scaling["low_freq_factor"]),
                                    float(scaling["high_freq_factor"]), int(scaling["original_max_position_embeddings"]))
    if kind == "yarn":
        return nn.YarnRopeScaling(
            theta, float(scaling["factor"]), int(scaling["original_max_position_embeddings"]),
            beta_fast=float(scaling.get("beta_fast", 32)), beta_slow=float(scaling.get("beta_slow", 1)),
            mscale=scaling.get("mscale"), mscale_all_dim=scaling.get("mscale_all_dim"),
            attention_factor_=scaling.get("attention_factor"), truncate=scaling.get("truncate", True))
    if kind == "dynamic":
        return nn.DynamicNtkRopeScaling(theta, float(scaling["factor"]), int(max_position_embeddings))
    return nn.LongRopeScaling(theta, tuple(float(v) for v in scaling["short_factor"]),
                              tuple(float(v) for v in scaling["long_factor"]),
                              int(scaling["original_max_position_embeddings"]), int(max_position_embeddings),
                              factor=scaling.get("factor"), attention_factor_=scaling.get("attention_factor"))
