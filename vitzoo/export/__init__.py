"""Export trained backbones in timm's hub layout for downstream dense prediction.

``python -m vitzoo.export CKPT OUT [--no-head]`` writes ``OUT/model.safetensors`` + ``OUT/config.json``;
after ``import vitzoo``, ``timm.create_model('local-dir:OUT', pretrained=True)`` rebuilds the model.
"""

from .checkpoint import export_checkpoint
from .hub import CARD_NAME, CONFIG_NAME, WEIGHTS_NAME, check_export, export_model, load_exported, push_to_hub

__all__ = [
    "export_checkpoint",
    "export_model",
    "load_exported",
    "push_to_hub",
    "check_export",
    "ExportBestCallback",
    "WEIGHTS_NAME",
    "CONFIG_NAME",
    "CARD_NAME",
]


def __getattr__(name):
    # The callback imports Lightning; `import vitzoo.export` (load_exported) stays light without it.
    if name == "ExportBestCallback":
        from .callback import ExportBestCallback

        return ExportBestCallback
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
