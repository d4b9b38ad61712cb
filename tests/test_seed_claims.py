"""The numeric claims of docs/mechanisms.md section 6, checked through vitzoo's attention functions.

Entropy with cosine logits at temperature 1: the seed says the row entropy never falls below
about log n - 0.3278, the value of the half +1 / half -1 case. That case is computed exactly
below, but it is NOT the minimum. With s_j = cos in [-1, 1], dH/ds_j = -p_j (s_j - sum_i p_i s_i)
and d2H/ds_j2 = -p_j (1 - p_j) < 0 at an interior stationary point, so the minimum puts every
s_j at +-1; with a fraction a at +1, H - log n = f(a) = log(a e + (1-a)/e) - (a e - (1-a)/e) / (a e + (1-a)/e),
minimal at a ~ 0.2055 where f = -0.4745 (tight as n grows). The tests pin the true bound and
show the seed's one failing.

Noise: with i.i.d. logit noise the softmax output approaches the clean one as n grows (the
E[e^eps] factor cancels only in the limit), and so does kernel attention with the per-key factor.
"""

import math

import pytest
import torch
import torch.nn.functional as F

from vitzoo.attention import functional as AF

from attention_reference import single_thread  # noqa: F401  (autouse fixture: one intra-op thread)

FP32 = 1e-4  # softmax_probs returns fp32 probabilities: entropies are good to ~1e-5 at n = 1000
SEED_GAP = math.log(math.cosh(1.0)) - math.tanh(1.0)  # -0.3278133..., the half/half value


def _gap(alpha):
    z = alpha * math.e + (1 - alpha) / math.e
    return torch.log(z) - (alpha * math.e - (1 - alpha) / math.e) / z


TRUE_GAP = float(_gap(torch.linspace(0, 1, 2_000_001, dtype=torch.float64)).min())  # -0.47447...


def cosine_entropy_gap(q, k):
    """H - log n of softmax(cos(q, k) / 1) rows, through the code under test (scale = 1/tau = 1)."""
    q, k = F.normalize(q.double(), dim=-1), F.normalize(k.double(), dim=-1)
    p = AF.softmax_probs(q, k, scale=1.0).double()
    h = -torch.where(p > 0, p * p.log(), torch.zeros_like(p)).sum(-1)
    return h - math.log(k.shape[-2])


def plus_minus_keys(n, n_plus, d=3, seed=0):
    """A unit query and n keys: n_plus equal to it (cos = +1), the rest opposite (cos = -1)."""
    q = F.normalize(torch.randn(1, 1, 1, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64), dim=-1)
    signs = torch.tensor([1.0] * n_plus + [-1.0] * (n - n_plus), dtype=torch.float64)
    return q, signs.view(1, 1, n, 1) * q


def test_constants():
    assert SEED_GAP == pytest.approx(-0.3278133, abs=1e-7)
    assert TRUE_GAP == pytest.approx(-0.474475, abs=1e-5)


@pytest.mark.parametrize("n", [2, 10, 100, 1000])
def test_half_half_case_gives_the_seed_value(n):
    assert float(cosine_entropy_gap(*plus_minus_keys(n, n // 2))) == pytest.approx(SEED_GAP, abs=FP32)


def test_half_half_case_approaches_the_seed_value_for_odd_n():
    errors = [abs(float(cosine_entropy_gap(*plus_minus_keys(n, (n + 1) // 2))) - SEED_GAP) for n in (3, 11, 101, 1001)]
    assert errors == sorted(errors, reverse=True) and errors[-1] < 1e-3 < errors[0]  # O(1/n)


@pytest.mark.parametrize("d", [16, 64])
def test_random_unit_vectors_stay_above_the_seed_bound_at_head_sizes(d):
    """Typical queries and keys (cosines concentrate near 0) never reach log n - 0.3278."""
    g = torch.Generator().manual_seed(d)
    for n in (4, 16, 256):
        trials = 4000 if n < 100 else 200
        gap = cosine_entropy_gap(torch.randn(trials, 1, 1, d, generator=g), torch.randn(trials, 1, n, d, generator=g))
        assert float(gap.min()) >= SEED_GAP
        assert float(gap.max()) <= 1e-12


def test_seed_bound_is_not_a_lower_bound():
    """One key along the query and four against it: H = log 5 - 0.474 < log 5 - 0.3278."""
    gap = float(cosine_entropy_gap(*plus_minus_keys(5, 1)))
    assert gap < SEED_GAP - 0.1
    assert gap == pytest.approx(float(_gap(torch.tensor(0.2, dtype=torch.float64))), abs=FP32)
    # Plain random unit vectors in 2-D break it too, a few percent of the time for n = 4.
    g = torch.Generator().manual_seed(0)
    gaps = cosine_entropy_gap(torch.randn(4000, 1, 1, 2, generator=g), torch.randn(4000, 1, 4, 2, generator=g))
    assert int((gaps < SEED_GAP).sum()) > 20


@pytest.mark.parametrize("d", [2, 3])
def test_entropy_never_falls_below_the_true_bound(d):
    g = torch.Generator().manual_seed(10 + d)
    for n in (2, 3, 4, 8, 64):
        gaps = cosine_entropy_gap(torch.randn(4000, 1, 1, d, generator=g), torch.randn(4000, 1, n, d, generator=g))
        assert float(gaps.min()) >= TRUE_GAP - FP32
    for n in (2, 5, 9, 64):  # every extreme configuration (the candidates for the minimum)
        gaps = [float(cosine_entropy_gap(*plus_minus_keys(n, m, d))) for m in range(n + 1)]
        assert min(gaps) >= TRUE_GAP - FP32


def test_true_bound_is_approached_as_n_grows():
    best = {
        n: min(float(cosine_entropy_gap(*plus_minus_keys(n, m))) for m in range(n // 10, n // 3))
        for n in (10, 100, 1000)
    }
    assert best[10] > best[100] > best[1000] >= TRUE_GAP - FP32
    assert best[1000] - TRUE_GAP < FP32


# -- robustness to i.i.d. logit noise --------------------------------------------------------------
NOISY = {
    "softmax_fused": lambda q, k, v, s: AF.softmax_attention(q, k, v, logit_noise=s),
    "softmax_eager": lambda q, k, v, s: AF.softmax_attention(q, k, v, logit_noise=s, fused=False),
    "linear_elu": lambda q, k, v, s: AF.linear_attention(q, k, v, "elu", impl="eager", logit_noise=s),
}


@pytest.mark.parametrize("name", sorted(NOISY))
def test_noisy_output_approaches_clean_output_as_n_grows(name):
    """Relative error |o~ - o| / |o| averaged over 64 rows shrinks with n (about n^-1/2)."""
    torch.manual_seed(0)
    rows, sigma, errors = 64, 0.5, []
    for n in (16, 256, 4096):
        q = torch.randn(rows, 1, 1, 4)
        k = torch.randn(rows, 1, n, 4)
        v = torch.randn(rows, 1, n, 8) + 1.0 + k[..., :1]  # values correlated with the keys
        clean = NOISY[name](q, k, v, 0.0)
        noisy = NOISY[name](q, k, v, sigma)
        errors.append(float(((noisy - clean).norm(dim=-1) / clean.norm(dim=-1)).mean()))
    assert errors[0] > errors[1] > errors[2], errors
    assert errors[2] < 0.3 * errors[0], errors  # n^-1/2 predicts 1/16
    assert errors[2] < 0.06, errors
