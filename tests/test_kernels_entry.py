"""vitzoo.kernels.fused_linear_attention routes each call to one path and ignores no argument it was given."""

from __future__ import annotations

import pytest
import torch

import vitzoo.kernels as kernels
from vitzoo.kernels import fused_linear_attention, naive_linear_attention


def _qkv():
    g = torch.Generator().manual_seed(0)
    return [torch.randn(1, 2, 9, 4, generator=g) for _ in range(3)]


@pytest.mark.parametrize("options", [{"chunk": 4}, {"use_kernel": False}, {"chunk": 4, "use_kernel": True}])
def test_torch_path_options_are_refused_where_triton_runs(monkeypatch, options):
    """Where the Triton kernels serve the inputs, chunk / use_kernel (the torch path's) raise instead of vanishing."""
    monkeypatch.setattr(kernels, "_triton_refusal", lambda q, v, feature_map: None)  # as if Triton served them
    monkeypatch.setattr(kernels, "fused_linear", lambda *args: pytest.fail("a path ran despite the refusal"))
    with pytest.raises(ValueError, match=r"would be ignored: impl='triton' .* pass impl='torch'") as err:
        fused_linear_attention(*_qkv(), impl="triton", **options)
    assert all(name in str(err.value) for name in options)


def test_torch_path_options_reach_the_torch_path():
    """impl='auto' on CPU tensors runs the torch path, which takes the options (and matches the naive formula)."""
    q, k, v = _qkv()
    expected = naive_linear_attention(q, k, v, "elu")
    for options in ({"chunk": 4}, {"use_kernel": False}, {"chunk": 2, "use_kernel": False}):
        torch.testing.assert_close(fused_linear_attention(q, k, v, impl="auto", **options), expected)
