"""The model card of an export (its README.md, Hugging Face's layout), written from its config.json alone."""

from __future__ import annotations

import json
from typing import Any, Dict, Mapping

from vitzoo.models.default_cfg import LICENSE  # the repository's LICENSE, declared by every export
from vitzoo.models.registry import short_name

__all__ = ["model_card", "render_card", "LICENSE"]


def _mechanism(spec: Any) -> str:
    if spec is None:
        return "softmax"
    if isinstance(spec, str):
        return spec
    if isinstance(spec, list):
        return "hybrid: " + ", ".join(_mechanism(s) for s in spec)
    options = {k: v for k, v in spec.items() if k not in ("name", "train_tokens")}
    return spec.get("name", "softmax") + (f" ({json.dumps(options, sort_keys=True)})" if options else "")


def model_card(config: Mapping[str, Any], name: str) -> Dict[str, Any]:
    """The card of the export whose config.json is ``config``, in timm's ``model_card`` layout (``push_to_hf_hub``
    renders the same dict): architecture, mechanism, data, the run's metrics, how to load it."""
    arch, args = config["architecture"], config.get("model_args") or {}
    pre, run = config.get("pretrained_cfg") or {}, (config.get("vitzoo") or {})
    details: Dict[str, Any] = {
        "Architecture": f"{arch} ({', '.join(f'{k}={v}' for k, v in sorted(args.items()) if k != 'attention')})",
        "Attention mechanism": _mechanism(args.get("attention")),
        "Classes": config.get("num_classes", 0) or "none (a backbone: no classifier head)",
        "Input": f"{pre.get('input_size')}, mean {pre.get('mean')}, std {pre.get('std')}",
    }
    if run.get("data"):
        details["Dataset"] = run["data"]
    if run.get("metrics"):
        details["Metrics (the run's last validation)"] = run["metrics"]
    usage = (
        f"```python\nimport timm, vitzoo  # importing vitzoo registers its architectures with timm\n"
        f"model = timm.create_model('hf-hub:<user>/{name}', pretrained=True)  # or 'local-dir:<this folder>'\n"
        f"model = vitzoo.export.load_exported('<this folder>')  # the same, with the export's checks\n```\n"
    )
    if short_name(arch).startswith("vit_") and _mechanism(args.get("attention")) == "softmax":
        usage += (
            "Its attention is timm's (split-head softmax, weights under timm's `attn.qkv` names): plain timm "
            "loads the weights into `timm.models.VisionTransformer` of the same shape without vitzoo.\n"
        )
    return {
        "tags": ["image-classification", "timm", "vitzoo"],
        "library_name": "timm",
        "license": LICENSE,
        "description": f"A {arch} with {_mechanism(args.get('attention'))} attention, exported by vitzoo "
        f"{run.get('version', '')}.".replace("  ", " "),
        "details": details,
        "usage": usage,
    }


def render_card(card: Mapping[str, Any], name: str) -> str:
    """``card`` as README.md: YAML front matter (tags, library, licence, datasets) and the sections."""
    lines = [
        "---",
        "tags:",
        *(f"- {t}" for t in card["tags"]),
        "pipeline_tag: image-classification",
        f"library_name: {card['library_name']}",
        f"license: {card['license']}",
    ]
    if "Dataset" in card["details"]:
        lines += ["datasets:", f"- {str(card['details']['Dataset']).lower()}"]
    lines += ["---", f"# Model card for {name}", "", card["description"], "", "## Model Details"]
    for key, value in card["details"].items():
        if isinstance(value, Mapping):
            lines += [f"- **{key}:**", *(f"  - {k}: {v}" for k, v in value.items())]
        else:
            lines.append(f"- **{key}:** {value}")
    return "\n".join([*lines, "", "## Model Usage", card["usage"]])
