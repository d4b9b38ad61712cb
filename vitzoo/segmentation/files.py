"""Finding (image, mask) pairs on disk: folder names or globs, stems matched across extensions, TIFF stacks.

A ``Sample`` is one 2-D image: a file, or one page of a multi-page TIFF (``frame``). Images and masks pair
by file stem (``a.tif`` with ``a.png``; ``mask_suffix`` strips e.g. ``_mask`` from mask stems), or, when
each side is a single stack file (``train-volume.tif`` + ``train-labels.tif``), page by page.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Union

from PIL import Image

from vitzoo.data.imagefolder import IMAGE_EXTENSIONS

__all__ = [
    "IMAGE_DIRS",
    "MASK_DIRS",
    "Sample",
    "list_images",
    "expand_pages",
    "mask_stem",
    "find_samples",
    "pair_samples",
]

log = logging.getLogger(__name__)

IMAGE_DIRS = ("images", "image", "imgs", "img")
MASK_DIRS = ("masks", "mask", "labels", "label", "annotations", "gt")
UNPAIRED = ("error", "skip")


@dataclass(frozen=True)
class Sample:
    """One image (``frame``: its page in a TIFF stack, else None) and its mask (None when predicting)."""

    image: Path
    mask: Optional[Path] = None
    frame: Optional[int] = None

    @property
    def name(self) -> str:
        """The image's stem, with ``_<page>`` for a stack page: the name of its predicted mask."""
        return self.image.stem if self.frame is None else f"{self.image.stem}_{self.frame:04d}"


def _frames(path: Path) -> int:
    if path.suffix.lower() not in (".tif", ".tiff"):
        return 1
    with Image.open(path) as image:
        return getattr(image, "n_frames", 1)


def list_images(spec: Union[str, Path], root: Optional[Path] = None) -> List[Path]:
    """Image files named by ``spec``: a folder (its images, not recursive), a file, or a glob (``img/*.jpg``);
    relative to ``root`` when given."""
    spec_path = Path(spec).expanduser()
    path = spec_path if root is None or spec_path.is_absolute() else root / spec_path
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix.lower() in IMAGE_EXTENSIONS)
    elif path.is_file():
        files = [path]
    elif any(c in str(spec) for c in "*?["):
        anchor = Path(path.anchor or ".")
        files = sorted(p for p in anchor.glob(str(path.relative_to(path.anchor))) if p.is_file())
    else:
        raise FileNotFoundError(f"{path} does not exist; pass a folder, a file or a glob such as 'images/*.png'")
    odd = [p.name for p in files if p.suffix.lower() not in IMAGE_EXTENSIONS]
    if odd:
        raise ValueError(
            f"{odd[0]} is not an image ({', '.join(IMAGE_EXTENSIONS)}); name image files only, e.g. "
            f"with a glob such as '*.png'"
        )
    if not files:
        raise FileNotFoundError(f"{path} holds no images ({', '.join(IMAGE_EXTENSIONS)})")
    return files


def mask_stem(path: Path, suffix: str = "") -> str:
    """The image stem a mask file pairs with: its stem without ``suffix``."""
    return path.stem[: -len(suffix)] if suffix and path.stem.endswith(suffix) else path.stem


def _by_stem(files: Sequence[Path], suffix: str, what: str) -> Dict[str, Path]:
    stems: Dict[str, Path] = {}
    for f in files:
        stem = mask_stem(f, suffix)
        if stem in stems:
            raise ValueError(
                f"{stems[stem].name} and {f.name} are both {what} for '{stem}'; keep one of them "
                f"or point the option at one extension with a glob (e.g. '*.png')"
            )
        stems[stem] = f
    return stems


def expand_pages(image: Path, mask: Optional[Path]) -> List[Sample]:
    """One sample per page; the mask stack must have as many pages as the image stack."""
    pages = _frames(image)
    if mask is not None and _frames(mask) != pages:
        raise ValueError(
            f"{image.name} has {pages} page(s) but its mask {mask.name} has {_frames(mask)}; "
            f"a TIFF stack needs one mask page per image page"
        )
    if pages == 1:
        return [Sample(image, mask)]
    return [Sample(image, mask, frame) for frame in range(pages)]


def pair_samples(
    images: Sequence[Path], masks: Sequence[Path], mask_suffix: str = "", unpaired: str = "error"
) -> List[Sample]:
    """Pair images with masks (by stem, or page by page for two stack files). Files without a partner are an
    error naming them, or with ``unpaired='skip'`` a logged warning."""
    if unpaired not in UNPAIRED:
        raise ValueError(f"unpaired={unpaired!r}; use one of {UNPAIRED}")
    if len(images) == 1 and len(masks) == 1 and _frames(images[0]) > 1:
        return expand_pages(images[0], masks[0])
    image_stems, mask_stems = _by_stem(images, "", "images"), _by_stem(masks, mask_suffix, "masks")
    lonely_images = sorted(image_stems[s].name for s in image_stems.keys() - mask_stems.keys())
    lonely_masks = sorted(mask_stems[s].name for s in mask_stems.keys() - image_stems.keys())
    if lonely_images or lonely_masks:
        parts = [
            f"{len(found)} {what} without {other} ({', '.join(found[:3])}{', ...' if len(found) > 3 else ''})"
            for found, what, other in ((lonely_images, "images", "a mask"), (lonely_masks, "masks", "an image"))
            if found
        ]
        message = f"{'; '.join(parts)}, matched by file stem"
        if unpaired == "error":
            hint = " (set data.mask_suffix=_mask if mask names add a suffix such as _mask)" if not mask_suffix else ""
            raise FileNotFoundError(
                f"{message}; add the partners, remove the extra files{hint}, or set "
                f"data.unpaired=skip to use only the pairs"
            )
        log.warning("skipping %s (data.unpaired=skip)", message)
    common = sorted(image_stems.keys() & mask_stems.keys())
    if not common:
        raise FileNotFoundError(
            "no image has a mask with the same file stem; check data.images / data.masks (and data.mask_suffix)"
        )
    return [s for stem in common for s in expand_pages(image_stems[stem], mask_stems[stem])]


def _pick_dir(root: Path, names: Sequence[str], what: str, option: str) -> str:
    found = [n for n in names if (root / n).is_dir()]
    if len(found) != 1:
        state = "none of" if not found else "several of"
        raise FileNotFoundError(
            f"{root} has {state} the usual {what} folders ({', '.join(names)}); "
            f"name the one to use with data.{option}=<folder or glob>"
        )
    return found[0]


def find_samples(
    root: Union[str, Path],
    images: Optional[str] = None,
    masks: Optional[str] = None,
    mask_suffix: str = "",
    unpaired: str = "error",
) -> List[Sample]:
    """The (image, mask) samples under ``root``; ``images`` / ``masks`` default to the one folder present
    among ``IMAGE_DIRS`` / ``MASK_DIRS``."""
    root = Path(root).expanduser()
    if not root.is_dir():
        raise FileNotFoundError(
            f"data.root={str(root)!r} is not a folder; point it at the folder holding the images and masks"
        )
    image_files = list_images(images if images is not None else _pick_dir(root, IMAGE_DIRS, "image", "images"), root)
    mask_files = list_images(masks if masks is not None else _pick_dir(root, MASK_DIRS, "mask", "masks"), root)
    return pair_samples(image_files, mask_files, mask_suffix, unpaired)
