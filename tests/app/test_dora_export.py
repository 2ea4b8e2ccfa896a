"""app.core.checkpoints' adapters-only export keeps every adapter tensor, DoRA's magnitudes too."""
from pathlib import Path

from engine.models import from_pretrained

LLAMA = Path(__file__).resolve().parents[1] / "fixtures" / "hf" / "llama-gqa"


def test_an_adapters_only_export_keeps_dora_magnitudes(tmp_path):
    from app.core.checkpoints import export
    from engine.module import Lora, ParamGroup
    from engine.store import ModuleRecord

    model = from_pretrained(LLAMA).apply_lora(
        Lora(2, 4.0, use_dora=True).set_param_group(ParamGroup.from_regex(r"self_attn\.(query|value)\.weight$")))
    written = export(model, tmp_path / "adapters.bpk", "adapters")
    names = ModuleRecord.load(written).names()
    assert any(n.endswith("lora.magnitude") for n in names) and any(n.endswith("lora.a") for n in names)
    assert all(".lora." in n for n in names)
