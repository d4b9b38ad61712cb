"""How tokens attend: mechanisms behind one contract (``ZooAttention``) and a name registry."""
from . import functional
from .base import HEAD_MODES, HeadProjection, ZooAttention
from .registry import (AttentionSpec, attention_layer, attention_options, build_attention, list_attentions, register_attention,
                       resolve_attention)
from .softmax import SoftmaxAttention
from .linear import LinearAttention
from .efficient import EfficientAttention
from .synthesizer import (SynthDenseAttention, SynthFactorizedDenseAttention, SynthFactorizedRandomAttention, SynthMixAttention,
                          SynthRandomAttention, SynthesizerAttention)

__all__ = [
    "functional", "AttentionSpec", "ZooAttention", "HeadProjection", "HEAD_MODES", "register_attention", "list_attentions",
    "resolve_attention", "attention_options", "build_attention", "attention_layer",
    "SoftmaxAttention", "LinearAttention", "EfficientAttention",
    "SynthesizerAttention", "SynthDenseAttention", "SynthRandomAttention", "SynthFactorizedDenseAttention",
    "SynthFactorizedRandomAttention", "SynthMixAttention",
]
