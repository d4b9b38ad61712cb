"""How tokens attend: mechanisms behind one contract (``ZooAttention``) and a name registry.

A mechanism is one file whose class registers itself (``@register_attention``) when the file is imported;
every module of this package is imported below (tests/test_imports.py checks that none is missing), so
adding one is its file, its import line here and its preset in configs/model/.
"""

from . import functional
from .agent import AgentAttention
from .base import HEAD_MODES, HeadProjection, ZooAttention
from .canvas import on_canvas, tables_on_canvas
from .decoupled import DecoupledRopeAttention
from .efficient import EfficientAttention
from .feature_maps import FeatureMap, build_feature_map, list_feature_maps, register_feature_map
from .focused_linear import FocusedLinearAttention
from .gated import LinearGatedAttention
from .grid import GridBoundAttention
from .grid_conv import GridDepthwiseConv
from .hedgehog import HedgehogFeatureMap
from .hydra import HydraAttention
from .inline import InLineAttention
from .linear import LinearAttention
from .linformer import LinformerAttention
from .lion import LionAttention
from .mlla import MllaAttention
from .nystrom import NystromAttention
from .performer import PerformerAttention, PerformerFeatureMap
from .pola import PolaAttention
from .rala import RalaAttention
from .reduction import SpatialReduction
from .ravlt_softmax import RavltSoftmaxAttention
from .registry import (
    AttentionSpec,
    attention_layer,
    attention_options,
    build_attention,
    list_attentions,
    register_attention,
    resolve_attention,
)
from .rope import ROPE_NAMES, Rope, build_rope
from .softmax import SoftmaxAttention
from .stack import block_specs, describe, is_stack
from .synthesizer import (
    SynthDenseAttention,
    SynthesizerAttention,
    SynthFactorizedDenseAttention,
    SynthFactorizedRandomAttention,
    SynthMixAttention,
    SynthRandomAttention,
)
from .window import WindowAttention
from .windowed import Windows, window_layout

__all__ = [
    "functional",
    "AttentionSpec",
    "ZooAttention",
    "HeadProjection",
    "HEAD_MODES",
    "register_attention",
    "list_attentions",
    "resolve_attention",
    "attention_options",
    "build_attention",
    "attention_layer",
    "FeatureMap",
    "register_feature_map",
    "list_feature_maps",
    "build_feature_map",
    "HedgehogFeatureMap",
    "PerformerFeatureMap",
    "GridBoundAttention",
    "GridDepthwiseConv",
    "DecoupledRopeAttention",
    "LinearGatedAttention",
    "Rope",
    "ROPE_NAMES",
    "build_rope",
    "on_canvas",
    "tables_on_canvas",
    "SynthesizerAttention",
    "is_stack",
    "block_specs",
    "describe",
    # the registered mechanisms
    "AgentAttention",
    "EfficientAttention",
    "FocusedLinearAttention",
    "HydraAttention",
    "InLineAttention",
    "LinearAttention",
    "LinformerAttention",
    "LionAttention",
    "MllaAttention",
    "NystromAttention",
    "PerformerAttention",
    "PolaAttention",
    "RalaAttention",
    "RavltSoftmaxAttention",
    "SoftmaxAttention",
    "SynthDenseAttention",
    "SynthFactorizedDenseAttention",
    "SynthFactorizedRandomAttention",
    "SynthMixAttention",
    "SynthRandomAttention",
    "WindowAttention",
    "Windows",
    "window_layout",
    "SpatialReduction",
]
