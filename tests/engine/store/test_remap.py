"""KeyRemapper / ModuleRecord.with_key_remapping (Burn's key remapping)."""
import numpy as np
import pytest

from engine import nn
from engine.store import KeyRemapper, ModuleRecord, RecordError, TensorEntry


def _record(names):
    return ModuleRecord([TensorEntry.from_array(n, np.full((2,), i, np.float32)) for i, n in enumerate(names)])


def test_renames_in_order_and_loads_into_a_module():
    lin = nn.LinearConfig(3, 2).init()
    rec = lin.into_record()
    stored = rec.with_key_remapping([(r"^", "model.proj.")])  # as another program would name it
    assert stored.names() == ["model.proj.weight", "model.proj.bias"]
    back = stored.with_key_remapping(KeyRemapper().add(r"^model\.proj\.", ""))
    loaded = nn.LinearConfig(3, 2).init().load_record(back)
    np.testing.assert_array_equal(loaded.weight.val().numpy(), lin.weight.val().numpy())
    assert back.owner("weight") == "Linear"  # owners follow the names (adapters need them)


def test_groups_chain_and_explain():
    remap = KeyRemapper().add(r"layers\.(\d+)\.attn\.", r"blocks.\1.attention.").add_pattern(r"^model\.", "")
    assert remap.apply("model.layers.12.attn.q") == "blocks.12.attention.q"
    assert [s[0] for s in remap.explain("model.layers.1.attn.q")] == [r"layers\.(\d+)\.attn\.", r"^model\."]
    assert len(remap) == 2 and remap.rules[1] == (r"^model\.", "")


def test_collisions_and_bad_patterns_are_clear_errors():
    rec = _record(["a.x", "b.x"])
    with pytest.raises(RecordError, match="maps both 'a.x' and 'b.x' to 'x'"):
        rec.with_key_remapping([(r"^[ab]\.", "")])
    with pytest.raises(ValueError, match="invalid pattern"):
        KeyRemapper().add("(", "")
    with pytest.raises(ValueError, match="does not fit"):
        KeyRemapper().add("a", r"\1")
    with pytest.raises(TypeError, match="pair"):
        KeyRemapper(["abc"])
    with pytest.raises(RecordError, match="empty name"):
        rec.with_key_remapping([(r".*", "")])
    assert rec.names() == ["a.x", "b.x"]  # the original is untouched
