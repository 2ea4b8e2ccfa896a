"""ParamGroup: every constructor, matching by id and by path, fuse and exclude."""
import pytest

from engine import ParamGroup
from engine.module import ParamGroupError, ParamId

from .helpers import Mlp

A, B = ParamId(1), ParamId(2)


def test_all_matches_everything():
    assert ParamGroup.all().matches(A) and ParamGroup.all().matches(B, "x.y")


def test_from_ids_matches_by_id_only():
    g = ParamGroup.from_ids([A, 7])
    assert g.matches(A, "anything") and g.matches(ParamId(7))
    assert not g.matches(B, "anything")


def test_path_matchers():
    assert ParamGroup.from_path("enc.linear.weight").matches(A, "enc.linear.weight")
    assert not ParamGroup.from_path("enc.linear.weight").matches(A, "enc.linear.bias")
    g = ParamGroup.from_paths(["a.weight", "b.weight"])
    assert g.matches(A, "b.weight") and not g.matches(A, "c.weight")
    assert ParamGroup.from_predicate("backbone").matches(A, "model.backbone.weight")
    assert not ParamGroup.from_predicate("backbone").matches(A, "model.head.weight")
    assert ParamGroup.from_predicates(["backbone", "linear"]).matches(A, "backbone.linear.w")
    assert not ParamGroup.from_predicates(["backbone", "linear"]).matches(A, "backbone.conv.w")
    assert ParamGroup.from_any_predicates(["conv", "linear"]).matches(A, "backbone.conv.w")


def test_regex_matchers_search_like_rust_is_match():
    g = ParamGroup.from_regex(r"(^|\.)lora\.(a|b)$")
    assert g.matches(A, "linear.weight.lora.a") and g.matches(A, "lora.b")
    assert not g.matches(A, "linear.weight") and not g.matches(A, "xlora.a")
    both = ParamGroup.from_regexes([r"^encoder\.layer\.\d+", r"bias$"])
    assert both.matches(A, "encoder.layer.3.bias") and not both.matches(A, "encoder.layer.3.weight")
    either = ParamGroup.from_any_regexes([r"^encoder\.", r"^decoder\."])
    assert either.matches(A, "decoder.x") and not either.matches(A, "head.x")


def test_invalid_regex_is_reported():
    with pytest.raises(ParamGroupError, match=r"invalid regex pattern '\('"):
        ParamGroup.from_regex("(")


def test_path_group_needs_a_path():
    with pytest.raises(ParamGroupError, match="no path was given"):
        ParamGroup.from_path("a").matches(A)


def test_fuse_is_either():
    g = ParamGroup.from_ids([A]).fuse(ParamGroup.from_path("layer.weight"))
    assert g.matches(A, "other") and g.matches(B, "layer.weight") and not g.matches(B, "layer.bias")


def test_exclude_removes_matches():
    g = ParamGroup.from_predicate("backbone").exclude(ParamGroup.from_path("model.backbone.bias"))
    assert g.matches(A, "model.backbone.weight") and not g.matches(A, "model.backbone.bias")
    g2 = ParamGroup.from_ids([A, B])
    g2.exclude(ParamGroup.from_ids([B]))  # in place, as Burn's exclude(&mut self)
    assert g2.matches(A) and not g2.matches(B)


def test_groups_select_module_values_by_id_and_by_path():
    m = Mlp()
    by_path = {p for p, q in m.named_params() if ParamGroup.from_predicate("linear2").matches(q.id, p)}
    assert by_path == {"linear2.weight", "linear2.bias"}
    ids = ParamGroup.from_ids([m.linear1.weight.id])
    frozen = m.no_grad_group(ids)
    assert [p for p, q in frozen.named_params() if not q.is_require_grad()] == ["linear1.weight"]
    all_ids = ParamGroup.ids_from_module(m)
    assert all(all_ids.matches(q.id, p) for p, q in m.named_params())


def test_group_from_a_json_spec():
    import pytest as _pytest

    from engine.module import ParamGroup as G
    from engine.module.group import ParamGroupError as E

    assert G.from_spec({"kind": "all"}).matches(1, "x")
    assert G.from_spec({"kind": "regex", "pattern": r"^enc\."}).matches(1, "enc.w")
    assert not G.from_spec({"kind": "regex", "pattern": r"^enc\."}).matches(1, "dec.w")
    assert G.from_spec({"kind": "path", "path": "a.b"}).matches(1, "a.b")
    assert G.from_spec({"kind": "paths", "paths": ["a", "b"]}).matches(1, "b")
    assert G.from_spec({"kind": "predicate", "text": "attn"}).matches(1, "x.attn.q")
    with _pytest.raises(E):
        G.from_spec({"kind": "regex", "pattern": "("})
    with _pytest.raises(ValueError, match="unknown parameter group kind"):
        G.from_spec({"kind": "nope"})
