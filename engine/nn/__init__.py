"""Burn's built-in layers and losses under Burn's names.

    from engine import nn
    linear = nn.LinearConfig(d_input=3, d_output=5).init(device)
    print(linear)   # Linear {d_input: 3, d_output: 5, bias: true, params: 20}

Each layer has a `…Config` dataclass with Burn's fields and defaults, built by
`config.init(device)` (parameter-free layers take no device), a `forward` whose docstring has a
`Shapes` section and whose inputs are checked with `assert_shape` at the boundary, Burn's
parameter names and layouts, Burn's default initializers and Burn's display.

A layer with float parameters also checks its input's dtype at the boundary (`_base.check_dtype`):
the input must have the parameters' dtype, so a float32 layer refuses float64 and int inputs
with a `DTypeError` naming the layer and both dtypes, instead of silently computing in float64.
Embedding takes int indices only; parameter-free layers follow the input's float dtype.
"""
from .linear import *  # noqa: F401,F403
from .embedding import *  # noqa: F401,F403
from .dropout import *  # noqa: F401,F403
from .norm import *  # noqa: F401,F403
from .activation import *  # noqa: F401,F403
from .misc import *  # noqa: F401,F403
from .loss import *  # noqa: F401,F403
from . import loss_shapes  # noqa: F401 - the losses' shape rules (declared for loss.py's classes)
from .conv import *  # noqa: F401,F403
from .pool import *  # noqa: F401,F403
from .interpolate import *  # noqa: F401,F403
from .rnn import *  # noqa: F401,F403
from .attention import *  # noqa: F401,F403
from .transformer import *  # noqa: F401,F403
from .moe import *  # noqa: F401,F403
from .pos_encoding import *  # noqa: F401,F403
from ..module.init import Initializer  # noqa: E402,F401  (Burn re-exports it as nn::Initializer)
