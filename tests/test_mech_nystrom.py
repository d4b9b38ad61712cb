"""Nyström attention against a float64 reference written from the formula (docs/mechanisms.md, section 8)."""

import itertools
import math

import pytest
import torch
import torch.nn.functional as F

from vitzoo.attention import build_attention
from vitzoo.attention.nystrom import iterative_pinv, nystrom_attention, nystrom_probs, segment_means

from attention_reference import module_out, module_qkv, single_thread, softmax_ref, softmax_rows  # noqa: F401
from mech_checks import backward_at_both_resolutions, gradcheck_module

DIM, HEADS, N = 16, 2, 13  # 13 tokens: 4 landmarks make segments of 3, 3, 3, 4
HD = DIM // HEADS


def build(seed=0, **options):
    torch.manual_seed(seed)
    return build_attention({"name": "nystrom", **options}, DIM, num_heads=HEADS, qkv_bias=True).double()


# -- float64 reference -------------------------------------------------------------------------------
def ref_landmarks(x, m):
    """The official image code's segments: m - n % m of n // m tokens, then n % m of n // m + 1; landmarks are
    their means."""
    n = x.shape[-2]
    sizes = [n // m] * (m - n % m) + [n // m + 1] * (n % m)
    return torch.stack([part.mean(-2) for part in x.split(sizes, dim=-2)], -2)


def ref_pinv(a, iterations):
    """The paper's iteration, one matrix at a time, from Z_0 = A^T / (max column sum * max row sum)."""
    out = torch.empty_like(a)
    eye = torch.eye(a.shape[-1], dtype=a.dtype)
    for idx in itertools.product(*map(range, a.shape[:-2])):
        A = a[idx]
        Z = A.T / (A.abs().sum(0).max() * A.abs().sum(1).max())
        for _ in range(iterations):
            Z = Z @ (13 * eye - A @ Z @ (15 * eye - A @ Z @ (7 * eye - A @ Z))) / 4
        out[idx] = Z
    return out


def ref_nystrom(q, k, v, m, iterations=6, scale=None, landmark_scale=None, noise=(0, 0, 0), conv=None):
    """(out, implied matrix); exact softmax for m >= n (the official code's switch); ``conv`` (H, kernel):
    out_i += sum_t w[t] v_(i + t - r), zero-padded."""
    scale = scale or q.shape[-1] ** -0.5
    landmark_scale = landmark_scale or q.shape[-1] ** -0.5
    if m >= q.shape[-2]:
        attn = softmax_rows(q @ k.transpose(-2, -1) * scale + noise[0])
    else:
        ql, kl = ref_landmarks(q, m), ref_landmarks(k, m)
        f = softmax_rows(q @ kl.transpose(-2, -1) * landmark_scale + noise[0])
        z = ref_pinv(softmax_rows(ql @ kl.transpose(-2, -1) * landmark_scale + noise[1]), iterations)
        b = softmax_rows(ql @ k.transpose(-2, -1) * scale + noise[2])
        attn = f @ z @ b
    out = attn @ v
    if conv is not None:
        r, n = conv.shape[-1] // 2, v.shape[-2]
        vp = F.pad(v, (0, 0, r, r))
        out = out + sum(conv[:, t, None, None] * vp[..., t : t + n, :] for t in range(conv.shape[-1]))
    return out, attn


def ref_module(m, x, **kw):
    q, k, v = module_qkv(m, x)
    conv = None if m.conv is None else m.conv.weight[:, 0, :, 0].detach()
    out, attn = ref_nystrom(q, k, v, min(m.num_landmarks, x.shape[1]), m.pinv_iterations, conv=conv, **kw)
    return module_out(m, out), attn


# -- the formula -------------------------------------------------------------------------------------
def test_iterative_pinv_converges_to_the_moore_penrose_inverse():
    a = torch.randn(2, 3, 6, 6, dtype=torch.float64).softmax(-1)
    torch.testing.assert_close(iterative_pinv(a, 6), ref_pinv(a, 6), rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(iterative_pinv(a, 30), torch.linalg.pinv(a), rtol=1e-8, atol=1e-8)


@pytest.mark.parametrize(
    "options",
    [
        {"num_landmarks": 4},
        {"num_landmarks": 4, "conv_kernel": 3},
        {"num_landmarks": 5, "heads": "projected", "head_dim": 4},
    ],
    ids=str,
)
def test_module_matches_the_reference(options):
    m = build(**options)
    x = torch.randn(2, N, DIM, dtype=torch.float64)
    want, attn = ref_module(m, x)
    torch.testing.assert_close(m(x), want, rtol=1e-10, atol=1e-10)
    q, k, _ = m.project(x)
    index = torch.tensor([0, 6, N - 1])
    implied = attn if m.conv is None else attn + _band(m.conv.weight[:, 0, :, 0].detach(), N)
    torch.testing.assert_close(m.probs(x, q, k, None, False, index), implied[:, :, index], rtol=1e-10, atol=1e-10)


def _band(w, n):
    """(1, H, n, n) matrix of the zero-padded convolution: entry (i, j) = w[j - i + r]."""
    r = w.shape[-1] // 2
    out = torch.zeros(1, w.shape[0], n, n, dtype=w.dtype)
    for i, j in itertools.product(range(n), range(n)):
        if abs(j - i) <= r:
            out[0, :, i, j] = w[:, j - i + r]
    return out


@pytest.mark.parametrize("landmarks", [N, N + 3])
def test_every_token_a_landmark_is_exact_softmax_attention(landmarks):
    """m >= n: softmax(QK^T) V itself, as the official code switches to (not F pinv(A) B, whose 6 iterations would
    leave an error near 1e-2); in the module too, where fewer tokens than landmarks reach it."""
    q, k, v = (torch.randn(2, HEADS, N, HD, dtype=torch.float64) for _ in range(3))
    want, attn = softmax_ref(q, k, v)
    torch.testing.assert_close(nystrom_attention(q, k, v, num_landmarks=landmarks), want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(nystrom_probs(q, k, landmarks), attn, rtol=1e-12, atol=1e-12)
    m = build(num_landmarks=landmarks, conv_kernel=3)
    x = torch.randn(2, N, DIM, dtype=torch.float64)
    torch.testing.assert_close(m(x), ref_module(m, x)[0], rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("n, m, sizes", [(65, 16, [4] * 15 + [5]), (50, 16, [3] * 14 + [4] * 2), (12, 4, [3] * 4)])
def test_segments_put_the_longer_ones_last(n, m, sizes):
    """The zoo's 65 tokens with 16 landmarks: fifteen segments of 4, then one of 5 (the official image code)."""
    x = torch.arange(n, dtype=torch.float64)[:, None]
    ends = torch.tensor(sizes).cumsum(0)
    starts = ends - torch.tensor(sizes)
    torch.testing.assert_close(segment_means(x, m)[:, 0], (starts + ends - 1).double() / 2)


def test_log_n_scales_each_softmax_by_its_own_key_count():
    """n = 13 tokens against 20 at training; the landmark softmaxes see min(m, n) keys (12 built, so 12 vs 12
    and 16 vs 13)."""
    x = torch.randn(2, N, DIM, dtype=torch.float64)
    for m_built, train in ((12, 20), (16, 20)):
        m = build(num_landmarks=m_built, scale="log_n", train_tokens=train)
        keys = min(m_built, N)
        scale = math.sqrt(HD) / math.log(train) * math.log(N) / HD
        landmark_scale = math.sqrt(HD) / math.log(min(m_built, train)) * math.log(keys) / HD
        want, _ = ref_module(m, x, scale=scale, landmark_scale=landmark_scale)
        torch.testing.assert_close(m(x), want, rtol=1e-10, atol=1e-10)


def test_logit_noise_on_all_three_softmaxes_in_training_only():
    sigma, m_ = 0.5, 4
    m = build(num_landmarks=m_, logit_noise=sigma)
    x = torch.randn(2, N, DIM, dtype=torch.float64)
    torch.manual_seed(3)
    noisy = m(x)
    torch.manual_seed(3)
    noise = [torch.randn(2, HEADS, *shape, dtype=torch.float64) * sigma for shape in ((N, m_), (m_, m_), (m_, N))]
    torch.testing.assert_close(noisy, ref_module(m, x, noise=noise)[0], rtol=1e-10, atol=1e-10)
    m.eval()
    state = torch.get_rng_state()
    torch.testing.assert_close(m(x), ref_module(m, x)[0], rtol=1e-10, atol=1e-10)
    assert torch.equal(torch.get_rng_state(), state)  # sigma applies in training only; eval draws nothing


def test_gradcheck():
    m = build(num_landmarks=3, conv_kernel=3)
    x = torch.randn(1, 7, DIM, dtype=torch.float64, requires_grad=True)
    assert gradcheck_module(m, x, fast_mode=True)


# -- backbones and errors ------------------------------------------------------------------------------
def test_vit_and_nonlocal_resnet_at_twice_the_resolution():
    spec = {"name": "nystrom", "num_landmarks": 4, "conv_kernel": 3}
    for model in backward_at_both_resolutions(spec):
        assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_errors_name_the_fix():
    with pytest.raises(ValueError, match="num_landmarks must be a positive integer"):
        build(num_landmarks=0)
    with pytest.raises(ValueError, match="conv_kernel must be an odd"):
        build(conv_kernel=4)
    with pytest.raises(ValueError, match="pinv_iterations"):
        build(pinv_iterations=0)
    with pytest.raises(ValueError, match="attn_drop_rate=0"):
        build_attention("nystrom", DIM, num_heads=HEADS, attn_drop=0.1)
    with pytest.raises(ValueError, match="train_tokens"):
        build(scale="log_n")
