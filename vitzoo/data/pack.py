"""``python -m vitzoo.data.pack SRC DST``: a labelled image tree -> litdata streaming shards that ``data=shards`` reads.

SRC is a folder or a .tar / .tar.gz / .tgz archive holding ``train/<class>/*`` (and optionally ``val/<class>/*``;
without it ``--val-fraction`` of train is held out, stratified, as ``data=imagefolder`` does) or ``<class>/*``
alone. Each split goes to ``DST/<split>/`` as litdata chunks of ``{"image": the file's bytes, "label": int}`` in a
seeded random order (litdata shuffles chunks and items near each other: a class-sorted pack would give class-sorted
batches); ``DST/vitzoo.json`` names the classes. The files are stored as they are (no re-encoding) and decoded in the
loader workers. An archive is read into memory: extract an ImageNet-size one and pass the folder.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import sys
import tarfile
from pathlib import Path
from typing import Dict, List, Sequence, Tuple, Union

import numpy as np
from PIL import Image, UnidentifiedImageError

from .imagefolder import IMAGE_EXTENSIONS

__all__ = ["pack", "read_source", "META_NAME"]

META_NAME = "vitzoo.json"
LAYOUT = "train/<class>/* (+ val/<class>/*) or <class>/*"
Entry = Tuple[Union[str, bytes], int]  # a file path or the file's bytes, and its label


def _files(src: Path) -> Dict[str, Union[str, bytes]]:
    """Image files under ``src`` (a folder or an archive): relative path -> path on disk, or bytes from an archive."""
    if src.is_dir():
        return {
            os.path.relpath(os.path.join(d, f), src).replace(os.sep, "/"): os.path.join(d, f)
            for d, _, names in os.walk(src)
            for f in names
            if f.lower().endswith(IMAGE_EXTENSIONS)
        }
    if not tarfile.is_tarfile(src):
        raise ValueError(
            f"{src} is neither a folder nor a tar archive; pass a folder or a .tar/.tar.gz holding {LAYOUT}"
        )
    with tarfile.open(src) as archive:
        return {
            m.name.lstrip("./"): archive.extractfile(m).read()
            for m in archive
            if m.isfile() and m.name.lower().endswith(IMAGE_EXTENSIONS)
        }


def read_source(
    src: Union[str, os.PathLike], val_fraction: float = 0.1, split_seed: int = 0
) -> Tuple[List[str], Dict[str, List[Entry]]]:
    """(classes, {"train": entries, "val": entries}) of ``src``; each problem is one ValueError naming the fix."""
    src = Path(os.path.expanduser(os.fspath(src)))
    if not src.exists():
        raise ValueError(f"{src} does not exist; pass a folder or archive holding {LAYOUT}")
    files = _files(src)
    splits: Dict[str, Dict[str, List[str]]] = {}
    for rel in sorted(files):
        parts = rel.split("/")
        split, parts = (parts[0], parts[1:]) if parts[0] in ("train", "val") and len(parts) == 3 else ("train", parts)
        if len(parts) != 2:
            raise ValueError(f"{src}: {rel} is not in a class folder; pack a tree laid out as {LAYOUT}")
        splits.setdefault(split, {}).setdefault(parts[0], []).append(rel)
    if "train" not in splits:
        raise ValueError(
            f"{src} holds no images ({', '.join(IMAGE_EXTENSIONS)}) in class folders; pack a tree laid out as {LAYOUT}"
        )
    classes = sorted(splits["train"])
    if len(classes) < 2:
        raise ValueError(f"{src} has {len(classes)} class folder(s); an image classifier needs 2 or more")
    extra = sorted(set(splits.get("val", {})) - set(classes))
    if extra:
        raise ValueError(f"{src}: val/ has classes {extra} that train/ lacks; make both trees use the same classes")
    entries = {
        split: [(files[rel], classes.index(name)) for name, rels in sorted(found.items()) for rel in rels]
        for split, found in splits.items()
    }
    for split in entries.values():
        for data, _ in split:
            _check_image(data)
    if "val" not in entries:
        entries["train"], entries["val"] = _hold_out(entries["train"], len(classes), val_fraction, split_seed, src)
    return classes, entries


def _hold_out(entries: List[Entry], num_classes: int, fraction: float, seed: int, src: Path):
    """A stratified ``fraction`` of ``entries`` as val (the rest train), as ``data=imagefolder`` holds one out."""
    from sklearn.model_selection import train_test_split

    n_val = math.ceil(fraction * len(entries)) if 0 < fraction < 1 else 0
    if not num_classes <= n_val <= len(entries) - num_classes:
        raise ValueError(
            f"{src} has no val/ and --val-fraction {fraction} of its {len(entries)} images cannot hold "
            f"out one image per class ({num_classes}) on each side; change --val-fraction or add val/"
        )
    train, val = train_test_split(
        entries, test_size=fraction, stratify=[label for _, label in entries], random_state=seed
    )
    return train, val


def _check_image(data: Union[str, bytes]) -> None:
    """The file's header names a format PIL decodes (the whole image is decoded only in the loader workers)."""
    try:
        with Image.open(data if isinstance(data, str) else io.BytesIO(data)):
            pass
    except (UnidentifiedImageError, OSError) as err:
        where = data if isinstance(data, str) else "a file in the archive"
        raise ValueError(
            f"cannot read image {where} ({type(err).__name__}); remove it or convert it to JPEG/PNG and pack again"
        ) from None


class _Item:
    """litdata's per-input function: entry number -> the stored sample."""

    def __init__(self, entries: Sequence[Entry]):
        self.entries = entries

    def __call__(self, i: int) -> dict:
        data, label = self.entries[i]
        return {"image": Path(data).read_bytes() if isinstance(data, str) else data, "label": int(label)}


def pack(
    src: Union[str, os.PathLike],
    dst: Union[str, os.PathLike],
    *,
    val_fraction: float = 0.1,
    split_seed: int = 0,
    chunk_bytes: str = "64MB",
    workers: int = 1,
    seed: int = 0,
) -> Dict[str, int]:
    """Pack ``src`` into ``dst`` (see the module docstring); returns the number of images per split."""
    from litdata import optimize

    dst = Path(os.path.expanduser(os.fspath(dst)))
    if dst.exists() and any(dst.iterdir()):
        raise ValueError(f"{dst} is not empty; pass a new or empty folder")
    classes, entries = read_source(src, val_fraction, split_seed)
    rng = np.random.default_rng(seed)
    for split, items in entries.items():
        order = rng.permutation(len(items))
        optimize(
            fn=_Item([items[i] for i in order]),
            inputs=list(range(len(items))),
            output_dir=str(dst / split),
            chunk_bytes=chunk_bytes,
            num_workers=workers,
            mode="overwrite",
            start_method="fork",
            verbose=False,
        )
    counts = {split: len(items) for split, items in entries.items()}
    (dst / META_NAME).write_text(
        json.dumps({"format": "litdata", "classes": classes, "splits": counts, "source": os.fspath(src)}, indent=1)
    )
    return counts


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vitzoo.data.pack", description=__doc__.split("\n\n")[0])
    parser.add_argument("src", help=f"a folder or .tar/.tar.gz archive laid out as {LAYOUT}")
    parser.add_argument("dst", help="the shards folder to write (new or empty); train with data=shards data.root=DST")
    parser.add_argument("--val-fraction", type=float, default=0.1, help="held out of train when SRC has no val/")
    parser.add_argument("--split-seed", type=int, default=0, help="the held-out split's seed")
    parser.add_argument("--chunk-bytes", default="64MB", help="litdata chunk size (default 64MB)")
    parser.add_argument("--workers", type=int, default=1, help="packing processes (default 1)")
    args = parser.parse_args(argv)
    try:
        counts = pack(
            args.src,
            args.dst,
            val_fraction=args.val_fraction,
            split_seed=args.split_seed,
            chunk_bytes=args.chunk_bytes,
            workers=args.workers,
        )
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"packed {args.src} -> {args.dst}: " + ", ".join(f"{n} {split} images" for split, n in counts.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
