"""Semantic segmentation over an exported backbone: folder data, decoder, LightningModule, sliding-window
inference, scores and a shapes demo (``python -m vitzoo.segmentation.thin`` writes a thin-structure set)."""

from vitzoo.extras import extra_error

try:
    from .data import SegmentationDataModule, SegmentationFolder
    from .decoder import MLPDecoder
    from .files import Sample, find_samples, pair_samples
    from .inference import sliding_window_probs
    from .labels import LabelMap
    from .model import SegmentationNet, create_backbone
    from .prediction import load_segmenter, predict
    from .module import SegmentationModule
    from .scores import format_scores, segmentation_scores
    from .shapes import SHAPE_CLASSES, ShapesDataModule, make_shapes_dataset
except ImportError as err:  # the core install: one line naming the extra
    raise extra_error("seg", "vitzoo.segmentation", err) from None

__all__ = [
    "SegmentationModule",
    "SegmentationNet",
    "MLPDecoder",
    "create_backbone",
    "SegmentationDataModule",
    "SegmentationFolder",
    "Sample",
    "find_samples",
    "pair_samples",
    "LabelMap",
    "sliding_window_probs",
    "segmentation_scores",
    "format_scores",
    "ShapesDataModule",
    "SHAPE_CLASSES",
    "make_shapes_dataset",
    "predict",
    "load_segmenter",
]
