"""Config dataclasses to plain JSON data and back (run.json, the settings forms)."""
from engine import optim
from engine.train.config_json import from_dict, to_dict


def test_to_dict_and_from_dict_round_trip_nested_configs():
    cfg = optim.SgdConfig(weight_decay=optim.WeightDecayConfig(0.01), momentum=optim.MomentumConfig(0.8, 0.0, True),
                          gradient_clipping=optim.GradientClippingConfig.norm(2.0))
    data = to_dict(cfg)
    assert data["momentum"] == {"momentum": 0.8, "dampening": 0.0, "nesterov": True}
    back = from_dict(optim.SgdConfig, data, {"gradient_clipping": optim.GradientClippingConfig | None})
    assert back == cfg
