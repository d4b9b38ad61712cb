"""Plain eager calls run the fused path's function without the custom op's dispatch; every tracer, transform,
dispatch mode and the profiler still sees the op (vitzoo.kernels.ops._direct)."""

from __future__ import annotations

import subprocess
import sys
import warnings

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import vitzoo.kernels.ops as ops
from vitzoo.kernels import fused_linear_attention, naive_linear_attention


def _qkv(requires_grad=False):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(2, 3, 37, 8, generator=g, requires_grad=requires_grad) for _ in range(3)]


def _refuse_ops(monkeypatch):
    for name in ("linear_attention_op", "linear_attention_backward_op"):
        monkeypatch.setattr(ops, name, lambda *args, name=name: pytest.fail(f"{name} ran on a plain eager call"))


@pytest.mark.parametrize("use_kernel", [None, False])
def test_plain_eager_calls_skip_the_op_and_match_the_formula(monkeypatch, use_kernel):
    """Inference and a backward on plain tensors never reach the op, and give the naive formula's values."""
    q, k, v = _qkv(requires_grad=True)
    wide = [x.detach().double().requires_grad_() for x in (q, k, v)]
    expected = naive_linear_attention(*wide, "elu")
    dout = torch.randn_like(expected)
    expected_grads = torch.autograd.grad(expected, wide, dout)
    _refuse_ops(monkeypatch)
    with torch.no_grad():
        out = fused_linear_attention(q, k, v, use_kernel=use_kernel)
    assert not out.requires_grad
    torch.testing.assert_close(out, expected.detach().float(), rtol=1e-5, atol=1e-6)
    out = fused_linear_attention(q, k, v, use_kernel=use_kernel)
    assert out.grad_fn is not None
    for grad, want in zip(torch.autograd.grad(out, (q, k, v), dout.float()), expected_grads):
        torch.testing.assert_close(grad, want.float(), rtol=1e-4, atol=1e-5)


class _OpLog(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func.overloadpacket))
        return func(*args, **(kwargs or {}))


def test_dispatch_modes_see_the_op():
    """Under a dispatch mode (what make_fx, FakeTensorMode and flop counters are) the forward and backward are ops."""
    q, k, v = _qkv(requires_grad=True)
    with _OpLog() as log:
        out = fused_linear_attention(q, k, v)
        torch.autograd.grad(out.sum(), (q, k, v))
    assert "vitzoo.linear_attention" in log.names
    assert "vitzoo.linear_attention_backward" in log.names


def test_the_profiler_sees_the_op():
    """A profile names the op (the direct path would leave only the kernel's time, unlabelled)."""
    q, k, v = _qkv()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof, torch.no_grad():
        fused_linear_attention(q, k, v)
    assert any(event.key == "vitzoo::linear_attention" for event in prof.key_averages())


def test_functorch_transforms_and_make_fx_see_the_op():
    """vmap and make_fx run through the op (their rules and tracing need it) and agree with the direct call."""
    q, k, v = _qkv()
    direct = fused_linear_attention(q, k, v)
    mapped = torch.vmap(lambda a, b, c: fused_linear_attention(a, b, c))(*(x.unsqueeze(1) for x in (q, k, v)))
    torch.testing.assert_close(mapped.squeeze(1), direct)
    graph = torch.fx.experimental.proxy_tensor.make_fx(lambda a, b, c: fused_linear_attention(a, b, c))(q, k, v)
    assert any(node.target is torch.ops.vitzoo.linear_attention.default for node in graph.graph.nodes)
    torch.testing.assert_close(graph(q, k, v), direct)


def test_jit_trace_records_the_call():
    """A jit trace of a direct call holds the op (a trace of the direct path would hold its result as a constant)."""
    q, k, v = _qkv()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # jit.trace's deprecation notice
        traced = torch.jit.trace(lambda a, b, c: fused_linear_attention(a, b, c), (q, k, v))
    others = [torch.randn_like(x) for x in (q, k, v)]
    torch.testing.assert_close(traced(*others), fused_linear_attention(*others))


def test_forward_mode_ad_is_refused_not_dropped():
    """Under a forward-AD level the op runs, which refuses dual inputs (the direct path would drop their tangents)."""
    q, k, v = _qkv()
    with torch.autograd.forward_ad.dual_level():
        dual = torch.autograd.forward_ad.make_dual(q, torch.randn_like(q))
        with pytest.raises(RuntimeError, match="jvp"):
            fused_linear_attention(dual, k, v)


def test_batched_gradients_run_the_op():
    """autograd.grad(is_grads_batched=True) (a legacy-vmap batch in backward) equals one backward per row."""
    q, k, v = _qkv(requires_grad=True)
    out = fused_linear_attention(q, k, v)
    rows = torch.randn(3, *out.shape)
    batched = torch.autograd.grad(out, (q, k, v), rows, is_grads_batched=True, retain_graph=True)
    for i, row in enumerate(rows):
        for got, want in zip(batched, torch.autograd.grad(out, (q, k, v), row, retain_graph=True)):
            torch.testing.assert_close(got[i], want)


def test_dispatch_subclasses_and_meta_tensors_run_the_op():
    """A __torch_dispatch__ wrapper subclass gets the op (each of its halves the right values); meta tensors get the
    op's fake impl (shapes, no kernel)."""
    from torch.testing._internal.two_tensor import TwoTensor

    q, k, v = _qkv()
    out = fused_linear_attention(TwoTensor(q, 2 * q), TwoTensor(k, k), TwoTensor(v, v))
    torch.testing.assert_close(out.a, fused_linear_attention(q, k, v))
    torch.testing.assert_close(out.b, fused_linear_attention(2 * q, k, v))
    meta = fused_linear_attention(*(x.to("meta") for x in (q, k, v)))
    assert meta.is_meta and meta.shape == q.shape[:3] + v.shape[3:]


def test_a_users_kernel_for_the_op_runs(tmp_path):
    """A kernel a user registers for the op runs (in a fresh interpreter: registrations last for the process)."""
    script = tmp_path / "register.py"
    script.write_text(
        "import torch\n"
        "from vitzoo.kernels import fused_linear_attention\n"
        "from vitzoo.kernels.ops import linear_attention_op\n"
        "calls = []\n"
        "@linear_attention_op.register_kernel('cpu')\n"
        "def _(q, k, v, *args):\n"
        "    calls.append(1)\n"
        "    return torch.zeros_like(v), q.new_zeros(2, 4, 4), q.new_zeros(2, 4)\n"
        "q = torch.randn(1, 2, 5, 4)\n"
        "with torch.no_grad():\n"
        "    out = fused_linear_attention(q, q, q)\n"
        "assert calls and not out.any(), 'the registered kernel did not run'\n"
    )
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.parametrize("chunk", [16.0, True, "8"])
def test_a_chunk_that_is_no_int_is_refused(chunk):
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="chunk must be a positive int"):
        fused_linear_attention(q, k, v, impl="torch", chunk=chunk)
