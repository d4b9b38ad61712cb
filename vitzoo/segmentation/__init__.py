"""Semantic segmentation over an exported backbone: decoder, LightningModule, folder data, shapes demo."""
from .data import SegmentationDataModule, SegmentationFolder
from .decoder import MLPDecoder
from .model import SegmentationNet, create_backbone
from .module import SegmentationModule
from .shapes import SHAPE_CLASSES, ShapesDataModule, make_shapes_dataset

__all__ = ["SegmentationModule", "SegmentationNet", "MLPDecoder", "create_backbone", "SegmentationDataModule",
           "SegmentationFolder", "ShapesDataModule", "SHAPE_CLASSES",
           "make_shapes_dataset"]
