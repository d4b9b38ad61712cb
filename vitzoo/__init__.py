"""vitzoo: ViT and non-local ResNet backbones whose attention switches by one config word."""

from .attention import list_attentions
from .models import create_model, list_models

__version__ = "0.1.0"
__all__ = ["create_model", "list_models", "list_attentions", "__version__"]
