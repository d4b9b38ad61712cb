"""Attention cost vs tokens, measured side by side in one run: time, peak memory, fraction of the floor.

    python benchmarks/attention.py                       # CPU (then CUDA if present), n = 256 .. 65536, B=1 H=3 D=64
    python benchmarks/attention.py --max-n 4096 --reps 3 --no-memory
    python benchmarks/attention.py --device cuda --dtype bf16 --batch 64 --heads 1   # the GPU target
    python benchmarks/attention.py --device cuda --min-n 1024 --batch 2 --heads 16 --layout bnhd \
        --mechanisms linear_triton,softmax_flash,softmax_efficient,linear_eager,fla_chunk --accuracy   # the GPU table
    python benchmarks/attention.py --e2e                 # + ViT-Tiny 1024x1024 patch 8, batch 8: inference, train step
    python benchmarks/attention.py --e2e-only            # only that
    python benchmarks/attention.py --device cpu --min-n 16384 --max-n 16384 --retain-freed-memory   # the CPU target
    python benchmarks/attention.py --device cpu --pyramid   # + the pyramids' stage shapes: the committed CPU table

Mechanisms: softmax (SDPA), linear naive (elu+1 features materialised, an einsum chain, as it is often written),
linear eager (vitzoo's reference formula, matmul-shaped), linear fused (the torch path: on CPU its steps in the
compiled kernel, ``linear_torch``, and in torch ops, ``linear_torch_ops``; the Triton kernels on CUDA), efficient
attention, and the families users compare against: performer (256 random features) and focused_linear (FLatten's
focused map, its per-head scales and its norms over all heads of a token) on the fused path through precomputed
features, hydra, nystrom (64 landmarks), linformer (k = 256), agent (7x7 agents, with the official position biases
computed per call) and window (7x7 windows over a square grid, or 16 rows when n is not a square). On CUDA also SDPA
with its backend named (``softmax_flash``, ``softmax_efficient``: FlashAttention and memory-efficient kernels) and fla's
chunked linear attention (``fla_chunk``, fla-core: causal, normalised, raw q and k as features; the nearest
published kernel of the class); a mechanism that cannot run here (flash in fp32, fla not installed) is left out of
the tables, its reason printed as a ``not run:`` line. ``--layout bnhd`` makes q, k, v views of (B, N, H, D)
tensors, the layout timm's qkv projection and fla take. ``--accuracy`` adds bf16 and fp16 at the largest n with
std-3 inputs against float64.
Mechanisms are interleaved within each
repetition; a time is the best of the repetitions (``--stat min``, timeit's advice: on a shared
machine noise only adds time) or their median (``--stat median``); ratios are against the fused
linear path of the same run. Peak memory is the peak above the inputs: on CUDA ``max_memory_allocated`` (in
the same process, the peak reset before each case); on CPU the resident-set high-water mark (``VmHWM``),
measured in a fresh subprocess per mechanism, after one warm-up call of the same case, ``malloc_trim`` and a
reset of the mark (``/proc/self/clear_refs``), so it sees every allocation (tracemalloc would miss torch's).
The floor: CPU, the minimal matmul FLOPs (forward 2 products, backward 4 more) over the measured sgemm rate; CUDA,
the bytes each path must move (read q, k, v (+dO), write out (+dq, dk, dv)) over the measured copy bandwidth.
Results: a table on stdout, ``attention_<device>.csv`` and ``.png`` under ``--out`` (``--pyramid``: also
``attention_cpu_pyramid.csv``).

On CPU the naive formula's time depends on glibc's heap state: with the default thresholds its
12 MB intermediates are page-faulted in again on every call, unless an earlier case (softmax at the
same n) left a large heap behind. ``--retain-freed-memory`` (eval.py's setting) gives every
mechanism a warm heap, so the times do not depend on the order the cases ran in.
"""

from __future__ import annotations

import argparse
import csv
import ctypes
import functools
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from vitzoo.attention import functional as AF
from vitzoo.attention.agent import AgentBias, agent_attention, agent_grid
from vitzoo.attention.focused_linear import FocusedFeatureMap
from vitzoo.attention.grid import Layout
from vitzoo.attention.hydra import hydra_attention
from vitzoo.attention.linformer import linformer_attention
from vitzoo.attention.nystrom import nystrom_attention
from vitzoo.attention.performer import PerformerFeatureMap
from vitzoo.attention.window import window_attention
from vitzoo.kernels import fused_linear_attention
from vitzoo.runtime import retain_freed_memory

from memory import status_mib  # a sibling module: scripts run from benchmarks/ see it

MODES = ("fwd", "fwd+bwd")
LAYOUTS = ("bhnd", "bnhd")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def linear_naive(q, k, v, eps: float = 1e-6):
    """elu+1 linear attention as it is often written: features materialised, an einsum chain."""
    fq, fk = F.elu(q) + 1, F.elu(k) + 1
    kv = torch.einsum("bhnd,bhne->bhde", fk, v)
    inv_den = 1 / (torch.einsum("bhnd,bhd->bhn", fq, fk.sum(dim=2)) + eps)
    return torch.einsum("bhnd,bhde,bhn->bhne", fq, kv, inv_den)


@functools.lru_cache(maxsize=None)
def _feature_map(kind: str, heads: int, head_dim: int, device: torch.device) -> torch.nn.Module:
    """One Performer / FLatten feature map per head count and size (built once, never redrawn while timed); FLatten's
    focused map with its per-head scales and its norms over all heads of a token, as FocusedLinearAttention runs it."""
    if kind == "performer":
        return PerformerFeatureMap(head_dim, num_features=256, redraw_interval=0).to(device)
    return FocusedFeatureMap(head_dim, heads).to(device)


def kernel_module(kind: str):
    """Linear attention with a feature-map module's precomputed features, on the fused path."""

    def run(q, k, v):
        phi = _feature_map(kind, q.shape[1], q.shape[-1], q.device)
        return AF.linear_attention(phi(q, True), phi(k, False), v, "identity")

    return run


@functools.lru_cache(maxsize=None)
def _agent_bias(heads: int, grid, device: torch.device) -> AgentBias:
    """The official agent biases of one layer (49 agents) built at ``grid``."""
    return AgentBias(heads, 49, Layout(0, *grid), device=device)


def agent_with_biases(q, k, v):
    """Agent attention (7x7 agents) with its position biases, computed per call as AgentAttention does."""
    grid = _grid(q.shape[-2])
    agents = agent_grid(grid, 49)
    biases = _agent_bias(q.shape[1], grid, q.device)(grid, agents)
    return agent_attention(q, k, v, grid=grid, agents=agents, biases=tuple(b.to(q.dtype) for b in biases))


def sdpa_backend(backend: str):
    """SDPA restricted to one backend (``FLASH_ATTENTION``, ``EFFICIENT_ATTENTION``): an error where it cannot run."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def run(q, k, v):
        with sdpa_kernel(getattr(SDPBackend, backend)):
            return F.scaled_dot_product_attention(q, k, v)

    return run


def fla_chunk(q, k, v):
    """fla's chunked linear attention (causal, normalised) on (B, N, H, D) views of the inputs."""
    from fla.ops.linear_attn import chunk_linear_attn

    out, _ = chunk_linear_attn(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), normalize=True)
    return out.transpose(1, 2)


@functools.lru_cache(maxsize=None)
def _token_projection(n: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    return torch.randn(256, n, device=device, dtype=dtype, generator=torch.Generator(device).manual_seed(0)) / n**0.5


def _grid(n: int):
    """A (h, w) patch grid of n tokens: square when n is a square, else 16 rows."""
    side = math.isqrt(n)
    return (side, side) if side * side == n else (16, n // 16)


MECHANISMS = {
    "softmax": lambda q, k, v: AF.softmax_attention(q, k, v),
    "softmax_flash": sdpa_backend("FLASH_ATTENTION"),
    "softmax_efficient": sdpa_backend("EFFICIENT_ATTENTION"),
    "linear_naive": linear_naive,
    "linear_eager": lambda q, k, v: AF.linear_attention(q, k, v, impl="eager"),
    "linear_torch": lambda q, k, v: AF.linear_attention(q, k, v, impl="torch"),
    "linear_torch_ops": lambda q, k, v: fused_linear_attention(q, k, v, impl="torch", use_kernel=False),
    "linear_triton": lambda q, k, v: AF.linear_attention(q, k, v, impl="triton"),
    "efficient": lambda q, k, v: AF.efficient_attention(q, k, v),
    "performer": kernel_module("performer"),  # m = 256 random features
    "focused_linear": kernel_module("focused"),  # the attention term (the 5x5 conv on V is the module's)
    "hydra": lambda q, k, v: hydra_attention(q, k, v),
    "nystrom": lambda q, k, v: nystrom_attention(q, k, v, num_landmarks=64),
    "linformer": lambda q, k, v: linformer_attention(
        q, k, v, _token_projection(k.shape[-2], k.device, k.dtype), _token_projection(v.shape[-2], v.device, v.dtype)
    ),  # k = 256
    "agent": agent_with_biases,
    "window": lambda q, k, v: window_attention(q, k, v, grid=_grid(q.shape[-2]), window_size=7),
    "fla_chunk": fla_chunk,
}
CUDA_ONLY = ("linear_triton", "softmax_flash", "softmax_efficient", "fla_chunk")
SOFTMAX = ("softmax", "softmax_flash", "softmax_efficient")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="all", help="cpu, cuda, or all (default: cpu, then cuda when present)")
    p.add_argument("--dtype", choices=sorted(DTYPES), default=None, help="default: fp32 on CPU, bf16 on CUDA")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=3)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument(
        "--layout",
        choices=LAYOUTS,
        default="bhnd",
        help="bnhd: q, k, v are (B, H, N, D) views of (B, N, H, D) tensors (timm's qkv, fla's layout)",
    )
    p.add_argument(
        "--accuracy",
        action="store_true",
        help="also bf16 and fp16 at the largest n, std-3 inputs: the fused path against float64",
    )
    p.add_argument("--min-n", type=int, default=256)
    p.add_argument("--max-n", type=int, default=65536)
    p.add_argument(
        "--softmax-max-n",
        type=int,
        default=None,
        help="skip softmax above this n (default: 16384 on CPU, where 64k takes minutes)",
    )
    p.add_argument("--mechanisms", default=None, help="comma list from " + ",".join(MECHANISMS))
    p.add_argument("--reps", type=int, default=5, help="timed repetitions per case (after one warm-up)")
    p.add_argument("--stat", choices=("min", "median"), default="min", help="how repetitions are summarised")
    p.add_argument("--case-seconds", type=float, default=30.0, help="fewer reps for cases slower than this")
    p.add_argument("--no-memory", action="store_true", help="skip the peak-memory pass")
    p.add_argument(
        "--kernel-cpu-time",
        action="store_true",
        help="CPU: also the compiled kernel on one thread by its CPU time, against an sgemm timed the same way",
    )
    p.add_argument(
        "--pyramid",
        action="store_true",
        help="CPU: also the pyramids' stage-1 shapes (1-2 heads, head dims 64 and 32, 3,136-65,536 tokens)",
    )
    p.add_argument("--out", default="benchmarks/results", help="folder for the CSV and PNG")
    p.add_argument(
        "--e2e",
        action="store_true",
        help="also ViT-Tiny at 1024x1024 patch 8: inference and training-step img/s, linear vs softmax",
    )
    p.add_argument("--e2e-only", action="store_true", help="only the end-to-end comparison (no sweep)")
    p.add_argument("--e2e-reps", type=int, default=2)
    p.add_argument(
        "--e2e-compile",
        default=None,
        metavar="BACKEND",
        help="also torch.compile(backend=BACKEND) of the linear model: its logits against eager, its img/s",
    )
    p.add_argument("--e2e-batch", type=int, default=None, help="default: 8 on CUDA, 1 on CPU")
    p.add_argument("--e2e-img-size", type=int, default=1024, help="a multiple of the patch size 8")
    p.add_argument(
        "--e2e-modes",
        default=None,
        help="comma list from inference,train (default: both on CUDA; "
        "inference on CPU, where softmax's 16k-token training step takes minutes)",
    )
    p.add_argument(
        "--retain-freed-memory",
        action="store_true",
        help="CPU: keep freed blocks in glibc's heap for every mechanism (see the module docstring)",
    )
    p.add_argument("--memory-worker", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.device = torch.device(args.device)
    if args.device.type == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda but torch.cuda.is_available() is False; run on a GPU machine or use --device cpu")
    args.dtype = DTYPES[args.dtype or ("bf16" if args.device.type == "cuda" else "fp32")]
    if args.softmax_max_n is None:
        args.softmax_max_n = 16384 if args.device.type == "cpu" else args.max_n
    names = (
        args.mechanisms.split(",")
        if args.mechanisms
        else [m for m in MECHANISMS if m not in CUDA_ONLY or args.device.type == "cuda"]
    )
    unknown = set(names) - set(MECHANISMS)
    if unknown:
        p.error(f"unknown mechanisms {sorted(unknown)}; choose from {list(MECHANISMS)}")
    args.mechanisms = names
    args.sizes = [n for n in (2**e for e in range(4, 21)) if args.min_n <= n <= args.max_n]
    cuda = args.device.type == "cuda"
    args.e2e_batch = args.e2e_batch or (8 if cuda else 1)
    args.e2e_modes = (args.e2e_modes or ("inference,train" if cuda else "inference")).split(",")
    if set(args.e2e_modes) - {"inference", "train"}:
        p.error(f"--e2e-modes {','.join(args.e2e_modes)}: choose from inference,train")
    if args.e2e_img_size % 8 or args.e2e_img_size <= 0 or args.e2e_batch <= 0:
        p.error(
            f"--e2e-img-size {args.e2e_img_size} / --e2e-batch {args.e2e_batch}: give a positive multiple of "
            "the patch size 8 and a positive batch"
        )
    return args


def parse_args_device(argv) -> str:
    """The --device value alone (the other arguments' defaults depend on it)."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--device", default="all")
    return p.parse_known_args(argv)[0].device


def fused_name(device: torch.device) -> str:
    return "linear_triton" if device.type == "cuda" else "linear_torch"


def runs(name: str, n: int, args) -> bool:
    return name not in SOFTMAX or n <= args.softmax_max_n


def make_inputs(n: int, args, requires_grad: bool, dtype=None, std: float = 1.0):
    """q, k, v (leaves, ``requires_grad``) and dO, (B, H, N, D); with ``--layout bnhd`` views of (B, N, H, D)."""
    g = torch.Generator(device=args.device).manual_seed(n)
    dtype = dtype or args.dtype
    b, h, d = args.batch, args.heads, args.head_dim
    shape = (b, n, h, d) if args.layout == "bnhd" else (b, h, n, d)

    def draw():
        x = (std * torch.randn(shape, generator=g, device=args.device)).to(dtype)
        return x.transpose(1, 2) if shape[1] == n else x

    qkv = [draw().requires_grad_(requires_grad) for _ in range(3)]
    return qkv, draw()


def refusal(name: str, args):
    """Why ``name`` cannot run with these arguments (None when it can): one tiny call tells."""
    try:
        qkv, _ = make_inputs(16, args, requires_grad=False)
        with torch.no_grad():
            MECHANISMS[name](*qkv)
    except (RuntimeError, ImportError, ValueError) as err:
        return f"{type(err).__name__}: {str(err).strip().splitlines()[0][:160]}"
    return None


def call(name: str, mode: str, qkv, dout):
    """One forward (inference mode) or forward + backward of ``name``; returns what it produced."""
    fn = MECHANISMS[name]
    if mode == "fwd":
        with torch.no_grad():
            return fn(*qkv)
    return torch.autograd.grad(fn(*qkv), qkv, dout)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device) -> float:
    sync(device)
    t = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - t


def summarise(samples, args) -> float:
    return min(samples) if args.stat == "min" else statistics.median(samples)


def time_case(names, mode: str, qkv, dout, args) -> dict:
    """{name: seconds (best or median of the reps)} of one case; mechanisms interleaved in each rep."""
    first = {m: timed(lambda: call(m, mode, qkv, dout), args.device) for m in names}  # warm-up
    samples = {m: [] for m in names}
    for rep in range(args.reps):
        for m in names:
            if rep * first[m] < args.case_seconds:
                samples[m].append(timed(lambda: call(m, mode, qkv, dout), args.device))
    return {m: summarise(samples[m] or [first[m]], args) for m in names}


def time_all(args):
    """{(name, n, mode): seconds (best or median of the reps)}; mechanisms interleaved in each rep."""
    results = {}
    for n in args.sizes:
        qkv, dout = make_inputs(n, args, requires_grad=True)
        for mode in MODES:
            names = [m for m in args.mechanisms if runs(m, n, args)]
            results.update({(m, n, mode): t for m, t in time_case(names, mode, qkv, dout, args).items()})
            print(
                f"  n={n:6d} {mode:8s} " + "  ".join(f"{m} {results[(m, n, mode)] * 1e3:.2f}ms" for m in names),
                file=sys.stderr,
                flush=True,
            )
    return results


# The stage-1 shapes of a patch-4 pyramid at 224, 512 and 1024 px (PVT-T: head dim 64; PVTv2-b0: 32; 1-2 heads)
PYRAMID_TOKENS = (3136, 16384, 65536)
PYRAMID_HEADS = ((1, 64), (2, 64), (1, 32), (2, 32))
PYRAMID_MECHANISMS = ("linear_torch", "linear_torch_ops")


def pyramid_shapes(args, rate) -> list:
    """The fused CPU path at the pyramids' stage shapes (batch 1), torch ops timed beside it: rows of (heads, head
    dim, n, mode, {name: seconds}), printed as a table of times and fractions of the floor."""
    rows = []
    for heads, head_dim in PYRAMID_HEADS:
        shape = argparse.Namespace(**{**vars(args), "batch": 1, "heads": heads, "head_dim": head_dim})
        for n in PYRAMID_TOKENS:
            qkv, dout = make_inputs(n, shape, requires_grad=True)
            for mode in MODES:
                rows.append((heads, head_dim, n, mode, time_case(PYRAMID_MECHANISMS, mode, qkv, dout, args)))
    kernel, ops = PYRAMID_MECHANISMS
    print(
        f"\n## pyramid stage shapes, B=1: {kernel} ms, fraction of the floor, {ops} / {kernel} (load average "
        f"{os.getloadavg()[0]:.1f} after these timings)"
    )
    print("| heads | head dim | n | mode | ms | fraction of floor | torch ops / kernel |\n" + "|---" * 7 + "|")
    shape = argparse.Namespace(**{**vars(args), "batch": 1})
    for heads, head_dim, n, mode, t in rows:
        floor = floor_seconds(kernel, n, mode, shape, rate, heads, head_dim)
        print(
            f"| {heads} | {head_dim} | {n} | {mode} | {t[kernel] * 1e3:.2f} | {floor / t[kernel]:.2f} | "
            f"{t[ops] / t[kernel]:.2f}x |"
        )
    return rows


def thread_seconds(fn, reps: int) -> float:
    """The least CPU time of this thread over ``reps`` calls of ``fn`` (after one warm-up): time the thread was not
    given, on cores shared with other jobs, is not counted."""
    fn()
    best = math.inf
    for _ in range(reps):
        start = time.thread_time()
        fn()
        best = min(best, time.thread_time() - start)
    return best


def kernel_cpu_time(args) -> list:
    """The compiled CPU kernel called on one thread (B, H, D of the run, elu): its forward and backward by the
    thread's CPU time, against a 2048^2 sgemm timed the same way (one core's floor); rows of (n, fwd s, bwd s),
    printed with the fractions of that floor. Other jobs on the cores hardly move these numbers."""
    from vitzoo.kernels import KERNEL_MAPS
    from vitzoo.kernels.cpu_kernel import cpu_kernel

    threads, elu, rows = torch.get_num_threads(), KERNEL_MAPS["elu"], []
    torch.set_num_threads(1)
    try:
        a = torch.randn(2048, 2048)
        rate = 2 * 2048**3 / thread_seconds(lambda: a @ a, args.reps)
        for n in args.sizes:
            (q, k, v), dout = make_inputs(n, args, requires_grad=False)
            kernel = cpu_kernel(q, "elu")
            out, S, z = kernel.forward(q, k, v, elu, 1e-6, 256, 1)
            grads = [torch.empty_like(x) for x in (q, k, v)]
            fwd = thread_seconds(lambda: kernel.forward(q, k, v, elu, 1e-6, 256, 1), args.reps)
            bwd = thread_seconds(lambda: kernel.backward(dout, q, k, v, S, z, elu, 1e-6, *grads, 256, 1), args.reps)
            rows.append((n, fwd, bwd))
    finally:
        torch.set_num_threads(threads)
    print(
        f"\n## the CPU kernel on one thread, by its CPU time (min of {args.reps}): fraction of one core's sgemm rate "
        f"({rate / 1e9:.1f} GFLOP/s, timed the same way), B={args.batch} H={args.heads} D={args.head_dim} elu"
    )
    print("| n | fwd ms | fwd fraction | fwd+bwd ms | fwd+bwd fraction |\n" + "|---" * 5 + "|")
    for n, fwd, bwd in rows:
        floor_fwd, floor_both = (floor_seconds("linear_torch", n, mode, args, rate) for mode in MODES)
        both = fwd + bwd
        print(f"| {n} | {fwd * 1e3:.2f} | {floor_fwd / fwd:.2f} | {both * 1e3:.2f} | {floor_both / both:.2f} |")
    return rows


# ----------------------------------------------------------------------------------------- memory
def _cpu_peak(fn) -> int:
    """Bytes of resident memory above the level before ``fn()``, at ``fn``'s peak."""
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current VmRSS
    base = status_mib("VmRSS")
    fn()
    return int((status_mib("VmHWM") - base) * 2**20)


def _cuda_peak(fn, device) -> int:
    torch.cuda.synchronize(device)
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    fn()
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device) - base


def peaks(name: str, args) -> dict:
    """{"n,mode": peak bytes} of one mechanism for every n and mode."""
    out = {}
    for n in args.sizes:
        if not runs(name, n, args):
            continue
        qkv, dout = make_inputs(n, args, requires_grad=True)
        for mode in MODES:
            call(name, mode, qkv, dout)  # warm-up: lazy initialisation is not the mechanism's cost
            case = lambda: call(name, mode, qkv, dout)  # noqa: E731  (result dropped inside the window)
            peak = _cuda_peak(case, args.device) if args.device.type == "cuda" else _cpu_peak(case)
            out[f"{n},{mode}"] = peak
    return out


def memory_worker(args) -> None:
    """Child process: peak memory of one mechanism for every n and mode, printed as JSON."""
    print(json.dumps(peaks(args.memory_worker, args)))


def memory_all(args, argv):
    """{(name, n, mode): peak bytes}: on CUDA in this process (its allocator's peak is reset per case), on CPU one
    fresh subprocess per mechanism."""
    if args.device.type == "cuda":
        return {
            (name, int(key.split(",")[0]), key.split(",")[1]): peak
            for name in args.mechanisms
            for key, peak in peaks(name, args).items()
        }
    results = {}
    for name in args.mechanisms:
        proc = subprocess.run(
            [sys.executable, __file__, *argv, "--memory-worker", name], capture_output=True, text=True
        )
        if proc.returncode != 0:
            print(f"memory pass for {name} failed:\n{proc.stderr[-2000:]}", file=sys.stderr)
            continue
        for key, peak in json.loads(proc.stdout.strip().splitlines()[-1]).items():
            n, mode = key.split(",")
            results[(name, int(n), mode)] = peak
    return results


# ------------------------------------------------------------------------------------------ floor
def matmul_rate(device, dtype) -> float:
    """Measured FLOP/s of a large square matmul (the CPU floor's denominator)."""
    a = torch.randn(2048, 2048, device=device, dtype=dtype)
    a @ a
    t = min(timed(lambda: a @ a, device) for _ in range(5))
    return 2 * 2048**3 / t


def copy_bandwidth(device) -> float:
    """Measured bytes/s of a 1 GiB device-to-device copy (read + write; the GPU floor's denominator)."""
    src = torch.empty(1 << 28, device=device, dtype=torch.float32)
    dst = torch.empty_like(src)
    dst.copy_(src)
    t = min(timed(lambda: dst.copy_(src), device) for _ in range(10))
    return 2 * src.numel() * 4 / t


def floor_seconds(name: str, n: int, mode: str, args, rate: float, heads=None, head_dim=None) -> float:
    """CPU: minimal matmul FLOPs / rate. CUDA: minimal bytes moved / copy bandwidth. ``heads``, ``head_dim``:
    another shape than the run's."""
    bh, d = args.batch * (heads or args.heads), head_dim or args.head_dim
    bwd = mode == "fwd+bwd"
    if args.device.type == "cuda":
        tensors = 4 + (7 if bwd else 0)  # q, k, v, out (+ dout, q, k, v, dq, dk, dv)
        return tensors * bh * n * d * args.dtype.itemsize / rate
    # fwd = 2 matmuls, bwd = 4 more: (n x n x d) for softmax, (n x d x d) for the linear forms
    flops = 2 * bh * (2 + (4 if bwd else 0)) * n * d * (n if name == "softmax" else d)
    return flops / rate


# ----------------------------------------------------------------------------------------- report
def report(args, times, memory, rate) -> None:
    fused = fused_name(args.device)
    names = args.mechanisms
    hw = (
        torch.cuda.get_device_name(args.device)
        if args.device.type == "cuda"
        else f"CPU, {torch.get_num_threads()} threads, "
        + ("freed memory retained" if args.retain_freed_memory else "default allocator")
    )
    unit = "TFLOP/s sgemm" if args.device.type == "cpu" else "TB/s copy"
    print(
        f"\n# attention, {hw}, B={args.batch} H={args.heads} D={args.head_dim} {str(args.dtype)[6:]} "
        f"{args.layout}; floor rate {rate / 1e12:.3f} {unit}; load average (1 min) {args.load[0]:.1f} before the "
        f"timings, {args.load[1]:.1f} after, {os.cpu_count()} CPUs"
    )
    for name, reason in args.refused.items():
        print(f"not run: {name} ({reason})")
    for mode in MODES:
        print(f"\n## {mode}: ms, {args.stat} of {args.reps} (x = time / {fused})")
        columns = names + [f"{m}/{fused}" for m in names if m != fused]
        print("| n | " + " | ".join(columns) + " |\n" + "|---" * (len(columns) + 1) + "|")
        for n in args.sizes:
            t = [times.get((m, n, mode)) for m in names]
            ref = times.get((fused, n, mode))
            cells = [f"{x * 1e3:.2f}" if x else "-" for x in t]
            ratios = [
                f"{times[(m, n, mode)] / ref:.2f}x" if (m, n, mode) in times and ref else "-"
                for m in names
                if m != fused
            ]
            print(f"| {n} | " + " | ".join(cells + ratios) + " |")
    if memory:
        print("\n## peak memory above the inputs, MB (fwd / fwd+bwd)")
        print("| n | " + " | ".join(names) + " |\n" + "|---" * (len(names) + 1) + "|")
        for n in args.sizes:
            cells = [
                " / ".join(f"{memory[(m, n, mode)] / 2**20:.1f}" if (m, n, mode) in memory else "-" for mode in MODES)
                for m in names
            ]
            print(f"| {n} | " + " | ".join(cells) + " |")
    floor = "FLOPs / sgemm rate" if args.device.type == "cpu" else "bytes / copy bandwidth"
    print(f"\n## fraction of the floor, fwd / fwd+bwd ({floor})")
    print("| n | " + " | ".join(names) + " |\n" + "|---" * (len(names) + 1) + "|")
    for n in args.sizes:
        cells = [
            " / ".join(
                f"{floor_seconds(m, n, mode, args, rate) / times[(m, n, mode)]:.2f}" if (m, n, mode) in times else "-"
                for mode in MODES
            )
            for m in names
        ]
        print(f"| {n} | " + " | ".join(cells) + " |")


def write_files(args, times, memory, rate) -> Path:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"attention_{args.device.type}"
    with open(stem.with_suffix(".csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(
            [
                "device",
                "dtype",
                "batch",
                "heads",
                "head_dim",
                "mechanism",
                "n",
                "mode",
                "ms",
                "peak_mb",
                "floor_ms",
                "floor_fraction",
            ]
        )
        for (m, n, mode), t in sorted(times.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2])):
            floor = floor_seconds(m, n, mode, args, rate)
            peak = memory.get((m, n, mode))
            w.writerow(
                [
                    args.device.type,
                    str(args.dtype)[6:],
                    args.batch,
                    args.heads,
                    args.head_dim,
                    m,
                    n,
                    mode,
                    f"{t * 1e3:.4f}",
                    "" if peak is None else f"{peak / 2**20:.2f}",
                    f"{floor * 1e3:.4f}",
                    f"{floor / t:.4f}",
                ]
            )
    plot(stem.with_suffix(".png"), args, times, memory)
    return stem


def write_pyramid_csv(stem: Path, rows, args, rate) -> None:
    shape = argparse.Namespace(**{**vars(args), "batch": 1})
    with open(f"{stem}_pyramid.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["device", "dtype", "batch", "heads", "head_dim", "mechanism", "n", "mode", "ms", "floor_fraction"])
        for heads, head_dim, n, mode, t in rows:
            floor = floor_seconds("linear_torch", n, mode, shape, rate, heads, head_dim)
            for m, seconds in t.items():
                w.writerow(
                    [args.device.type, str(args.dtype)[6:], 1, heads, head_dim, m, n, mode]
                    + [f"{seconds * 1e3:.4f}", f"{floor / seconds:.4f}"]
                )


def plot(path: Path, args, times, memory) -> None:
    """Time (fwd, fwd+bwd) and peak memory against n, log-log, one colour per mechanism."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("fwd", "forward, ms"), ("fwd+bwd", "forward + backward, ms")] + (
        [("mem", "peak memory fwd+bwd, MB")] if memory else []
    )
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels) + 2, 4))
    colours = plt.get_cmap("tab20").colors  # 13+ mechanisms: the default cycle repeats after 10
    for ax, (what, label) in zip(axes, panels):
        for i, m in enumerate(args.mechanisms):
            src = memory if what == "mem" else times
            key_mode = "fwd+bwd" if what == "mem" else what
            pts = [(n, src[(m, n, key_mode)]) for n in args.sizes if (m, n, key_mode) in src]
            if pts:
                scale = 2**-20 if what == "mem" else 1e3
                ax.plot(
                    [p[0] for p in pts],
                    [max(p[1] * scale, 1e-3) for p in pts],
                    marker="os^D"[i % 4],
                    markersize=4,
                    color=colours[2 * i % 20 + (2 * i // 20) % 2],
                    label=m,
                )
        ax.set(xscale="log", yscale="log", xlabel="tokens n", title=label)
        ax.grid(True, which="both", alpha=0.3)
    fig.legend(*axes[0].get_legend_handles_labels(), loc="center right")
    fig.suptitle(f"{args.device.type}, B={args.batch} H={args.heads} D={args.head_dim} {str(args.dtype)[6:]}")
    fig.tight_layout(rect=(0, 0, 1 - 2 / (5 * len(panels) + 2), 1))
    fig.savefig(path, dpi=120)


def _e2e_step(model, x, mode: str, optimizer, autocast):
    """One inference pass, or (``mode`` "train") one training step: forward, cross-entropy, backward, AdamW."""
    if mode == "inference":
        with torch.inference_mode(), autocast:
            model(x)
        return
    with autocast:
        loss = torch.nn.functional.cross_entropy(model(x), torch.zeros(len(x), dtype=torch.long, device=x.device))
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()


def e2e(args) -> None:
    """ViT-Tiny at ``--e2e-img-size`` (1024), patch 8 (16,384 tokens), batch ``--e2e-batch``: img/s of an
    inference pass and of a training step (``--e2e-modes``), linear vs softmax, interleaved; on CUDA also each
    one's peak memory."""
    import vitzoo

    size, batch, cuda = args.e2e_img_size, args.e2e_batch, args.device.type == "cuda"
    tokens = (size // 8) ** 2
    models = {
        att: vitzoo.create_model("vit_tiny", attention=att, img_size=size, patch_size=8).to(args.device)
        for att in ("linear", "softmax")
    }
    optimizers = {att: torch.optim.AdamW(m.parameters(), lr=1e-4) for att, m in models.items()}
    x = torch.randn(batch, 3, size, size, device=args.device)
    autocast = torch.autocast(args.device.type, dtype=args.dtype, enabled=args.dtype != torch.float32)
    rows = []
    for mode in args.e2e_modes:
        samples, peak = {att: [] for att in models}, {}
        for rep in range(args.e2e_reps + 1):  # the first round is the warm-up (and the peak-memory pass)
            for att, model in models.items():
                model.train(mode != "inference")
                if cuda and not rep:
                    torch.cuda.empty_cache()
                    torch.cuda.reset_peak_memory_stats(args.device)
                    base = torch.cuda.memory_allocated(args.device)
                t = timed(lambda: _e2e_step(model, x, mode, optimizers[att], autocast), args.device)
                if rep:
                    samples[att].append(t)
                elif cuda:
                    peak[att] = (torch.cuda.max_memory_allocated(args.device) - base) / 2**20
        for att in models:
            rows.append(
                dict(
                    mode=mode,
                    model=f"vit_{att}",
                    img_per_s=batch / summarise(samples[att], args),
                    peak_mb=peak.get(att),
                )
            )
    print(
        f"\n## end to end: ViT-Tiny {size}x{size} patch 8 ({tokens:,} tokens), batch {batch}, {args.device.type} "
        f"{str(args.dtype)[6:]}, {args.stat} of {args.e2e_reps} (peak: above the weights and inputs)"
    )
    print("| mode | model | img/s | peak MB |\n|---|---|---|---|")
    for r in rows:
        print(_e2e_line(r))
    for mode in args.e2e_modes:
        lin, soft = (
            next(r["img_per_s"] for r in rows if r["mode"] == mode and r["model"] == m)
            for m in ("vit_linear", "vit_softmax")
        )
        print(f"{mode}: vit_linear / vit_softmax img/s = {lin / soft:.2f}x", flush=True)
    _write_e2e_csv(rows, args, size, tokens, batch)
    if args.e2e_compile:  # after the table and CSV are out: a compile stopped by a time limit leaves them
        rows.append(compiled_row(models["linear"], x, args, autocast))
        print(_e2e_line(rows[-1]))
        _write_e2e_csv(rows, args, size, tokens, batch)


def _e2e_line(r: dict) -> str:
    peak_cell = f"{r['peak_mb']:.0f}" if r["peak_mb"] is not None else "-"
    return f"| {r['mode']} | {r['model']} | {r['img_per_s']:.3g} | {peak_cell} |"


def _write_e2e_csv(rows, args, size: int, tokens: int, batch: int) -> None:
    out = Path(args.out) / f"attention_{args.device.type}_e2e.csv"
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(
            ["device", "dtype", "model", "img_size", "patch_size", "tokens", "batch", "mode", "img_per_s", "peak_mb"]
        )
        for r in rows:
            writer.writerow(
                [
                    args.device.type,
                    str(args.dtype)[6:],
                    r["model"],
                    size,
                    8,
                    tokens,
                    batch,
                    r["mode"],
                    f"{r['img_per_s']:.4g}",
                    "" if r["peak_mb"] is None else f"{r['peak_mb']:.0f}",
                ]
            )


def compiled_row(model, x, args, autocast) -> dict:
    """torch.compile of the linear model (inference): its img/s, and its logits against the eager module's."""
    model.eval()
    compiled = torch.compile(model, backend=args.e2e_compile)
    with torch.inference_mode(), autocast:
        eager, first = model(x).float(), compiled(x).float()  # the first compiled call compiles
        err = ((first - eager).norm() / eager.norm()).item()
        times = [timed(lambda: compiled(x), args.device) for _ in range(args.e2e_reps)]
    print(
        f"torch.compile(backend={args.e2e_compile}) of vit_linear: logits relative error {err:.2e} against eager",
        flush=True,
    )
    return dict(
        mode="inference",
        model=f"vit_linear compiled ({args.e2e_compile}, rel err {err:.1e})",
        img_per_s=len(x) / summarise(times, args),
        peak_mb=None,
    )


UNIT_ROUNDOFF = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}


def accuracy(args) -> None:
    """The fused path in bf16 and fp16 at the largest n with std-3 inputs (features and state far past fp16's
    range) against the formula in float64: finite?, norm-wise relative error of the output and of dq, dk, dv, and
    that error in units of the dtype's roundoff."""
    from vitzoo.kernels import naive_linear_attention

    n, fused, rows = args.sizes[-1], fused_name(args.device), []
    for dtype in UNIT_ROUNDOFF:
        qkv, dout = make_inputs(n, args, requires_grad=True, dtype=dtype, std=3.0)
        out = MECHANISMS[fused](*qkv)
        grads = torch.autograd.grad(out, qkv, dout)
        ref_in = [t.detach().double().requires_grad_(True) for t in qkv]
        ref = naive_linear_attention(*ref_in, "elu")
        ref_grads = torch.autograd.grad(ref, ref_in, dout.double())
        for what, got, want in zip(("out", "dq", "dk", "dv"), (out, *grads), (ref, *ref_grads)):
            err = ((got.double() - want).norm() / want.norm()).item()
            rows.append((str(dtype)[6:], what, bool(torch.isfinite(got).all()), err, err / UNIT_ROUNDOFF[dtype]))
        del qkv, dout, out, grads, ref_in, ref, ref_grads
    print(
        f"\n## accuracy: {fused} at n={n}, std-3 inputs, against float64 (B={args.batch} H={args.heads} "
        f"D={args.head_dim})"
    )
    print("| dtype | tensor | finite | relative error | / unit roundoff |\n|---|---|---|---|---|")
    for dtype, what, finite, err, units in rows:
        print(f"| {dtype} | {what} | {finite} | {err:.2e} | {units:.2f} |")
    out = Path(args.out) / f"attention_{args.device.type}_accuracy.csv"
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["device", "mechanism", "n", "dtype", "tensor", "finite", "rel_err", "unit_roundoffs"])
        w.writerows([args.device.type, fused, n, *row[:3], f"{row[3]:.3e}", f"{row[4]:.3f}"] for row in rows)


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if parse_args_device(argv) == "all":
        for device in ["cpu"] + (["cuda"] if torch.cuda.is_available() else []):
            main([*argv, "--device", device])
        return
    args = parse_args(argv)
    if args.retain_freed_memory:
        args.retain_freed_memory = retain_freed_memory()  # the table header reports what took effect
        if not args.retain_freed_memory:
            print("--retain-freed-memory: not glibc, the C library's default is kept", file=sys.stderr)
    if args.memory_worker:
        return memory_worker(args)
    torch.manual_seed(0)
    if args.e2e_only:
        return e2e(args)
    args.refused = {m: why for m in args.mechanisms if (why := refusal(m, args))}
    for name, reason in args.refused.items():
        print(f"not run: {name} ({reason})", file=sys.stderr)
    args.mechanisms = [m for m in args.mechanisms if m not in args.refused]
    floor_rate = (
        (lambda: matmul_rate(args.device, torch.float32))
        if args.device.type == "cpu"
        else (lambda: copy_bandwidth(args.device))
    )
    args.load = [os.getloadavg()[0]]  # other processes' share of the cores, reported beside the times
    rate = floor_rate()
    times = time_all(args)
    rate = max(rate, floor_rate())  # measured before and after: the better one is the machine's rate
    args.load.append(os.getloadavg()[0])
    memory = {} if args.no_memory else memory_all(args, argv)
    report(args, times, memory, rate)
    stem = write_files(args, times, memory, rate)
    print(f"\nwrote {stem}.csv and {stem}.png")
    if args.kernel_cpu_time and args.device.type == "cpu":
        kernel_cpu_time(args)
    if args.pyramid and args.device.type == "cpu":
        write_pyramid_csv(stem, pyramid_shapes(args, rate), args, rate)
        print(f"wrote {stem}_pyramid.csv")
    if args.accuracy:
        accuracy(args)
    if args.e2e:
        e2e(args)


if __name__ == "__main__":
    main()
