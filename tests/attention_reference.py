"""Float64 references written straight from docs/mechanisms.md, independent of vitzoo's code.

Tensors are (B, H, N, D) like ``vitzoo.attention.functional``. Every function returns
``(out, A)``: the output and the (implied) attention matrix whose rows mix the values.
"""

import math

import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def single_thread():
    """These tests use tiny tensors: one intra-op thread avoids oversubscription on a shared CPU."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def softmax_ref(q, k, v, scale=None, mask=None, noise=None):
    """softmax(q k^T * scale + mask + noise) v; a bool mask keeps True, a float mask is added."""
    q, k, v = q.double(), k.double(), v.double()
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    logits = (q @ k.transpose(-2, -1)) * scale
    if mask is not None:
        logits = logits + (torch.where(mask, 0.0, -math.inf) if mask.dtype == torch.bool else mask.double())
    if noise is not None:
        logits = logits + noise.double()
    a = softmax_rows(logits)
    return a @ v, a


def softmax_rows(logits):
    """exp(l_ij) / sum_j exp(l_ij) over the last dim (shifted by the row's max)."""
    e = torch.exp(logits - logits.amax(dim=-1, keepdim=True))
    return e / e.sum(dim=-1, keepdim=True)


def phi(x, feature_map):
    """The feature maps in float64: elu + 1, relu, taylor = [1, x / |x|] (so phi(q).phi(k) = 1 + cos(q, k)),
    identity (features computed beforehand); a callable is a mechanism's own map, applied as it is."""
    x = x.double()
    if callable(feature_map):
        return feature_map(x)
    if feature_map == "elu":
        return torch.where(x > 0, x + 1.0, torch.exp(x.clamp(max=0.0)))  # no inf (or NaN gradient) for large x
    if feature_map == "relu":
        return torch.clamp(x, min=0.0)
    if feature_map == "taylor":
        unit = x / x.norm(dim=-1, keepdim=True).clamp_min(1e-6)
        return torch.cat([torch.ones_like(x[..., :1]), unit], dim=-1)
    if feature_map == "identity":
        return x
    raise ValueError(f"no float64 reference for feature map {feature_map!r}")


def kernel_sim(q, k, feature_map):
    """sim(q_i, k_j) = phi(q_i).phi(k_j) >= 0."""
    return phi(q, feature_map) @ phi(k, feature_map).transpose(-2, -1)


def kernel_ref(q, k, v, feature_map="elu", eps=1e-6, causal=False, key_noise=None):
    """out_i = sum_j sim_ij v_j / (sum_j sim_ij + eps) through the n x n matrix (over keys j <= i when causal);
    key noise is the factor exp(eps_j) on key j."""
    sim = kernel_sim(q, k, feature_map)
    if key_noise is not None:  # (B, H, Nk, 1) -> a factor on column j
        sim = sim * torch.exp(key_noise.double()).transpose(-2, -1)
    if causal:
        sim = sim.tril()
    a = sim / (sim.sum(dim=-1, keepdim=True) + eps)
    return a @ v.double(), a


def kernel_ref_linear_time(q, k, v, feature_map="elu", eps=1e-6):
    """kernel_ref's output summed over the keys first: phi(q) S / (phi(q).z + eps), S = sum_j phi(k_j)^T v_j,
    z = sum_j phi(k_j); memory linear in the token count (the n x n form is 32 GB at 65,536 tokens)."""
    fq, fk = phi(q, feature_map), phi(k, feature_map)
    return (fq @ (fk.transpose(-2, -1) @ v.double())) / (fq @ fk.sum(-2).unsqueeze(-1) + eps)


def efficient_ref(q, k, v, key_noise=None):
    """softmax over the D channels of each query, softmax over the N tokens of each key channel."""
    q, k, v = q.double(), k.double(), v.double()
    if key_noise is not None:
        k = k + key_noise.double()
    eq = torch.exp(q - q.amax(dim=-1, keepdim=True))
    qs = eq / eq.sum(dim=-1, keepdim=True)
    ek = torch.exp(k - k.amax(dim=-2, keepdim=True))
    ks = ek / ek.sum(dim=-2, keepdim=True)
    return qs @ (ks.transpose(-2, -1) @ v), qs @ ks.transpose(-2, -1)


def dwc_ref(v, conv, grid, prefix):
    """DWC(v) in float64: each grid token's channel summed over its k x k window (zero padding) + bias; the
    ``prefix`` tokens get 0. ``conv=None`` (no conv term) gives 0 everywhere."""
    B, H, N, D = v.shape
    if conv is None:
        return torch.zeros(B, H, N, D, dtype=torch.float64)
    h, w = grid
    weight, bias = conv.weight.double()[:, 0], conv.bias.double()  # (H*D, k, k), (H*D,)
    r = weight.shape[-1] // 2
    img = torch.zeros(B, H * D, h + 2 * r, w + 2 * r, dtype=torch.float64)
    img[:, :, r : r + h, r : r + w] = v.double()[:, :, prefix:].transpose(-2, -1).reshape(B, H * D, h, w)
    out = bias[None, :, None, None].expand(B, -1, h, w).clone()
    for a in range(2 * r + 1):
        for b in range(2 * r + 1):
            out += weight[None, :, a, b, None, None] * img[:, :, a : a + h, b : b + w]
    grid_out = out.reshape(B, H, D, h * w).transpose(-2, -1)
    return torch.cat([torch.zeros(B, H, prefix, D, dtype=torch.float64), grid_out], dim=2)


def entropy(p):
    """H = -sum p log p over the last dim (0 log 0 = 0)."""
    p = p.double()
    return -torch.where(p > 0, p * torch.log(p), torch.zeros_like(p)).sum(dim=-1)


@torch.no_grad()
def module_qkv(attn, x):
    """q, k, v (B, H, N, D) of a ``ZooAttention`` from its parameters and the documented layout.

    split: one map to [q | k | v], each H*D channels cut into H heads of D.
    projected: one map to [q | k | v] of C channels each, then head m of output o is
    ``q W^{o,m}`` with ``W^{o,m} = head_weight[o][:, m*D:(m+1)*D]``.
    """
    B, N, C = x.shape
    H, D = attn.num_heads, attn.head_dim
    lin = attn.in_proj.proj
    y = x.double() @ lin.weight.double().T
    if lin.bias is not None:
        y = y + lin.bias.double()
    outputs = len(attn.projections)
    if attn.heads == "split":
        y = y.reshape(B, N, outputs, H, D)
    else:
        y = torch.einsum("bnoc,ocf->bnof", y.reshape(B, N, outputs, C), attn.in_proj.head_weight.double())
        y = y.reshape(B, N, outputs, H, D)
    return tuple(y[:, :, i].permute(0, 2, 1, 3) for i in range(outputs))


@torch.no_grad()
def module_out(attn, heads_out):
    """The output projection applied to per-head outputs (B, H, N, D) -> (B, N, C)."""
    B, H, N, D = heads_out.shape
    y = heads_out.permute(0, 2, 1, 3).reshape(B, N, H * D)
    return y @ attn.proj.weight.double().T + attn.proj.bias.double()
