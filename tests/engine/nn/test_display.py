"""Every layer prints exactly as Burn prints it (expected strings from Burn's own tests and
ModuleDisplay implementations)."""
import pytest

from engine import nn

CASES = [
    (lambda: nn.LinearConfig(d_input=3, d_output=5).init(), "Linear {d_input: 3, d_output: 5, bias: true, params: 20}"),
    (lambda: nn.LinearConfig(3, 5, bias=False).init(), "Linear {d_input: 3, d_output: 5, bias: false, params: 15}"),
    (lambda: nn.EmbeddingConfig(100, 10).init(), "Embedding {n_embedding: 100, d_model: 10, params: 1000}"),
    (lambda: nn.DropoutConfig(prob=0.5).init(), "Dropout {prob: 0.5}"),
    (lambda: nn.LayerNormConfig(6).init(), "LayerNorm {d_model: 6, epsilon: 0.00001, bias: true, params: 12}"),
    (lambda: nn.LayerNormConfig(6).with_bias(False).init(), "LayerNorm {d_model: 6, epsilon: 0.00001, bias: false, params: 6}"),
    (lambda: nn.BatchNormConfig(3).init(), "BatchNorm {num_features: 3, momentum: 0.1, epsilon: 0.00001, params: 12}"),
    (lambda: nn.GroupNormConfig(3, 6).init(), "GroupNorm {num_groups: 3, num_channels: 6, epsilon: 0.00001, affine: true, params: 12}"),
    (lambda: nn.InstanceNormConfig(6).init(), "InstanceNorm {num_channels: 6, epsilon: 0.00001, affine: true, params: 12}"),
    (lambda: nn.RmsNormConfig(6).init(), "RmsNorm {d_model: 6, epsilon: 0.00001, params: 6}"),
    (lambda: nn.LocalResponseNormConfig(5).init(), "LocalResponseNorm {size: 5, alpha: 0.0001, beta: 0.75, k: 1}"),
    (lambda: nn.GaussianNoiseConfig(0.5).init(), "GaussianNoise {std: 0.5}"),
    (lambda: nn.CosineSimilarityConfig(dim=-1, eps=0.5).init(), "CosineSimilarity {dim: -1, eps: 0.5}"),
    (lambda: nn.PairwiseDistanceConfig(p=2.0, eps=0.5).init(), "PairwiseDistance {p: 2, eps: 0.5}"),
    (lambda: nn.PixelShuffleConfig(2).init(), "PixelShuffle {upscale_factor: 2}"),
    (lambda: nn.PixelUnshuffleConfig(2).init(), "PixelUnshuffle {downscale_factor: 2}"),
    (lambda: nn.Identity(), "Identity"),
    # activations
    (lambda: nn.Gelu(), "Gelu"),
    (lambda: nn.Relu(), "Relu"),
    (lambda: nn.Relu6(), "Relu6"),
    (lambda: nn.Selu(), "Selu"),
    (lambda: nn.Sigmoid(), "Sigmoid"),
    (lambda: nn.Tanh(), "Tanh"),
    (lambda: nn.SiLU(), "SiLU"),
    (lambda: nn.HardSwish(), "HardSwish"),
    (lambda: nn.Mish(), "Mish"),
    (lambda: nn.Softsign(), "Softsign"),
    (lambda: nn.LogSigmoid(), "LogSigmoid"),
    (lambda: nn.Tanhshrink(), "Tanhshrink"),
    (lambda: nn.LeakyReluConfig().init(), "LeakyRelu {negative_slope: 0.01}"),
    (lambda: nn.PReluConfig().init(), "PRelu {num_parameters: 1, alpha_value: 0.25, params: 1}"),
    (lambda: nn.EluConfig().init(), "Elu {alpha: 1}"),
    (lambda: nn.CeluConfig().init(), "Celu {alpha: 1}"),
    (lambda: nn.HardSigmoidConfig().init(), "HardSigmoid {alpha: 0.2, beta: 0.5}"),
    (lambda: nn.HardtanhConfig().init(), "Hardtanh {min_val: -1, max_val: 1}"),
    (lambda: nn.SoftplusConfig().init(), "Softplus {beta: 1}"),
    (lambda: nn.HardShrinkConfig().init(), "HardShrink {lambda: 0.5}"),
    (lambda: nn.SoftShrinkConfig().init(), "SoftShrink {lambda: 0.5, bias: 0.5}"),
    (lambda: nn.ThresholdedReluConfig().init(), "ThresholdedRelu {alpha: 1}"),
    (lambda: nn.SwiGluConfig(3, 5).init(), "SwiGlu {d_input: 3, d_output: 5, bias: false, params: 30}"),
    (lambda: nn.GLU(1), "GLU {\n  dim: 1\n}"),
    # convolutions
    (lambda: nn.Conv1dConfig(5, 5, 5).init(),
     "Conv1d {ch_in: 5, ch_out: 5, stride: 1, kernel_size: 5, dilation: 1, groups: 1, padding: Valid, params: 130}"),
    (lambda: nn.Conv2dConfig([5, 1], [5, 5]).init(),
     "Conv2d {ch_in: 5, ch_out: 1, stride: [1, 1], kernel_size: [5, 5], dilation: [1, 1], groups: 1, padding: Valid, params: 126}"),
    (lambda: nn.Conv2dConfig([2, 3], [3, 3], padding=nn.PaddingConfig2d.Explicit(1, 2, 3, 4)).init(),
     "Conv2d {ch_in: 2, ch_out: 3, stride: [1, 1], kernel_size: [3, 3], dilation: [1, 1], groups: 1, padding: Explicit(1, 2, 3, 4), params: 57}"),
    (lambda: nn.Conv2dConfig([4, 4], [3, 3], groups=2, padding=nn.PaddingConfig2d.Same).init(),
     "Conv2d {ch_in: 4, ch_out: 4, stride: [1, 1], kernel_size: [3, 3], dilation: [1, 1], groups: 2, padding: Same, params: 76}"),
    (lambda: nn.Conv3dConfig([5, 1], [5, 5, 5]).init(),
     "Conv3d {ch_in: 5, ch_out: 1, stride: [1, 1, 1], kernel_size: [5, 5, 5], dilation: [1, 1, 1], groups: 1, padding: Valid, params: 626}"),
    (lambda: nn.ConvTranspose1dConfig([5, 2], 5).init(),
     "ConvTranspose1d {channels: [5, 2], stride: 1, kernel_size: 5, dilation: 1, groups: 1, padding: 0, padding_out: 0, params: 52}"),
    (lambda: nn.ConvTranspose2dConfig([5, 2], [5, 5]).init(),
     "ConvTranspose2d {channels: [5, 2], stride: [1, 1], kernel_size: [5, 5], dilation: [1, 1], groups: 1, padding: [0, 0], padding_out: [0, 0], params: 252}"),
    (lambda: nn.ConvTranspose3dConfig([5, 2], [5, 5, 5]).init(),
     "ConvTranspose3d {channels: [5, 2], stride: [1, 1, 1], kernel_size: [5, 5, 5], dilation: [1, 1, 1], groups: 1, padding: [0, 0, 0], padding_out: [0, 0, 0], params: 1252}"),
    # pooling
    (lambda: nn.MaxPool1dConfig(3).init(), "MaxPool1d {kernel_size: 3, stride: 3, padding: Valid, dilation: 1, ceil_mode: false}"),
    (lambda: nn.MaxPool2dConfig([3, 3]).init(),
     "MaxPool2d {kernel_size: [3, 3], stride: [3, 3], padding: Valid, dilation: [1, 1], ceil_mode: false}"),
    (lambda: nn.AvgPool1dConfig(3).init(), "AvgPool1d {kernel_size: 3, stride: 3, padding: Valid, count_include_pad: true, ceil_mode: false}"),
    (lambda: nn.AvgPool2dConfig([3, 3]).init(),
     "AvgPool2d {kernel_size: [3, 3], stride: [3, 3], padding: Valid, count_include_pad: true, ceil_mode: false}"),
    (lambda: nn.AdaptiveAvgPool1dConfig(3).init(), "AdaptiveAvgPool1d {output_size: 3}"),
    (lambda: nn.AdaptiveAvgPool2dConfig([3, 3]).init(), "AdaptiveAvgPool2d {output_size: [3, 3]}"),
    # interpolation
    (lambda: nn.Interpolate1dConfig(output_size=20).init(), "Interpolate1d {mode: Nearest, output_size: Some(20), scale_factor: None}"),
    (lambda: nn.Interpolate2dConfig(output_size=[20, 20]).init(),
     "Interpolate2d {mode: Nearest, output_size: Some([20, 20]), scale_factor: None}"),
    # recurrent
    (lambda: nn.LstmConfig(2, 3, True).init(), "Lstm {d_input: 2, d_hidden: 3, bias: true, params: 84}"),
    (lambda: nn.BiLstmConfig(2, 3, True).init(), "BiLstm {d_input: 2, d_hidden: 3, bias: true, params: 168}"),
    (lambda: nn.GruConfig(2, 8, True).init(), "Gru {d_input: 2, d_hidden: 8, bias: true, reset_after: true, params: 288}"),
    (lambda: nn.BiGruConfig(2, 8, True).init(), "BiGru {d_input: 2, d_hidden: 8, bias: true, params: 576}"),
    # transformer
    (lambda: nn.MultiHeadAttentionConfig(2, 4).init(),
     "MultiHeadAttention {d_model: 2, n_heads: 4, d_k: 0, dropout: 0.1, min_float: -10000, quiet_softmax: false, params: 24}"),
    (lambda: nn.TransformerEncoderConfig(2, 4, 2, 3).init(),
     "TransformerEncoder {d_model: 2, d_ff: 4, n_heads: 2, n_layers: 3, dropout: 0.1, norm_first: false, quiet_softmax: false, params: 162}"),
    (lambda: nn.PositionWiseFeedForwardConfig(2, 4).init(), "PositionWiseFeedForward {d_model: 2, d_ff: 4, prob: 0.1, params: 22}"),
    (lambda: nn.PositionalEncodingConfig(4).init(), "PositionalEncoding {d_model: 4, max_sequence_size: 5000, max_timescale: 10000}"),
    (lambda: nn.RotaryEncodingConfig(10, 4).init(), "RotaryEncoding {d_model: 4, max_sequence_length: 10}"),
    # losses
    (lambda: nn.CrossEntropyLossConfig(weights=[3.0, 7.0, 0.9], smoothing=0.5).init(),
     "CrossEntropyLoss {pad_tokens: None, weights: Tensor {rank: 1, shape: [3]}, smoothing: 0.5, logits: true}"),
    (lambda: nn.CrossEntropyLossConfig(pad_tokens=[0, 1]).init(),
     "CrossEntropyLoss {pad_tokens: Vec<0..2>, weights: None, smoothing: None, logits: true}"),
    (lambda: nn.BinaryCrossEntropyLossConfig(weights=[3.0, 7.0, 0.9]).init(),
     "BinaryCrossEntropyLoss {weights: Tensor {rank: 1, shape: [3]}, smoothing: None, logits: false}"),
    (lambda: nn.MseLoss(), "MseLoss"),
    (lambda: nn.HuberLossConfig(0.5).init(), "HuberLoss {delta: 0.5, lin_bias: 0.125}"),
    (lambda: nn.KLDivLossConfig(log_target=True).init(), "KLDivLoss {log_target: true}"),
    (lambda: nn.CosineEmbeddingLossConfig(margin=0.5).init(), "CosineEmbeddingLoss {margin: 0.5, reduction: Mean}"),
    (lambda: nn.MarginRankingLossConfig(margin=0.5).init(), "MarginRankingLoss {margin: 0.5}"),
    (lambda: nn.TripletMarginLossConfig(margin=0.5).init(), "TripletMarginLoss {margin: 0.5, p: 2}"),
    (lambda: nn.GaussianNLLLossConfig(eps=0.5).init(), "GaussianNLLLoss {eps: 0.5, full: false}"),
    (lambda: nn.PoissonNllLossConfig().init(), "PoissonNllLoss {log_input: true, full: false, eps: 0.00000001}"),
    (lambda: nn.HingeEmbeddingLossConfig(margin=0.5).init(), "HingeEmbeddingLoss {margin: 0.5}"),
    (lambda: nn.MultiMarginLossConfig(margin=0.5).init(), "MultiMarginLoss {margin: 0.5, p: 1}"),
    (lambda: nn.SoftMarginLoss(), "SoftMarginLoss"),
]


@pytest.mark.parametrize("make,expected", CASES, ids=[c[1].split(" ")[0] + str(i) for i, c in enumerate(CASES)])
def test_display_matches_burn(make, expected):
    assert str(make()) == expected


def test_display_allocates_nothing():
    m = nn.LinearConfig(1000, 1000).init()
    str(m)
    assert m.num_params() == 1_001_000
    assert not m.weight.is_initialized() and not m.bias.is_initialized()
