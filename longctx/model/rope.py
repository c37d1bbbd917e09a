"""RoPE and its context extensions: inverse frequencies and the attention factor for each variant.

RoPE (Su et al. 2021, arXiv 2104.09864) rotates dimension pair ``i`` of q and k by the angle
``position * inv_freq[i]`` with ``inv_freq[i] = theta^(-2i/d)``, ``i = 0 .. d/2 - 1``. Pair ``i`` turns once
every ``wavelength[i] = 2*pi / inv_freq[i]`` positions: the fast pairs (small ``i``) turn thousands of
times within the training length ``L``, the slowest ones less than once. Past ``L`` the slow pairs show
angles the model never saw in training (they do not "wrap": they reach new values).

Extensions (``scaling`` in transformers' ``rope_scaling`` format, ``factor`` = s):

- ``"linear"`` (position interpolation, Chen et al. 2023, arXiv 2306.15595): every ``inv_freq / s``.
- ``"ntk"`` (NTK-aware, bloc97 2023): raise the base, ``theta' = theta * s^(d/(d-2))``: the fastest pair
  is untouched, the slowest one is slowed by exactly ``s``. (Not a transformers type; transformers has
  the dynamic variant below.)
- ``"dynamic"`` (dynamic NTK, as transformers): NTK-aware with ``s_eff = s*T/L - (s-1)`` for the current
  length ``T > L`` (``seq_len``), no change up to ``L``.
- ``"yarn"`` (Peng et al. 2023, arXiv 2309.00071): NTK-by-parts, each pair interpolated or not by how many
  turns it makes within ``L``: pairs with more than ``beta_fast`` (32) turns keep their frequency, pairs
  with fewer than ``beta_slow`` (1) are divided by ``s``, a linear ramp in between; plus an attention
  temperature: cos and sin are multiplied by ``attention_factor = 0.1*ln(s) + 1`` (so the logits by its
  square, ``1/t`` in the paper's notation).

The ramp: YaRN's reference code (and transformers) ramps linearly over the pair *index* between two
correction indices (rounded down/up); the paper's gamma(r) ramps linearly in ``r = L / wavelength``.
Both are here (``yarn_ramp`` and ``yarn_ramp_paper``); the model follows the code.
"""

from __future__ import annotations

import math

import torch

ROPE_TYPES = ("default", "linear", "ntk", "dynamic", "yarn")


def default_inv_freq(head_dim: int, theta: float) -> torch.Tensor:
    """``theta^(-2i/d)`` for ``i = 0 .. d/2-1``: float32 ``[d/2]``, computed exactly as transformers does."""
    _check_dims(head_dim, theta)
    return 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))


def wavelengths(head_dim: int, theta: float) -> torch.Tensor:
    """Positions per full turn of each pair, ``2*pi / inv_freq``: ``[d/2]``."""
    return 2 * math.pi / default_inv_freq(head_dim, theta)


def _check_dims(head_dim, theta) -> None:
    if int(head_dim) != head_dim or head_dim < 4 or head_dim % 2:
        raise ValueError(f"head_dim must be an even integer >= 4, got {head_dim!r}")
    if not theta > 0:
        raise ValueError(f"theta (the RoPE base) must be > 0, got {theta!r}")


def validate_scaling(scaling: dict | None) -> dict | None:
    """Check a ``rope_scaling`` dict; returns a normalised copy (``type`` accepted for ``rope_type``)."""
    if scaling is None:
        return None
    if not isinstance(scaling, dict):
        raise ValueError(f"rope_scaling must be a dict or None, got {type(scaling).__name__}")
    s = dict(scaling)
    kind = s.pop("type", None) if "rope_type" not in s else s.get("rope_type")
    s.pop("type", None)
    s["rope_type"] = kind or "default"
    if s["rope_type"] not in ROPE_TYPES:
        raise ValueError(f"rope_type must be one of {ROPE_TYPES}, got {s['rope_type']!r}")
    if s["rope_type"] == "default":
        return s
    factor = s.get("factor")
    if not isinstance(factor, (int, float)) or not factor >= 1:
        raise ValueError(f"rope_scaling['factor'] must be a number >= 1, got {factor!r}")
    if s["rope_type"] in ("dynamic", "yarn"):
        L = s.get("original_max_position_embeddings")
        if not isinstance(L, int) or L < 1:
            raise ValueError(
                f"rope_type {s['rope_type']!r} needs original_max_position_embeddings (the training "
                f"length, a positive int), got {L!r}"
            )
    if s["rope_type"] == "yarn":
        fast, slow = s.get("beta_fast") or 32, s.get("beta_slow") or 1
        if not fast > slow > 0:
            raise ValueError(f"YaRN needs beta_fast > beta_slow > 0, got {fast!r} and {slow!r}")
    return s


def rope_parameters(
    head_dim: int, theta: float, scaling: dict | None = None, seq_len: int | None = None
) -> tuple[torch.Tensor, float]:
    """``(inv_freq [head_dim/2] float32, attention_factor)`` for RoPE with the given scaling.

    ``scaling``: None (plain RoPE) or transformers' ``rope_scaling`` dict, e.g.
    ``{"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 8192}``.
    ``seq_len`` is used by ``"dynamic"`` only (the current length; default: the training length).
    ``attention_factor`` multiplies cos and sin (1.0 except for YaRN).
    """
    _check_dims(head_dim, theta)
    s = validate_scaling(scaling)
    base = default_inv_freq(head_dim, theta)
    if s is None or s["rope_type"] == "default":
        return base, 1.0
    kind, factor, d = s["rope_type"], float(s["factor"]), head_dim
    if kind == "linear":
        return base / factor, 1.0
    if kind == "ntk":
        return default_inv_freq(d, theta * factor ** (d / (d - 2))), 1.0
    if kind == "dynamic":
        L = s["original_max_position_embeddings"]
        T = L if seq_len is None else max(int(seq_len), L)
        return default_inv_freq(d, theta * (factor * T / L - (factor - 1)) ** (d / (d - 2))), 1.0
    return _yarn(d, theta, s)


def yarn_attention_factor(factor: float, mscale: float = 1.0) -> float:
    """YaRN's ``sqrt(1/t) = 0.1*ln(s) + 1`` (1 for s <= 1); it multiplies cos and sin."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def correction_index(num_turns: float, head_dim: int, theta: float, L: int) -> float:
    """The (fractional) pair index whose wavelength fits ``num_turns`` times into ``L`` positions.

    From ``L / wavelength(i) = num_turns`` with ``wavelength(i) = 2*pi*theta^(2i/d)``."""
    return head_dim * math.log(L / (num_turns * 2 * math.pi)) / (2 * math.log(theta))


def yarn_ramp(
    head_dim: int, theta: float, L: int, beta_fast: float = 32, beta_slow: float = 1, truncate: bool = True
) -> torch.Tensor:
    """The reference code's ramp: per pair, the weight of the *interpolated* frequency (0 = keep, 1 = /s).

    Linear in the pair index between ``low = floor(index(beta_fast))`` and ``high = ceil(index(beta_slow))``.
    """
    low = correction_index(beta_fast, head_dim, theta, L)
    high = correction_index(beta_slow, head_dim, theta, L)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001  # as the reference code: avoid dividing by zero
    i = torch.arange(head_dim // 2, dtype=torch.float32)
    return torch.clamp((i - low) / (high - low), 0, 1)


def yarn_ramp_paper(
    head_dim: int, theta: float, L: int, alpha: float = 1, beta: float = 32
) -> torch.Tensor:
    """The paper's ramp as the same weight: ``1 - gamma(r)``, ``r = L / wavelength``, gamma linear in r
    from 0 at ``r = alpha`` to 1 at ``r = beta`` (eq. 18-19 of arXiv 2309.00071)."""
    r = L / wavelengths(head_dim, theta).double()
    gamma = torch.clamp((r - alpha) / (beta - alpha), 0, 1)
    return (1 - gamma).float()


def _yarn(d: int, theta: float, s: dict) -> tuple[torch.Tensor, float]:
    factor = float(s["factor"])
    attention_factor = s.get("attention_factor")
    if attention_factor is None:
        mscale, mscale_all = s.get("mscale"), s.get("mscale_all_dim")
        if mscale and mscale_all:
            attention_factor = yarn_attention_factor(factor, mscale) / yarn_attention_factor(
                factor, mscale_all
            )
        else:
            attention_factor = yarn_attention_factor(factor)
    ramp = yarn_ramp(
        d, theta, s["original_max_position_embeddings"], s.get("beta_fast") or 32, s.get("beta_slow") or 1,
        s.get("truncate", True),
    )
    base = default_inv_freq(d, theta)
    inv_freq = (base / factor) * ramp + base * (1 - ramp)
    return inv_freq, float(attention_factor)
