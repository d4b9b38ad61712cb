"""Parameters and FLOPs of the pyramid presets beside the official models' and the papers' (docs/pyramids.md).

    python benchmarks/pyramid_counts.py            # the table, markdown
    python benchmarks/pyramid_counts.py pvt_tiny   # some rows

Counted as the official models were (docs/pyramids.md): ``sum(p.numel())``; GMACs = FlopCounterMode's total / 2e9 at
224 x 224, batch 1, eval, no grad, every attention on its eager twin (so its matmuls are seen) and CPU SDPA counted.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Dict, NamedTuple, Optional, Tuple

os.environ.setdefault("VITZOO_CPU_KERNEL", "0")  # the C++ kernel is a custom op FlopCounterMode cannot see

import torch  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode, register_flop_formula, sdpa_flop_count  # noqa: E402

from zoo_profile import eager_twins  # noqa: E402


class Official(NamedTuple):
    """The official model built from its own code (params, GMACs) and what its paper / README publishes."""

    params: int
    gmacs: float
    published: str


OFFICIAL: Dict[str, Official] = {
    "pvt_tiny": Official(13_229_288, 1.933, "13.2M / ~1.9G (fig.)"),
    "pvt_small": Official(24_485_864, 3.816, "24.5M / ~3.8G (fig.)"),
    "pvt_v2_b0": Official(3_666_760, 0.566, "3.7M / -"),
    "pvt_v2_b1": Official(14_009_000, 2.108, "14.0M / -"),
    "pvt_v2_b2": Official(25_362_856, 4.027, "25.4M / 4.04G"),
    "pvt_v2_b2_li": Official(22_553_512, 3.889, "22.6M / -"),
    "swin_tiny": Official(28_288_354, 4.491, "28M / 4.5G"),
    "swin_small": Official(49_606_258, 8.741, "50M / 8.7G"),
    "flatten_pvt_tiny": Official(12_150_504, 2.037, "- / ~2.0G (fig.)"),
    "agent_pvt_tiny": Official(11_570_352, 1.986, "11.6M / 2.0G"),
    "inline_pvt_tiny": Official(12_032_232, 1.976, "12.0M / 2.0G"),
    "pola_pvt_tiny": Official(12_924_648, 2.257, "- / -"),
    "flatten_swin_tiny": Official(29_192_384, 4.483, "- / ~4.5G (fig.)"),
    "agent_swin_tiny": Official(28_902_964, 4.499, "29M / 4.5G"),
    "inline_swin_tiny": Official(29_223_544, 4.459, "30M / 4.5G"),
    "pola_swin_tiny": Official(29_285_696, 4.660, "- / -"),
    "mlla_tiny": Official(24_392_200, 4.131, "25M / 4.2G"),
    "mlla_small": Official(43_015_048, 7.249, "43M / 7.3G"),
    "ravlt_tiny": Official(14_897_768, 2.613, "15M / 2.4G"),
    "ravlt_small": Official(25_591_208, 4.878, "26M / 4.6G"),
}


@register_flop_formula(torch.ops.aten._scaled_dot_product_flash_attention_for_cpu, get_raw=True)
def _sdpa_cpu(query, key, value, *args, out_val=None, **kwargs) -> int:
    """CPU SDPA, counted as FlopCounterMode counts the GPU kernels (it has no formula for the CPU one)."""
    return sdpa_flop_count(query.shape, key.shape, value.shape)


def count(arch: str, size: int = 224) -> Tuple[int, float]:
    """(parameters, GMACs at size x size) of ``vitzoo.create_model(arch)``."""
    import vitzoo

    model = vitzoo.create_model(arch).eval()
    eager_twins(model)
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(torch.randn(1, 3, size, size))
    return sum(p.numel() for p in model.parameters()), counter.get_total_flops() / 2e9


def _delta(ours: float, theirs: float) -> str:
    return f"{100 * (ours - theirs) / theirs:+.2f}%"


def row(arch: str, counted: Optional[Tuple[int, float]] = None) -> str:
    params, gmacs = counted or count(arch)
    o = OFFICIAL[arch]
    return (
        f"| `{arch}` | {params:,} | {o.params:,} | {_delta(params, o.params)} | {gmacs:.3f} | {o.gmacs:.3f} | "
        f"{_delta(gmacs, o.gmacs)} | {o.published} |"
    )


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("archs", nargs="*", help=f"rows to count (default: all of {len(OFFICIAL)})")
    args = parser.parse_args(argv)
    unknown = [a for a in args.archs if a not in OFFICIAL]
    if unknown:
        sys.exit(f"no official counts for {unknown}; choose among {sorted(OFFICIAL)}")
    print(f"torch {torch.__version__}; GMACs at 224 x 224, batch 1, FlopCounterMode on the eager twins")
    print("| preset | params | official | Δ | GMACs | official | Δ | paper / README |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for arch in args.archs or OFFICIAL:
        print(row(arch), flush=True)


if __name__ == "__main__":
    main()
