"""The applications' options as dataclasses: the one place their names, types and defaults are written.

The Python APIs take them (``vitzoo.training.fit``, :class:`~vitzoo.training.ImageClassifier`,
``vitzoo.robustness.evaluate``, ``vitzoo.segmentation.predict``), and :func:`register_configs` stores them in
Hydra's ConfigStore as the schemas the YAML groups of configs/ build on (``schema/<name>``), which carry only
what differs from them. This module imports nothing but the standard library (Hydra inside
:func:`register_configs`), so the entry points load it before torch; it also holds the one rule for option
mappings (attention specs, ``data.aug``...): a key the code does not know is a one-line error naming it and the
valid ones, never silently dropped; and the one rule for the defaults of a class's option arguments: an argument
left out (:data:`DEFAULT`) takes its value in the class's options dataclass (:class:`TakesOptions`).
"""

from __future__ import annotations

import numbers
from dataclasses import asdict, dataclass, field, fields
from typing import Any, ClassVar, Collection, Dict, List, Mapping, Optional, Sequence, Tuple, Type, cast

__all__ = [
    "OptimOptions",
    "MixupOptions",
    "ClassifierOptions",
    "CifarAugOptions",
    "ImageDataOptions",
    "DigitsDataOptions",
    "SyntheticDataOptions",
    "StoredDataOptions",
    "CIFARDataOptions",
    "FolderDataOptions",
    "ImageFolderDataOptions",
    "ShardsDataOptions",
    "TransferOptions",
    "SweepOptions",
    "RobustnessOptions",
    "SegmentationOptions",
    "SegmentationDataOptions",
    "ShapesDataOptions",
    "PredictOptions",
    "TrainerTypes",
    "TYPED_GROUPS",
    "type_error",
    "SCHEMAS",
    "register_configs",
    "reject_unknown",
    "is_count",
    "split_spec",
    "DEFAULT",
    "TakesOptions",
    "SHAPE_CLASSES",
]


class _Default:
    """The default of every option argument of a :class:`TakesOptions` class: "left out", which
    :meth:`TakesOptions.resolve` replaces with the value of the class's options dataclass."""

    def __repr__(self) -> str:
        return "DEFAULT"


DEFAULT: Any = _Default()  # typed Any, so that `batch_size: int = DEFAULT` keeps the argument's own type


class TakesOptions:
    """A class (the data modules) whose option arguments default to ``DEFAULT``: an argument left out takes its
    value in ``options``, the dataclass below that its config is built on, so the class built in Python with the
    required arguments alone is the one its config builds, and the values are written in one place."""

    options: ClassVar[Type[Any]]  # the dataclass holding the values of the arguments left out

    @classmethod
    def defaults(cls) -> Dict[str, Any]:
        """Each option's value when the caller leaves it out: the fields of ``cls.options`` (a fresh instance, so a
        mapping or a list is the caller's own)."""
        options = cls.options()
        return {f.name: getattr(options, f.name) for f in fields(options)}

    @classmethod
    def resolve(cls, **arguments: Any) -> Dict[str, Any]:
        """``arguments`` (in their order) with every one left out (``DEFAULT``) at its value in :meth:`defaults`;
        the one rule by which these classes fill their options."""
        defaults = cls.defaults()
        return {name: defaults[name] if value is DEFAULT else value for name, value in arguments.items()}

    def save_options(self) -> None:
        """Lightning's ``save_hyperparameters`` for the calling ``__init__`` of a Lightning subclass: the arguments of
        every constructor up the subclass chain (``**kwargs`` included), each left out (``DEFAULT``) at its value in
        :meth:`defaults`; the one place a ``DEFAULT`` among them is resolved for the record."""
        import inspect

        from lightning.pytorch.core.mixins import HyperparametersMixin
        from lightning.pytorch.utilities.parsing import collect_init_args

        frame = inspect.currentframe()
        arguments: Dict[str, Any] = {}
        if frame is not None and frame.f_back is not None:
            for local in collect_init_args(frame.f_back, [], classes=(HyperparametersMixin,)):
                arguments.update(local)
        cast(Any, self).save_hyperparameters(type(self).resolve(**arguments))


def is_count(value: Any, minimum: int = 1) -> bool:
    """Whether ``value`` is a whole number of at least ``minimum``: an int, or a float such as 3.0 (YAML, CLI);
    not a bool, a string or a list. The one test of every count-like option (sizes, lengths, iterations)."""
    return (
        isinstance(value, numbers.Real)
        and not isinstance(value, bool)
        and float(value).is_integer()
        and float(value) >= minimum
    )


def reject_unknown(owner: str, given: Collection[str], valid: Collection[str]) -> None:
    """Raise ``ValueError`` when ``given`` holds keys outside ``valid``; ``owner`` names what takes the options."""
    unknown = sorted(set(given) - set(valid))
    if unknown:
        raise ValueError(f"{owner} has no option(s) {unknown}; valid options: {sorted(valid)}")


def split_spec(kind: str, spec: Any, names: Sequence[str]) -> Tuple[str, Dict[str, Any]]:
    """(name, options) of a spec, a name or a mapping with a ``name`` and options (a mechanism, a feature map, a
    RoPE); a wrong type or a missing name or one outside ``names`` is a ``ValueError`` naming the valid ones."""
    if isinstance(spec, str):
        name, options = spec, {}
    elif isinstance(spec, Mapping):
        options = dict(spec)
        name = options.pop("name", None)
        if name is None:
            raise ValueError(f"{kind} spec {dict(spec)} has no 'name'; add name: one of {list(names)}")
    else:
        raise ValueError(f"{kind} must be a name or a mapping with a 'name', got {type(spec).__name__}")
    if not isinstance(name, str) or name not in names:
        raise ValueError(f"unknown {kind} {name!r}; choose one of {list(names)}")
    return name, options


@dataclass
class OptimOptions:
    """AdamW with a per-step warmup + cosine schedule (:mod:`vitzoo.training.optim`)."""

    lr: float = 1e-3  # peak LR, reached after warmup; cosine to lr * min_lr_ratio
    weight_decay: float = 0.05  # not applied to biases, norms, pos_embed / cls_token
    betas: List[float] = field(default_factory=lambda: [0.9, 0.999])
    warmup_epochs: float = 1.0
    min_lr_ratio: float = 0.01
    layer_decay: Optional[float] = None  # e.g. 0.75 for layer-wise LR decay (ViT fine-tuning)
    fused: Optional[bool] = None  # torch's fused AdamW kernel (one launch per step; GPU runs); None: torch's default
    lr_base_batch: Optional[int] = None  # lr is the LR at this global batch, scaled linearly to the run's (DeiT)


@dataclass
class MixupOptions:
    """timm's ``Mixup`` arguments; mixing is on when ``mixup_alpha`` or ``cutmix_alpha`` is > 0 (even batches)."""

    mixup_alpha: float = 0.0
    cutmix_alpha: float = 0.0
    cutmix_minmax: Optional[List[float]] = None
    prob: float = 1.0
    switch_prob: float = 0.5
    mode: str = "batch"

    @property
    def active(self) -> bool:
        return self.mixup_alpha > 0 or self.cutmix_alpha > 0


@dataclass
class ClassifierOptions:
    """The training recipe of :class:`~vitzoo.training.ImageClassifier` besides the model (``module`` group)."""

    optim: OptimOptions = field(default_factory=OptimOptions)
    label_smoothing: float = 0.0
    mixup: MixupOptions = field(default_factory=MixupOptions)
    compile: bool = False  # torch.compile the network
    channels_last: bool = False  # NHWC weights and batches (convolutions on tensor-core GPUs); the same numbers


@dataclass
class CifarAugOptions:
    """The cifar recipe's training augmentation and its defaults, the one place they are written
    (:func:`~vitzoo.data.transforms.build_train_transform` and the device path take them from here); ``data.aug``
    holds them over these defaults when ``data.recipe=cifar`` (the deit recipe takes timm's keys there)."""

    policy: str = "basic"  # none | basic (pad-crop, flip) | strong (basic + affine, colour jitter, one cut-out)
    crop_padding: int = 4
    hflip: bool = True
    gauss_noise: float = 0.0  # max std of Gaussian-noise augmentation ([0, 1] pixel units), 0 = off
    gauss_noise_p: float = 0.5


def _cifar_aug(**values: Any) -> Any:
    """The ``aug`` default of a data set that runs the cifar recipe only (no ``recipe`` option): every option of
    :class:`CifarAugOptions` at its default but ``values``, listed so that ``data.aug.<key>=...`` sets one on the
    command line. A data set whose recipe is chosen (``data.recipe``) defaults to ``aug: None``, the chosen recipe's
    defaults, as the keys depend on the recipe (``+data.aug.<key>=...`` adds one)."""
    return field(default_factory=lambda: asdict(CifarAugOptions(**values)))


@dataclass
class ImageDataOptions:
    """The options every image data config sets (``data`` of train.py, configs/data/), read by
    :class:`~vitzoo.data.ImageDataModule`; a data set's dataclass below adds its own and the values it runs with."""

    img_size: Optional[int] = 32  # eval.py: None = each checkpoint's own
    batch_size: int = 128  # per device (per process under DDP)
    eval_batch_size: Optional[int] = None  # None = batch_size
    num_workers: Any = "auto"  # auto = one per usable CPU beyond the main process (0 on one CPU), at most 8
    device_cache: Optional[bool] = None  # decode once, augment batches on the device; None = on for CUDA <= 64 px
    # the chosen recipe's training options over its defaults, None = the defaults (cifar: CifarAugOptions; deit:
    # vitzoo.data.recipes.DEIT_AUG); a key the recipe lacks is a one-line error naming its keys
    aug: Any = None


@dataclass
class DigitsDataOptions(ImageDataOptions):
    """``data=digits``, the embedded default (:class:`~vitzoo.data.DigitsDataModule`)."""

    img_size: Optional[int] = 16
    val_fraction: float = 0.2  # held out, stratified
    split_seed: int = 0
    batch_size: int = 32
    eval_batch_size: Optional[int] = 256
    num_workers: Any = 0  # the whole set is in memory; workers only add start-up time
    aug: Any = _cifar_aug(crop_padding=2, hflip=False)  # digits are not mirrored


@dataclass
class SyntheticDataOptions(ImageDataOptions):
    """``data=synthetic``: noise images with random labels (:class:`~vitzoo.data.SyntheticDataModule`)."""

    num_classes: int = 10
    num_train: int = 1024
    num_val: int = 256
    seed: int = 0
    num_workers: Any = 0
    aug: Any = _cifar_aug(policy="none")


@dataclass
class StoredDataOptions(ImageDataOptions):
    """Data sets read from disk: pinned host memory, larger evaluation batches."""

    eval_batch_size: Optional[int] = 512
    pin_memory: bool = True


@dataclass
class CIFARDataOptions(StoredDataOptions):
    """``data=cifar10`` and ``data=cifar100`` (:class:`~vitzoo.data.CIFAR10DataModule`; val = the test set)."""

    download: bool = True
    aug: Any = _cifar_aug()


@dataclass
class FolderDataOptions(StoredDataOptions):
    """Image files of any size: ImageNet statistics, a transform recipe (deit: timm's, with its evaluation crop),
    optionally each image at its own size."""

    mean: Tuple[float, float, float] = (0.485, 0.456, 0.406)
    std: Tuple[float, float, float] = (0.229, 0.224, 0.225)
    recipe: str = "cifar"  # cifar (albumentations, data.aug) | deit (timm's ImageNet transforms, docs/imagenet.md)
    native_resolution: bool = False  # each image keeps its size and aspect (longer side <= img_size), a batch is a list
    native_multiple: int = 16  # native_resolution: sides cut to multiples of this (the model's patch size)
    crop_pct: Optional[float] = None  # deit eval: resize to img_size / crop_pct, center crop; None = pretrained_cfg
    interpolation: Optional[str] = None  # deit: None = the model's pretrained_cfg
    repeated_aug: int = 1  # each training image this many times per epoch, over the DDP ranks (DeiT: 3)
    aug: Any = None  # the chosen recipe's defaults, whichever it is; +data.aug.<key>=... sets one of its options


@dataclass
class ImageFolderDataOptions(FolderDataOptions):
    """``data=imagefolder``: root/train/<class>/* (:class:`~vitzoo.data.ImageFolderDataModule`)."""

    val_fraction: float = 0.1  # used only when root/val does not exist
    split_seed: int = 0


@dataclass
class ShardsDataOptions(FolderDataOptions):
    """``data=shards``: the litdata shards ``python -m vitzoo.data.pack`` writes
    (:class:`~vitzoo.data.shards.ShardsDataModule`)."""

    num_classes: Optional[int] = None  # None = from root/vitzoo.json (local roots); give it for a URL
    cache_dir: Optional[str] = None  # where litdata keeps the chunks of a remote root (None = litdata's default)
    img_size: Optional[int] = 224
    recipe: str = "deit"
    eval_batch_size: Optional[int] = 256


@dataclass
class TransferOptions:
    """Attention transfer (:class:`~vitzoo.training.transfer.AttentionTransfer`, ``experiment=transfer``)."""

    stage: int = 1  # 1: the attention layers learn the teacher's outputs (no labels) | 2: fine-tune on the labels
    qk: str = "train"  # stage 1: train | freeze the q/k maps (freeze: only the mechanism's own parameters learn)
    attention_ce: float = 0.0  # stage 1: weight of the cross-entropy between attention rows (Hedgehog's); 0 = MSE
    student: Optional[str] = None  # stage 2: the stage-1 checkpoint; None = student and teacher from init_from
    distill: float = 0.0  # stage 2: weight of KL(teacher || student) on the logits; 0 = the labels only
    temperature: float = 1.0  # stage 2: the distillation's softmax temperature


@dataclass
class SweepOptions:
    """What a robustness sweep measures (:class:`~vitzoo.robustness.Sweep` checks the values); empty: clean only."""

    corruptions: List[str] = field(default_factory=list)  # input corruptions (vitzoo.robustness.list_corruptions())
    severities: List[int] = field(default_factory=lambda: [1, 2, 3, 4, 5])
    protocol: Optional[str] = None  # cifar | imagenet (CIFAR-10-C / ImageNet-C strengths); None = cifar up to 64 px
    logit_noise: List[float] = field(default_factory=list)  # sigma of Gaussian noise on every attention layer's logits
    resolutions: List[float] = field(default_factory=list)  # input sizes as factors of the training size
    adversarial: List[float] = field(default_factory=list)  # PGD L-inf radii in grey levels of 255, e.g. [1,2,4,8]
    attack: str = "pgd"  # pgd (PGD-10 and FGSM at each radius) | autoattack (adds AutoAttack's standard set)
    seed: int = 0  # corruption and logit-noise draws


@dataclass
class RobustnessOptions(SweepOptions):
    """A sweep and how it runs: where the corrupted images come from and what is written (``robustness`` group)."""

    source: str = "computed"  # computed (corrupt the val split) | files (the released -C files under root)
    root: Optional[str] = None  # with source=files: CIFAR-10-C / CIFAR-100-C (<corruption>.npy) or ImageNet-C
    max_images: Optional[int] = None  # the first N val images (None = all)
    baseline: Optional[str] = None  # eval.py: a checkpoint label or path, adds mCE and relative mCE against it
    plots: bool = True  # corruptions.png, logit_noise.png, resolution.png
    tensorboard: bool = True  # scalars under <out dir>/tensorboard/<checkpoint>
    progress: bool = False  # a Rich progress bar over the whole sweep


@dataclass
class SegmentationOptions:
    """:class:`~vitzoo.segmentation.SegmentationModule`'s options besides its backbone, classes and the data's own
    (``module`` of ``--config-name segment``)."""

    attention: Any = None  # only for an arch trained from scratch; an export fixes its own attention
    model_kwargs: Any = None  # a mapping of timm kwargs for an arch from scratch
    out_indices: Optional[List[int]] = None  # feature levels; None = the backbone's own (4 blocks over a ViT's depth)
    neck: Optional[str] = None  # simple_fpn: ViTDet's pyramid (strides patch/4 .. 2 x patch) from a plain ViT's map
    decoder: str = "mlp"  # mlp: SegFormer's all-MLP head | unet: smp's U-Net decoder, for pyramids | unet+stem
    decoder_channels: int = 128  # the mlp decoder's and simple_fpn's
    loss: str = "ce"  # ce | dice | focal | lovasz | ce+dice (dice, focal, lovasz: segmentation_models_pytorch's)
    class_weights: Any = None  # balanced (inverse pixel frequency of the training masks) | [w_0, w_1, ...] | None
    dropout: float = 0.1
    lr: float = 1e-3  # decoder LR; the backbone gets lr * backbone_lr_ratio
    backbone_lr_ratio: float = 0.1
    weight_decay: float = 0.01
    warmup_epochs: float = 1.0
    min_lr_ratio: float = 0.01
    overlap: float = 0.25  # of a validation / predict window, averaged where windows meet
    flip: bool = False  # add the horizontally flipped view (2x the cost)


@dataclass
class SegmentationDataOptions:
    """:class:`~vitzoo.segmentation.SegmentationDataModule`'s options besides its root and class count (``data`` of
    ``--config-name segment``)."""

    class_names: Optional[List[str]] = None  # one per class index, e.g. [interior,membrane]; None = class_<c>
    images: Optional[str] = None  # folder, file (TIFF stack) or glob under root; None = images/ image/ imgs/ img/
    masks: Optional[str] = None  # likewise; None = the one of masks/ mask/ labels/ label/ annotations/ gt/
    mask_suffix: str = ""  # mask stem = image stem + this (e.g. _mask)
    unpaired: str = "error"  # files without a partner: error | skip (logged)
    mask_values: Any = None  # a mapping: raw mask value -> class, e.g. {0: 1, 255: 0} (0 marks the object)
    binary_threshold: Optional[float] = None  # or: class 1 where the mask value >= this (JPEG masks); 2 classes
    ignore_index: int = 255  # mask value (after mask_values) of unlabeled pixels
    in_chans: int = 3  # 3: grayscale replicated, RGB statistics; 1: the backbone's first conv summed over RGB
    img_size: Any = 256  # train crop and validation window; a multiple of the patch size (ViT) or 32 (ResNet)
    rescale: Tuple[float, float] = (0.75, 1.5)  # random rescale range before the crop (validation: native size)
    repeats: int = 1  # passes over the training images per epoch (raise it for a short data set)
    batch_size: int = 8
    num_workers: Any = "auto"  # auto = usable CPUs - 1 (at most 8)
    val_fraction: float = 0.2  # without root/train + root/val: round(this * images) held out
    seed: int = 0


SHAPE_CLASSES = ("background", "rectangle", "ellipse", "triangle")  # the shapes set's classes, by mask value


@dataclass
class ShapesDataOptions(SegmentationDataOptions):
    """The generated shapes set's (:class:`~vitzoo.segmentation.ShapesDataModule`, ``--config-name
    segment_shapes``), written to its root on first use, and the values it runs with."""

    num_images: int = 200
    num_classes: int = len(SHAPE_CLASSES)  # the set's own; another value is an error
    class_names: Optional[List[str]] = field(default_factory=lambda: list(SHAPE_CLASSES))
    img_size: Any = 64
    rescale: Tuple[float, float] = (1.0, 1.0)  # the shapes fill the images; validation windows see them at this scale
    batch_size: int = 16
    num_workers: Any = 0


@dataclass
class PredictOptions:
    """How :func:`~vitzoo.segmentation.predict` segments; None takes the checkpoint's own value."""

    masks: Optional[str] = None  # true masks (folder, file or glob, paired by stem): score the predictions
    window: Any = None  # sliding-window size (int or [h, w]); None = the training crop (module.window)
    overlap: Optional[float] = None  # of a window (module.overlap)
    flip: Optional[bool] = None  # add the horizontally flipped view (module.flip)
    probs: bool = False  # also write <name>_probs.npy (float16, classes x H x W)
    batch_size: int = 8  # windows per forward pass
    device: str = "auto"  # auto | cpu | cuda | cuda:1


@dataclass
class TrainerTypes:
    """The types of the Lightning ``Trainer`` arguments configs/trainer/ sets, without values: the YAML holds them
    and takes any other Trainer argument (``+trainer.<name>=...``), so this is no schema; train.py checks the
    arguments named here before Lightning loads (:func:`type_error`)."""

    accelerator: str
    devices: Any  # an int, a list of device ids or "auto"
    num_nodes: int
    max_epochs: Optional[int]
    max_steps: int
    precision: str
    gradient_clip_val: Optional[float]
    check_val_every_n_epoch: Optional[int]
    log_every_n_steps: int
    deterministic: Any  # a bool or "warn"
    benchmark: Optional[bool]
    enable_model_summary: bool
    enable_progress_bar: bool
    accumulate_grad_batches: int
    sync_batchnorm: bool


TYPED_GROUPS = {"trainer": TrainerTypes}  # the groups without a schema whose values type_error checks


def type_error(cfg: Any) -> Optional[str]:
    """The first value of a :data:`TYPED_GROUPS` group in the composed ``cfg`` that its type refuses, as one line
    naming the key and the type; None when all fit."""
    from omegaconf import OmegaConf, ValidationError

    for group, types in TYPED_GROUPS.items():
        node = cfg.get(group)
        if node is None:
            continue
        typed = OmegaConf.structured(types)
        for f in fields(types):
            if f.name not in node:
                continue
            try:
                typed[f.name] = node[f.name]
            except ValidationError as err:
                expected = str(f.type).replace("Optional[", "").rstrip("]")
                return (
                    f"{group}.{f.name}={node[f.name]!r} is not a valid {f.type} "
                    f"({str(err.msg).splitlines()[0]}); pass {group}.{f.name}=<{expected}>"
                    + (" or null" if "Optional" in str(f.type) else "")
                )
    return None


SCHEMAS = {  # the schemas configs/ names (optim and mixup are inside module)
    "module": ClassifierOptions,
    "digits_data": DigitsDataOptions,
    "synthetic_data": SyntheticDataOptions,
    "cifar_data": CIFARDataOptions,
    "imagefolder_data": ImageFolderDataOptions,
    "shards_data": ShardsDataOptions,
    "transfer": TransferOptions,
    "robustness": RobustnessOptions,
    "segmentation": SegmentationOptions,
    "segmentation_data": SegmentationDataOptions,
    "shapes_data": ShapesDataOptions,
    "predict": PredictOptions,
}


def register_configs() -> None:
    """Store every schema of :data:`SCHEMAS` in Hydra's ConfigStore as ``schema/<name>``, which configs/ names
    in its defaults lists (``- /schema/module@_here_``); train.py, eval.py and predict.py call it first."""
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    for name, schema in SCHEMAS.items():
        store.store(group="schema", name=name, node=schema)
