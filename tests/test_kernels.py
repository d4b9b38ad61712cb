"""vitzoo.kernels: the fused linear-attention paths against a float64 reference of the formula.

out_i = phi(q_i) S / (phi(q_i).z + eps), S = sum_j phi(k_j)^T v_j, z = sum_j phi(k_j).
The Triton kernels run under Triton's CPU interpreter in a subprocess (TRITON_INTERPRET must be
set before triton is imported, so it cannot be switched on inside this pytest process).
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from attention_reference import kernel_ref, kernel_ref_linear_time, phi
from vitzoo.attention import functional as AF
from vitzoo.kernels import KERNEL_MAPS, fused_linear_attention, naive_linear_attention, triton_available
from vitzoo.kernels import cpu_kernel as CK


def torch_path(q, k, v, feature_map="elu", eps=1e-6, **options):
    """The chunked torch path (``chunk``, ``use_kernel``) behind the public entry."""
    return fused_linear_attention(q, k, v, feature_map, eps, impl="torch", **options)


EPS = 1e-6


def make_qkv(b, h, n, d, dv=None, dtype=torch.float32, seed=0, requires_grad=True, features=False):
    """Gaussian q, k, v; ``features``: q, k positive (exp of a Gaussian), as precomputed features are."""
    g = torch.Generator().manual_seed(seed)
    out = [torch.randn(b, h, n, width, generator=g) for width in (d, d, dv or d)]
    if features:
        out[0], out[1] = out[0].exp(), out[1].exp()
    return [t.to(dtype).requires_grad_(requires_grad) for t in out]


def grads(out, inputs, seed=1):
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return torch.autograd.grad(out, inputs, dout.to(out.dtype))


def assert_close_rel(actual, expected, rtol, atol=1e-6):
    """Max error within rtol of the reference's largest entry (+ atol: n = 1 has ~0 grads for q, k)."""
    err = (actual.double() - expected.double()).abs().max().item()
    scale = expected.double().abs().max().item()
    assert err <= rtol * scale + atol, f"max abs error {err:.3e} > {rtol:.1e} * {scale:.3e} + {atol:.0e}"


# n = 1, 17, 130; head dims 16, 32, 64 (and an odd value dim); batch*heads 1 and 7
SHAPES = [(1, 1, 1, 16, 16), (1, 7, 17, 32, 32), (7, 1, 130, 64, 48), (1, 1, 130, 16, 16), (2, 2, 70, 256, 64)]


@pytest.mark.parametrize("feature_map", ["elu", "relu", "taylor", "identity"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize(
    "impl,chunk,use_kernel", [("torch", None, None), ("torch", 8, None), ("torch", 8, False), ("eager", None, None)]
)
def test_paths_match_float64_reference(feature_map, shape, impl, chunk, use_kernel):
    """torch path: the compiled CPU kernel where it serves (elu, relu, identity) and torch ops (use_kernel=False);
    identity takes positive precomputed features (256 of them for 64 value channels in the last shape)."""
    b, h, n, d, dv = shape
    q, k, v = make_qkv(b, h, n, d, dv, features=feature_map == "identity")
    if impl == "eager":
        out = AF.linear_attention(q, k, v, feature_map, EPS, impl="eager")
    else:
        out = torch_path(q, k, v, feature_map, EPS, chunk=chunk, use_kernel=use_kernel)
    ref = kernel_ref(q, k, v, feature_map)[0]
    assert out.shape == (b, h, n, dv) and out.dtype == torch.float32
    assert_close_rel(out, ref, 1e-5)
    for g, g_ref in zip(grads(out, (q, k, v)), grads(ref, (q, k, v))):
        assert_close_rel(g, g_ref, 1e-4)


@pytest.mark.parametrize(
    "feature_map,use_kernel",
    [
        ("elu", True),
        ("relu", True),
        ("identity", True),
        ("elu", False),
        ("relu", False),
        ("identity", False),
        ("taylor", None),
    ],
)
def test_gradcheck_float64(feature_map, use_kernel):
    q, k, v = make_qkv(1, 2, 7, 4, 3, dtype=torch.float64, features=feature_map == "identity")
    fn = lambda q, k, v: torch_path(q, k, v, feature_map, EPS, chunk=3, use_kernel=use_kernel)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (q, k, v))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("feature_map", ["elu", "taylor", "identity"])
def test_naive_reference_is_the_formula(feature_map, causal):
    """kernels.naive: the one eager formula, causal or not, against the n x n float64 reference."""
    q, k, v = make_qkv(2, 3, 19, 8, 5, features=feature_map == "identity")
    out = naive_linear_attention(q, k, v, feature_map, EPS, causal=causal)
    assert out.dtype == torch.float32
    assert_close_rel(out, kernel_ref(q, k, v, feature_map, causal=causal)[0], 1e-5)


def test_kernels_import_nothing_else_of_vitzoo():
    """vitzoo.kernels is a leaf: no module of it imports vitzoo.<anything but kernels> (attention imports kernels)."""
    import ast
    import pathlib

    import vitzoo.kernels

    for path in pathlib.Path(vitzoo.kernels.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""] if node.level == 0 else ([] if node.level == 1 else ["vitzoo..."])
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            outside = [m for m in names if m.split(".")[0] == "vitzoo" and not m.startswith("vitzoo.kernels")]
            assert not outside, f"{path.name} imports {outside}"


def test_cpu_kernel_builds_here():
    """CI has g++ and ninja: the kernel must build, or every kernel test above silently ran torch ops;
    and torch's MKL must hand it sgemm_, or the float32 tests ran its float64 route (at::mm)."""
    x = torch.zeros(1)
    assert CK.cpu_kernel(x, "elu") is not None
    assert CK.cpu_kernel(x, "elu").has_blas() == torch.backends.mkl.is_available()
    assert CK.cpu_kernel(x.bfloat16(), "elu") is None and CK.cpu_kernel(x, "taylor") is None


def test_cpu_kernel_build_folder_is_per_install(monkeypatch, tmp_path):
    """Two checkouts / venvs sharing TORCH_EXTENSIONS_DIR build into different folders (torch's build
    files hold absolute source paths: one shared folder was rebuilt by each in turn)."""
    tag = CK._install_tag()
    monkeypatch.setattr(CK, "_SOURCE", tmp_path / "csrc" / "linear_attention_cpu.cpp")
    assert CK._install_tag() != tag and len(tag) == 8


def test_cpu_kernel_feature_map_matches_float64_exp():
    """The kernel's own exp (a polynomial, no libm call) over fp32's whole range, through z = sum phi(k)
    of one-row slices: relative error < 1.5e-7 where exp is a normal fp32 number, below (x < -87.3) the
    subnormal within one step of 2^-149 (0 below -104), as expf gives; in rows of 1 feature (a masked tail), of 24
    (whole vectors of 8 or 16 lanes, normal and subnormal lanes side by side, and a tail) and of 104 (groups of four
    vectors taken together, then single ones and a tail)."""
    kernel = CK.cpu_kernel(torch.zeros(1), "elu")
    x = torch.cat([torch.linspace(-110, 10, 24017), torch.tensor([0.0, -0.0, 1e-30, -1e-30, -87.0, -87.4, -103.9])])
    for width in (1, 24, 104):
        rows = x.reshape(-1, 1, 1, width)  # (B, H, N, D): one token of `width` features per slice
        for name, expected in [("elu", phi(x, "elu")), ("relu", phi(x, "relu"))]:
            _, _, z = kernel.forward(rows, rows, torch.ones_like(rows[..., :1]), KERNEL_MAPS[name], EPS, 256, 1)
            err = (z.flatten().double() - expected).abs()
            normal = expected >= torch.finfo(torch.float32).tiny
            assert (err[normal] / expected[normal]).max() < 1.5e-7, (name, width)
            assert err[~normal].max() <= 2.0**-149, (name, width)


def test_cpu_kernel_keeps_subnormal_features_apart():
    """eps = 0 and every elu feature below fp32's normal range: the weights still follow exp(q.k)
    (a clamp to the smallest normal made both features equal: 0.5 here)."""
    q = torch.tensor([[[[-95.0, -105.0]]]])
    k, v = torch.tensor([[[[5.0, -5.0], [-5.0, 5.0]]]]), torch.tensor([[[[1.0], [0.0]]]])
    expected = kernel_ref(q, k, v, "elu", eps=0.0)[0]
    for use_kernel in (True, False):
        assert_close_rel(torch_path(q, k, v, "elu", eps=0.0, use_kernel=use_kernel), expected, 1e-3)


@pytest.mark.parametrize("layout", ["bhnd", "packed", "bhdn"])
@pytest.mark.parametrize("wanted", ["qkv", "q", "k", "v"])
@pytest.mark.parametrize("feature_map", ["elu", "relu"])
def test_cpu_kernel_matches_torch_ops(feature_map, wanted, layout):
    """Same values and gradients from the kernel's steps and torch's, for timm's packed qkv views, a
    transposed feature dim, uneven chunks, worker threads (one sample) and torch's threads (many slices)."""
    for b, chunk in [(1, 37), (9, 64)]:
        g = torch.Generator().manual_seed(0)
        if layout == "packed":
            base = torch.randn(b, 300, 3, 3, 32, generator=g).permute(2, 0, 3, 1, 4).unbind(0)
        elif layout == "bhdn":  # feature dim not unit-stride: chunks are copied into contiguous rows
            base = [torch.randn(b, 3, 32, 300, generator=g).transpose(-1, -2) for _ in range(3)]
        else:
            base = [torch.randn(b, 3, 300, 32, generator=g) for _ in range(3)]
        results = []
        for use_kernel in (True, False):
            q, k, v = [t.clone().requires_grad_(name in wanted) for t, name in zip(base, "qkv")]
            out = torch_path(q, k, v, feature_map, EPS, chunk=chunk, use_kernel=use_kernel)
            results.append((out, grads(out, [t for t in (q, k, v) if t.requires_grad])))
        (out, gs), (out_ref, gs_ref) = results
        torch.testing.assert_close(out, out_ref, rtol=1e-5, atol=1e-6)
        for g_, g_ref in zip(gs, gs_ref, strict=True):
            torch.testing.assert_close(g_, g_ref, rtol=1e-4, atol=1e-6)


# The pyramids' stage shapes (1-2 heads of 32 or 64 channels) and awkward ones: token counts no 256-row block or
# thread split divides, odd head and value dims, and 16 slices (two threads: whole slices per unit)
KERNEL_SHAPES = [
    (1, 1, 3136, 32, 32),
    (1, 2, 1000, 64, 64),
    (2, 1, 777, 48, 40),
    (1, 2, 257, 33, 64),
    (8, 2, 70, 32, 32),
]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("shape", KERNEL_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("feature_map", ["elu", "relu"])
def test_cpu_kernel_matches_naive_reference(feature_map, shape, threads):
    """The kernel's forward and backward against the naive formula in float64: float32 within its rounding, float64
    to ~1e-12, on one thread and on two (one token range per thread in each slice, partial sums added in order)."""
    b, h, n, d, dv = shape
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for dtype, rtol, grad_rtol in [(torch.float32, 1e-5, 1e-4), (torch.float64, 1e-12, 1e-11)]:
            q, k, v = make_qkv(b, h, n, d, dv, dtype=dtype, seed=n)
            out = torch_path(q, k, v, feature_map, EPS, use_kernel=True)
            wide = [t.detach().double().requires_grad_(True) for t in (q, k, v)]
            ref = naive_linear_attention(*wide, feature_map, EPS)
            assert_close_rel(out, ref, rtol, atol=0)
            for g, g_ref in zip(grads(out, (q, k, v)), grads(ref, wide), strict=True):
                assert_close_rel(g, g_ref, grad_rtol, atol=1e-6 * (dtype == torch.float32))
    finally:
        torch.set_num_threads(previous)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("shape", [(1, 1, 16384, 36, 36), (1, 2, 4100, 64, 64)], ids=lambda s: "x".join(map(str, s)))
def test_cpu_kernel_streamed_outputs_match_naive_reference(shape, dtype):
    """Outputs of the kernel's streaming size (out, dq, dk, dv written past the caches; float64 through the block's
    scratch and a copy) against the float64 formula: rows of 36 channels start on and off the vector alignment and
    end in a partial vector; 4,100 tokens of 64 on two threads end in a short block."""
    b, h, n, d, dv = shape
    assert b * h * n * min(d, dv) * 4 >= CK.cpu_kernel(torch.zeros(1), "elu").stream_bytes(), "below the streaming size"
    q, k, v = make_qkv(b, h, n, d, dv, dtype=dtype, seed=1)
    out = torch_path(q, k, v, "elu", EPS, use_kernel=True)
    wide = [t.detach().double().requires_grad_(True) for t in (q, k, v)]
    ref = naive_linear_attention(*wide, "elu", EPS)
    rtol, grad_rtol, atol = (1e-5, 1e-4, 1e-6) if dtype == torch.float32 else (1e-12, 1e-11, 0)
    assert_close_rel(out, ref, rtol, atol=0)
    for g, g_ref in zip(grads(out, (q, k, v)), grads(ref, wide), strict=True):
        assert_close_rel(g, g_ref, grad_rtol, atol=atol)


def test_cpu_kernel_on_two_threads_is_deterministic():
    """Two threads on one slice (a token range each, partial sums added in order): the same result on every call."""
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        q, k, v = make_qkv(1, 1, 4099, 64, requires_grad=False)
        first = torch_path(q, k, v, use_kernel=True)
        assert all(torch.equal(torch_path(q, k, v, use_kernel=True), first) for _ in range(3))
    finally:
        torch.set_num_threads(previous)


@pytest.mark.parametrize("feature_map", ["elu", "relu"])
def test_cpu_kernel_copies_overlapping_rows(feature_map):
    """Keys broadcast over the tokens (row stride 0) and the all-stride-0 gradient of out.sum() are
    copied into rows BLAS can read; values and gradients match torch ops."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 2, 50, 16, generator=g)
    k, v = torch.randn(1, 2, 1, 16, generator=g).expand(1, 2, 50, 16), torch.randn(1, 2, 50, 16, generator=g)
    results = []
    for use_kernel in (True, False):
        inputs = [t.clone().requires_grad_(True) for t in (q, v)]
        out = torch_path(inputs[0], k, inputs[1], feature_map, EPS, use_kernel=use_kernel)
        results.append((out, torch.autograd.grad(out.sum(), inputs)))
    (out, gs), (out_ref, gs_ref) = results
    torch.testing.assert_close(out, out_ref, rtol=1e-5, atol=1e-6)
    for g_, g_ref in zip(gs, gs_ref):
        torch.testing.assert_close(g_, g_ref, rtol=1e-4, atol=1e-6)


def test_mismatched_shapes_are_errors_not_memory_corruption():
    """The torch path checks shapes before the kernel indexes raw memory; the kernel checks them too."""
    q, k, v = make_qkv(1, 1, 10, 4, requires_grad=False)
    with pytest.raises(ValueError, match="shape mismatch"):
        torch_path(q, torch.randn(1, 1, 3000, 4), v, use_kernel=True)
    with pytest.raises(ValueError, match="shape mismatch"):
        torch_path(q.repeat(1, 2, 1, 1), k, v, use_kernel=True)
    kernel, elu = CK.cpu_kernel(q, "elu"), KERNEL_MAPS["elu"]
    with pytest.raises(RuntimeError, match="expected q \\(B, H, Nq, D\\)"):
        kernel.forward(q, torch.randn(1, 1, 3000, 4), v, elu, EPS, 256, 1)
    out, S, z = kernel.forward(q, k, v, elu, EPS, 256, 1)
    with pytest.raises(RuntimeError, match="state S"):
        kernel.backward(out, q, k, v, S[:, :2], z, elu, EPS, None, None, torch.empty_like(v), 256, 1)
    with pytest.raises(RuntimeError, match="dout must be shaped like the output"):
        kernel.backward(out[:, :, :9], q, k, v, S, z, elu, EPS, None, None, torch.empty_like(v), 256, 1)
    with pytest.raises(RuntimeError, match="dk must be shaped"):
        kernel.backward(out, q, k, v, S, z, elu, EPS, None, torch.empty(1, 1, 11, 4), None, 256, 1)


def test_cpu_kernel_fallback_and_switches(monkeypatch):
    """A failed build warns once, names the fix and leaves torch ops running; VITZOO_CPU_KERNEL=0
    skips the kernel; use_kernel=True where it cannot serve says why."""
    q, k, v = make_qkv(1, 2, 40, 16, requires_grad=False)
    expected = torch_path(q, k, v, use_kernel=False)
    from torch.utils import cpp_extension

    def no_compiler(*args, **kwargs):
        raise RuntimeError("Error building extension: g++: command not found")

    monkeypatch.setattr(cpp_extension, "load", no_compiler)
    with pytest.warns(RuntimeWarning, match="pip install ninja"):
        assert CK._build.__wrapped__() is None
    monkeypatch.setenv("VITZOO_CPU_KERNEL", "0")
    assert CK.cpu_kernel(q, "elu") is None
    torch.testing.assert_close(torch_path(q, k, v), expected, rtol=0, atol=0)
    with pytest.raises(ValueError, match="use_kernel=None"):
        torch_path(q, k, v, use_kernel=True)
    monkeypatch.delenv("VITZOO_CPU_KERNEL")
    with pytest.raises(ValueError, match="float32/float64 CPU"):
        torch_path(q.bfloat16(), k.bfloat16(), v.bfloat16(), use_kernel=True)


def test_auto_on_cpu_is_the_torch_path_and_functional_dispatches_to_it():
    q, k, v = make_qkv(2, 3, 33, 16, requires_grad=False)
    torch_out = fused_linear_attention(q, k, v, impl="torch")
    assert torch.equal(fused_linear_attention(q, k, v, impl="auto"), torch_out)
    assert torch.equal(AF.linear_attention(q, k, v, impl="auto"), torch_out)
    assert torch.equal(
        AF.taylor_attention(q, k, v, impl="torch"), fused_linear_attention(q, k, v, "taylor", impl="torch")
    )


def test_saves_only_inputs_and_state():
    """Backward recomputes the features: saved = q, k, v and the (F, Dv + 1) state [S | z]."""
    q, k, v = make_qkv(2, 3, 50, 16, 8)
    out = fused_linear_attention(q, k, v, impl="torch", chunk=16)
    saved = out.grad_fn.saved_tensors
    assert sum(t.numel() for t in saved) == q.numel() + k.numel() + v.numel() + 2 * 3 * 16 * (8 + 1)


def test_chunking_and_layout_do_not_change_the_result():
    q, k, v = make_qkv(2, 3, 100, 32)
    base = fused_linear_attention(q, k, v, impl="torch")
    base_grads = grads(base, (q, k, v))
    # timm's layout: q, k, v are strided views of one (B, N, 3, H, D) tensor
    qkv = torch.stack([t.detach().transpose(1, 2) for t in (q, k, v)], dim=2).requires_grad_(True)
    qs, ks, vs = qkv.permute(2, 0, 3, 1, 4).unbind(0)
    assert not qs.is_contiguous()
    for chunk in (1, 7, 64, 1000):
        out = fused_linear_attention(qs, ks, vs, impl="torch", chunk=chunk)
        torch.testing.assert_close(out, base, rtol=1e-5, atol=1e-6)
        (dqkv,) = grads(out, (qkv,))
        for i, g in enumerate(base_grads):
            torch.testing.assert_close(dqkv[:, :, i].transpose(1, 2), g, rtol=1e-4, atol=1e-6)


def test_inference_mode_and_autocast():
    """Chunks run on worker threads: they must honour inference mode; autocast must not lower the sums."""
    q, k, v = make_qkv(2, 3, 100, 32, requires_grad=False)
    base = fused_linear_attention(q, k, v, impl="torch", chunk=16)
    with torch.inference_mode():
        torch.testing.assert_close(fused_linear_attention(q, k, v, impl="torch", chunk=16), base)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        torch.testing.assert_close(fused_linear_attention(q, k, v, impl="torch", chunk=16), base)


def test_worker_pool_is_single_threaded_and_leaves_other_threads_alone(monkeypatch):
    import threading

    from vitzoo.kernels import _threads

    monkeypatch.setattr(_threads, "_pools", {})  # a pool made here, whatever earlier tests made
    main = torch.get_num_threads()
    assert _threads.single_threaded_pool(2).map(lambda _: torch.get_num_threads(), range(4)) == [1] * 4
    assert torch.get_num_threads() == main
    seen = []
    thread = threading.Thread(target=lambda: seen.append(torch.get_num_threads()))
    thread.start()
    thread.join()
    assert seen == [main]  # a thread started later gets the creating thread's count, not the workers' 1


def test_many_slices_on_torch_threads_match_few_slices_on_workers():
    """A batch with many (batch x heads) slices runs on torch's intra-op threads, one sample
    (3 slices, enough tokens for two workers) on the worker pool; both give the same values and gradients."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        q, k, v = make_qkv(8, 3, 1400, 16)
        out = fused_linear_attention(q, k, v, impl="torch", chunk=128)
        per_sample = torch.cat(
            [
                fused_linear_attention(q[i : i + 1], k[i : i + 1], v[i : i + 1], impl="torch", chunk=128)
                for i in range(8)
            ]
        )
        torch.testing.assert_close(out, per_sample, rtol=1e-5, atol=1e-6)
        for g, g_ref in zip(grads(out, (q, k, v)), grads(per_sample, (q, k, v))):
            torch.testing.assert_close(g, g_ref, rtol=1e-4, atol=1e-6)
    finally:
        torch.set_num_threads(threads)


def _forward_in_child(args):
    args = [torch.from_numpy(a) for a in args]
    return fused_linear_attention(*args, impl="torch", chunk=256).numpy()  # plain pickling back


def test_forked_child_gets_its_own_workers():
    """DataLoader-style fork after the worker threads exist must not hang (threads do not survive fork).

    The inputs are large enough for the worker path, so nothing in the child touches the parent's
    OpenMP pool (which, like any libgomp pool, does not survive fork either)."""
    import multiprocessing

    q, k, v = make_qkv(1, 2, 2048, 16, requires_grad=False)
    base = fused_linear_attention(q, k, v, impl="torch", chunk=256)
    with multiprocessing.get_context("fork").Pool(1) as pool:
        out = pool.apply_async(_forward_in_child, ((q.numpy(), k.numpy(), v.numpy()),)).get(timeout=120)
    torch.testing.assert_close(torch.from_numpy(out), base)


@pytest.mark.parametrize("feature_map", ["elu", "taylor"])
def test_double_backward_float64(feature_map):
    """create_graph=True gives a differentiable backward (the eager formula's): gradgradcheck."""
    q, k, v = make_qkv(1, 2, 5, 3, dtype=torch.float64)
    assert torch.autograd.gradgradcheck(lambda a, b, c: torch_path(a, b, c, feature_map), (q, k, v))


def test_gradient_penalty_through_shared_qkv_matches_eager():
    """Self-attention (q, k, v one tensor) from a weight: d/dW |d out / dx|^2, each role counted once."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(6, 6, generator=g, dtype=torch.float64, requires_grad=True)
    x = torch.randn(2, 1, 9, 6, generator=g, dtype=torch.float64, requires_grad=True)
    penalties = []
    for impl in ("torch", "eager"):
        qkv = x @ w
        (gx,) = torch.autograd.grad(AF.linear_attention(qkv, qkv, qkv, impl=impl).sum(), x, create_graph=True)
        penalties.append(torch.autograd.grad(gx.pow(2).sum(), w)[0])
    torch.testing.assert_close(*penalties)


def test_torch_func_grad_and_per_sample_grads_match_eager():
    """torch.func: grad, vmap (the mapped dim folded into the batch, or broadcast) and vmap(grad(...))."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 1, 3, 10, 8, generator=g, dtype=torch.float64)
    w = torch.randn(8, 8, generator=g, dtype=torch.float64)

    def loss(impl):
        return lambda w, x: AF.linear_attention(x @ w, x, x @ w.T, impl=impl).pow(2).sum()

    for transform in (lambda f: torch.func.grad(f)(w, x[0]), lambda f: torch.vmap(torch.func.grad(f), (None, 0))(w, x)):
        torch.testing.assert_close(transform(loss("torch")), transform(loss("eager")))
    for in_dims, k in [(0, x), ((0, None, 0), x[0])]:  # k mapped, or one k for every sample
        out = [
            torch.vmap(lambda q, k, v: AF.linear_attention(q, k, v, impl=impl), in_dims)(x, k, -x)
            for impl in ("torch", "eager")
        ]
        torch.testing.assert_close(*out)


def test_torch_func_vjp_and_jacrev_match_eager():
    """torch.func.vjp's function and jacrev run after their transform ended: the analytic backward serves them."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 7, 4, generator=g, dtype=torch.float64) for _ in range(3))
    dout = torch.randn(1, 2, 7, 4, generator=g, dtype=torch.float64)
    found = {}
    for impl in ("torch", "eager"):

        def f(q, k, v, impl=impl):
            return AF.linear_attention(q, k, v, impl=impl)

        _, vjp_fn = torch.func.vjp(f, q, k, v)
        found[impl] = (*vjp_fn(dout), *torch.func.jacrev(f, argnums=(0, 1, 2))(q, k, v))
    for got, want in zip(found["torch"], found["eager"]):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("impl", ["auto", "torch"])
@pytest.mark.parametrize(
    "shapes",
    [
        ((1, 2, 0, 4),) * 3,
        ((1, 2, 5, 4), (1, 2, 0, 4), (1, 2, 0, 3)),
        ((0, 2, 5, 4),) * 3,
        ((1, 2, 5, 4), (1, 2, 3, 4), (1, 2, 3, 0)),
    ],
    ids=["no-tokens", "no-keys", "no-batch", "no-value-dims"],
)
def test_empty_inputs_follow_the_formula(shapes, impl):
    """No tokens, keys, batch or value dims: the formula's (possibly empty) result, zeros without keys."""
    q, k, v = (torch.randn(s, dtype=torch.float64, requires_grad=True) for s in shapes)
    out = fused_linear_attention(q, k, v, impl=impl)
    expected = AF.linear_attention(q, k, v, impl="eager")
    assert out.shape == expected.shape == shapes[0][:3] + shapes[2][3:]
    torch.testing.assert_close(out, expected)
    for g, g_ref in zip(grads(out, (q, k, v)), grads(expected, (q, k, v))):
        torch.testing.assert_close(g, g_ref)


@pytest.mark.parametrize("wanted", [(True, False, False), (False, True, False), (False, False, True)])
def test_partial_requires_grad(wanted):
    q, k, v = make_qkv(1, 2, 40, 16, requires_grad=False)
    full = [t.clone().requires_grad_(True) for t in (q, k, v)]
    expected = grads(fused_linear_attention(*full, impl="torch", chunk=16), full)
    inputs = [t.clone().requires_grad_(w) for t, w in zip((q, k, v), wanted)]
    out = fused_linear_attention(*inputs, impl="torch", chunk=16)
    chosen = [t for t in inputs if t.requires_grad]
    (g,) = grads(out, chosen)
    torch.testing.assert_close(g, expected[wanted.index(True)])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("feature_map", ["elu", "relu"])
def test_half_precision_on_cpu_is_finite_and_close_to_fp32(dtype, feature_map):
    q, k, v = make_qkv(2, 3, 257, 32, dtype=dtype)
    out = fused_linear_attention(q, k, v, feature_map, impl="torch", chunk=64)
    assert out.dtype == dtype
    q32, k32, v32 = [t.detach().float().requires_grad_(True) for t in (q, k, v)]
    ref = fused_linear_attention(q32, k32, v32, feature_map, impl="torch")
    tol = 1e-2 if dtype == torch.float16 else 4e-2  # one rounding of the output / grads
    assert_close_rel(out, ref, tol)
    for g, g32 in zip(grads(out, (q, k, v)), grads(ref, (q32, k32, v32))):
        assert g.dtype == dtype and torch.isfinite(g).all()
        assert_close_rel(g, g32, tol)


def test_fp16_at_64k_tokens_has_no_overflow():
    """z = sum_j phi(k_j) ~ 65k per channel overflows fp16 (max 65504): sums must run in fp32."""
    q, k, v = make_qkv(1, 1, 65536, 16, dtype=torch.float16, requires_grad=False)
    k = k + 1  # elu(k) + 1 ~ 2 on average: z ~ 1.3e5 per channel
    out = fused_linear_attention(q, k, v, impl="torch")
    assert torch.isfinite(out).all()
    assert_close_rel(out, kernel_ref_linear_time(q, k, v), 2e-3)  # the n x n reference would be 32 GB here


def test_bad_inputs_raise_errors_that_name_the_fix():
    q, k, v = make_qkv(1, 2, 8, 16, requires_grad=False)
    with pytest.raises(ValueError, match="impl='torch'"):
        fused_linear_attention(q, k, v, impl="triton")  # CPU tensors without the interpreter
    with pytest.raises(ValueError, match="impl='eager'"):
        fused_linear_attention(q, k, v, impl="eager")
    with pytest.raises(ValueError, match="choose one of"):
        fused_linear_attention(q, k, v, feature_map="softmax")
    with pytest.raises(ValueError, match=r"\(B, H, N, D\)"):
        fused_linear_attention(q[0], k[0], v[0])
    with pytest.raises(ValueError, match="same"):
        fused_linear_attention(q, k[..., :8], v)
    with pytest.raises(ValueError, match="dtype"):
        fused_linear_attention(q, k.double(), v)
    with pytest.raises(ValueError, match="one device"):
        fused_linear_attention(q, k.to("meta"), v)
    with pytest.raises(ValueError, match="chunk"):
        fused_linear_attention(q, k, v, impl="torch", chunk=0)


# (feature map, B, H, Nq, Nk, D, Dv, layout, inputs that want gradients); bhnd: contiguous, bnhd: a
# (B, N, H, D) tensor transposed, packed: timm's (B, N, 3, H, D) qkv tensor (Nq = Nk, D = Dv)
TRITON_CASES = [
    *[
        (fm, b, h, n, n, d, dv, "bhnd", "qkv")
        for fm in ("elu", "relu")
        for b, h, n, d, dv in [(1, 1, 1, 16, 16), (1, 7, 17, 32, 32), (2, 1, 130, 16, 24), (1, 2, 70, 64, 64)]
    ],
    ("elu", 2, 3, 200, 300, 48, 80, "bhnd", "qkv"),  # several splits on both sides (interpreter: 64-token blocks)
    ("relu", 1, 1, 300, 90, 20, 20, "bnhd", "qkv"),  # several blocks per split in the dq kernel
    ("elu", 2, 2, 33, 65, 20, 48, "bnhd", "q"),
    ("relu", 2, 2, 65, 33, 48, 16, "bhnd", "k"),
    ("elu", 2, 2, 45, 45, 32, 32, "packed", "v"),
    ("identity", 1, 2, 70, 70, 32, 32, "bhnd", "qkv"),  # precomputed features (positive)
    ("identity", 2, 1, 40, 90, 256, 64, "bnhd", "qkv"),  # 256 features, 64 value channels
]

_TRITON_SCRIPT = textwrap.dedent("""
    import json, os, sys
    assert os.environ["TRITON_INTERPRET"] == "1"
    import torch
    from vitzoo.attention import functional as AF
    from vitzoo.kernels import fused_linear_attention
    from attention_reference import kernel_ref, phi
    from test_kernels import assert_close_rel, grads

    def inputs(b, h, nq, nk, d, dv, layout):
        g = torch.Generator().manual_seed(0)
        if layout == "packed":
            return torch.randn(b, nq, 3, h, d, generator=g).permute(2, 0, 3, 1, 4).unbind(0)
        if layout == "bnhd":
            return [torch.randn(b, n, h, w, generator=g).transpose(1, 2) for n, w in ((nq, d), (nk, d), (nk, dv))]
        return [torch.randn(b, h, n, w, generator=g) for n, w in ((nq, d), (nk, d), (nk, dv))]

    checked = []
    for fm, b, h, nq, nk, d, dv, layout, wanted in json.loads(sys.argv[1]):
        q, k, v = inputs(b, h, nq, nk, d, dv, layout)
        if fm == "identity":  # features are positive: exp of a Gaussian (the layout is kept)
            q, k = q.exp(), k.exp()
        chosen = [t.requires_grad_(True) for t, name in zip((q, k, v), "qkv") if name in wanted]
        out = fused_linear_attention(q, k, v, fm, impl="triton")
        ref = kernel_ref(q, k, v, fm)[0]
        assert out.shape == (b, h, nq, dv) and out.dtype == torch.float32
        assert_close_rel(out, ref, 1e-5)
        for g, g_ref in zip(grads(out, chosen), grads(ref, chosen), strict=True):
            assert_close_rel(g, g_ref, 1e-4)
        assert torch.equal(fused_linear_attention(q, k, v, fm, impl="triton"), out)  # deterministic
        checked.append(fm)
    w = torch.randn(16, 16, generator=torch.Generator().manual_seed(0), requires_grad=True)
    x = torch.randn(1, 2, 40, 16, generator=torch.Generator().manual_seed(1), requires_grad=True)
    penalties = []
    for impl in ("triton", "eager"):  # create_graph=True: a differentiable backward
        qkv = x @ w
        (gx,) = torch.autograd.grad(AF.linear_attention(qkv, qkv, qkv, impl=impl).sum(), x, create_graph=True)
        penalties.append(torch.autograd.grad(gx.pow(2).sum(), w)[0])
    assert_close_rel(*penalties, 1e-4)
    xs = torch.randn(3, 1, 2, 40, 16, generator=torch.Generator().manual_seed(2))
    vmapped = [torch.vmap(lambda a: AF.linear_attention(a, a, a, impl=impl))(xs) for impl in ("triton", "eager")]
    assert_close_rel(*vmapped, 1e-5)
    from vitzoo.kernels.triton_linear import triton_backward, triton_forward

    q, k, v = (torch.randn(1, 2, 40, 16, generator=torch.Generator().manual_seed(i)) for i in range(3))
    out, S, z = triton_forward(q, k, v, "elu", 1e-6)  # 40 tokens: one split, its partial is the state
    assert S.is_contiguous() and z.is_contiguous()
    assert_close_rel(S, (phi(k.double(), "elu").transpose(-2, -1) @ v.double()).flatten(0, 1), 1e-5)
    dout = torch.randn_like(out)
    dense = triton_backward(dout, q, k, v, S, z, "elu", 1e-6, [True] * 3)
    strided = (S.transpose(1, 2).contiguous().transpose(1, 2), torch.stack([z, z], -1)[..., 0])
    assert not any(t.is_contiguous() for t in strided)  # a saved state handed back strided: same gradients
    assert all(map(torch.equal, dense, triton_backward(dout, q, k, v, *strided, "elu", 1e-6, [True] * 3)))
    for dtype, tol in ((torch.float16, 2e-3), (torch.bfloat16, 1e-2)):  # tf32x3 / tf32 dots, fp32 sums
        half = [t.to(dtype) for t in (q, k, v)]
        out = fused_linear_attention(*half, impl="triton")
        assert out.dtype == dtype
        assert_close_rel(out, kernel_ref(*[t.double() for t in half], "elu")[0], tol)
    empty = fused_linear_attention(*[torch.randn(0, 2, 5, 16)] * 3, impl="triton")  # nothing to launch
    assert empty.shape == (0, 2, 5, 16)
    try:
        fused_linear_attention(q, k, v, "taylor", impl="triton")
        taylor = "ran"
    except ValueError as err:
        taylor = str(err)
    print(json.dumps({"checked": checked, "taylor": taylor}))
""")


@pytest.mark.slow
@pytest.mark.skipif(not triton_available(), reason="triton does not import here")
def test_triton_kernels_under_the_interpreter():
    """Forward and backward Triton kernels (elu, relu, identity) in fp32 vs the float64 reference, on TRITON_CASES."""
    env = dict(
        os.environ,
        TRITON_INTERPRET="1",
        PYTHONPATH=os.pathsep.join([os.path.dirname(__file__), os.environ.get("PYTHONPATH", "")]),
    )
    proc = subprocess.run(
        [sys.executable, "-c", _TRITON_SCRIPT, json.dumps(TRITON_CASES)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(report["checked"]) == len(TRITON_CASES)
    assert "impl='torch'" in report["taylor"]


@pytest.mark.skipif(not triton_available(), reason="triton does not import here")
def test_triton_launch_grids_fit_cuda_limits():
    """B*H goes on grid axis 0 (up to 2^31 - 1), so axes 1 and 2 stay within CUDA's 65,535 for any B*H."""
    from vitzoo.kernels.triton_linear import REDUCE_BLOCK_N, _block_grid, _split

    for bh, n in [(1, 1), (1, 16384), (1, 2**22), (64, 16384), (200_000, 1), (200_000, 16384)]:
        for block in (32, 64, 128):
            assert _block_grid(bh, n)({"BLOCK_N": block}) == (bh * -(-n // block),)
            assert bh * -(-n // block) < 2**31
        for sms in (None, 132):
            splits, per_split = _split(bh, n, sms)  # the reductions' grid is (bh, splits)
            assert 1 <= splits <= 65535 and per_split % REDUCE_BLOCK_N == 0
            assert (splits - 1) * per_split < n <= splits * per_split
            if sms and bh * n >= 4 * sms * 512:  # enough work: >= 512 tokens a split, >= 2 programs per SM
                assert per_split >= 512 and bh * splits >= 2 * sms
    assert _split(1, 16384, 132) == (32, 512)  # 0.5 MB of fp32 partials at D = Dv = 64, not 4 MB


def test_both_compiled_kernels_number_the_feature_maps_as_the_table_does():
    """KERNEL_MAPS (feature_maps.FUSED_MAPS' kernel column) is the one place a map gets its number: the C++
    kernel's Map enum and the Triton kernels' _phi / _dphi branches must read it the same way."""
    import re

    kernels = Path(CK.__file__).parent
    enum = re.search(r"enum Map : int64_t \{([^}]*)\}", (kernels / "csrc" / "linear_attention_cpu.cpp").read_text())
    cpp = {name.strip()[1:].lower(): int(number) for name, number in re.findall(r"(k\w+) = (\d+)", enum[1])}
    assert cpp == KERNEL_MAPS
    triton_source = (kernels / "triton_linear.py").read_text()
    for fn in ("_phi", "_dphi"):
        body = triton_source.split(f"def {fn}(", 1)[1].split("\n\n", 1)[0]
        branches = [int(n) for n in re.findall(r"if FEATURE == (\d+):", body)]
        # elu and relu have a branch each; identity, the last number, is the fall-through
        assert branches == [KERNEL_MAPS["elu"], KERNEL_MAPS["relu"]] and KERNEL_MAPS["identity"] == 2, (fn, body)
