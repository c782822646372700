"""A norm's statistic form: how a set's statistic s is formed from its deviations d (x − μ, or x for an uncentred
norm), and its scale r from s and eps. An op declares it (its view's `form`, numerics.sets.SetView), as it declares
its stage kinds; generic code reads it and has no branch of its own for any form.

    divisor   s = Σd²/D:  mean      D = M       (every torch norm: the biased variance, RMSNorm's mean of squares)
                          total     D = 1       (ScaleNorm's ‖x‖²)
                          unbiased  D = M − 1   (torch's x.std(): the annotated transformer's LayerNorm)
    root      r = φ(s):   added     1/√(s + eps)       (every torch norm)
                          floored   1/max(√s, eps)     (F.normalize, ScaleNorm)
                          outside   1/(√s + eps)       (the annotated transformer's LayerNorm, RMSNorms written so)
    eps_scale             eps·c wherever eps enters (c = 1; F.normalize(x)·√H floors the RMS at eps/√H: rmsnorm_l2,
                          ScaleNorm's --eps-at normalize, whose view sets c from the set's size)
    about_mean            an uncentred norm's statistic taken about the set's mean all the same (timm's SimpleNorm,
                          x·rsqrt(var(x) + eps)): d = x − μ in s while the output scales x itself

With x̂ = d·r, g = γ·dy and h = Σ(g·x̂)/D (the statistic of g·x̂), the first order of every form is

    dx = r·(g − ḡ − λ·x̂·h),   λ = −2φ'(s)/r³

(ḡ, the mean of g, only for a centred norm; about the mean, x̂·λh is the statistic's d·r times λ·Σ(g·x·r)/D): λ = 1
where the root adds eps, the floor's mask (1 where r moves with s, 0 where eps holds it), 1 + eps/√s outside the root.
Along tangents ḋ of the deviations, w = Σ(d·ḋ)/D is half the statistic's tangent, so ṙ = φ'(s)·2w = −λ·r³·w and
λ̇ = 2λ'(s)·w (`slope_rate`: 2λ'(s), none where λ is constant in s): what reference.setwise's directional derivatives
(the double backward, forward mode) take of the form.

Each function of s comes as a value (NumPy, in s's own dtype: the float64 reference and the same-precision baseline)
and an error map (how far an error δs in s moves it: the running-error bound), applied through the `Arithmetic`
hook `apply` (reference.setwise), so one spelling serves all three; the first-order tolerance model reads the same
maps (`relative_error`, `slope_value`, `slope_error`), and `ambiguous`: where a kernel's rounding may point a set's
deviations anywhere while λ·h depends on their direction (eps outside the root, s within its error of 0), which the
bounds widen by the range every form allows (engine.error_terms). A form is a frozen record: ops compare and hash it.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

DIVISORS = ("mean", "total", "unbiased")
ROOTS = ("added", "floored", "outside")


@dataclass(frozen=True)
class StatisticForm:
    divisor: str = "mean"
    root: str = "added"
    # What the layer's eps is multiplied by where it meets s: F.normalize(x)·√M floors the norm ‖x‖ at eps while s is
    # the mean, so √s is floored at eps/√M (a view sets it from its set size M); 1 for every other form
    eps_scale: float = 1.0
    # An uncentred norm's statistic about the set's mean: s = Σ(x − μ)²/D, y = x·r (timm's SimpleNorm); a centred
    # norm's is about it already
    about_mean: bool = False

    def __post_init__(self):
        if self.divisor not in DIVISORS or self.root not in ROOTS:
            raise ValueError(f"a statistic form is one of {DIVISORS} by one of {ROOTS}, not {self.divisor}/{self.root}")
        if self.about_mean and self.root != "added":  # (the kink's range, error_terms.kink_spread, has one deviation)
            raise ValueError("a statistic about the mean of an uncentred norm is taken with eps added to it")

    def centres(self, centred: bool) -> bool:
        """Whether the statistic is taken about the set's mean, for a norm that centres its output (`centred`) or
        not."""
        return centred or self.about_mean

    # ---------------------------------------------------------------- the statistic
    def reduce(self, a, axes: tuple[int, ...], size: int):
        """The statistic's reduction of a grouped array over a set's `axes` (`size` values), kept broadcastable:
        Σa/D."""
        if self.divisor == "mean":
            return a.mean(axis=axes, keepdims=True)
        total = a.sum(axis=axes, keepdims=True)
        return total if self.divisor == "total" else total / (size - 1)

    def per_mean(self, size: int) -> float:
        """M/D: what a per-set constant's statistic is, per unit of the constant (1 for a mean)."""
        return size / self.divisor_of(size)

    def divisor_of(self, size: int) -> int:
        return {"mean": size, "total": 1, "unbiased": size - 1}[self.divisor]

    def eps_as_mean_square(self, eps: float, size: int) -> float:
        """The mean square of a set's deviations at which eps and its statistic meet (what the data profiles aim
        at): eps where it is added to s, eps² where it floors √s or is added to it; in the statistic's terms, so
        eps/M for a total (ScaleNorm) and eps²·(M − 1)/M for an unbiased one."""
        eps = eps * self.eps_scale
        level = eps if self.root == "added" else eps * eps
        if self.divisor == "mean":
            return level
        return level / size if self.divisor == "total" else level * (size - 1) / size

    # ---------------------------------------------------------------- r = φ(s): value and error, for any arithmetic
    def r(self, ar, s, eps: float):
        """r = φ(s) under the arithmetic `ar` (reference.setwise.Arithmetic)."""
        return ar.apply(lambda v: self.r_value(v, eps), lambda r, v, e: self.r_error(r, v, e, eps), s)

    def slope(self, ar, s, eps: float):
        """λ = −2φ'(s)/r³ under `ar`; None where it is 1 (the root adds eps). The floor's is its mask, known exactly
        (no rounding of its own) and uncertain (error 1) where s lies within its error of eps²."""
        if self.root == "added":
            return None
        return ar.apply(lambda v: self.slope_value(v, eps), lambda lam, v, e: self.slope_error(v, e, eps), s,
                        rounded=self.root == "outside")

    def slope_rate(self, ar, s, eps: float):
        """2λ'(s) under `ar` (λ̇ = 2λ'(s)·w); None where λ does not vary with s (added, floored)."""
        if self.root != "outside":
            return None
        return ar.apply(lambda v: self._rate_value(v, eps), lambda q, v, e: self._rate_error(q, v, e), s)

    # ---------------------------------------------------------------- NumPy values and error maps
    def r_value(self, s, eps: float):
        """φ(s) in s's dtype (a Python eps rounds to it, as in torch); a zero statistic with eps = 0 gives inf."""
        with np.errstate(divide="ignore"):
            if self.root == "outside":
                return 1 / (np.sqrt(s) + eps * self.eps_scale)
            return 1 / np.sqrt(self._operand(s, eps))

    def _operand(self, s, eps: float):
        """What r is 1/√ of: s + eps, or max(s, eps²) where eps floors the root (eps as the form scales it)."""
        eps = eps * self.eps_scale
        return np.maximum(s, eps * eps) if self.root == "floored" else s + eps

    def r_error(self, r, s, ds, eps: float):
        """|δr| for an error ds in s: ½·r·δs/(s + eps) (the floor: over max(s, eps²)); outside the root
        r²·δ√s (`root_error`)."""
        if self.root == "outside":
            return r * r * root_error(s, ds)
        return 0.5 * r * ds / self._operand(s, eps)

    def relative_error(self, s, ds, eps: float):
        """δr/r for an error ds in s (the first-order tolerance model's)."""
        if self.root == "outside":
            return self.r_value(s, eps) * root_error(s, ds)
        return 0.5 * ds / self._operand(s, eps)

    def input_relative_error(self, moved, r, s):
        """δr/r where the deviations move by δd, `moved` = Σ|d|·δd/D (half the move of s): r²·moved where eps is
        added or floors the root (1/r² = s + eps, max(s, eps²)); outside it, r·moved/√s (r·δ√s)."""
        if self.root == "outside":
            with np.errstate(divide="ignore", invalid="ignore"):
                return np.where(s > 0, r * moved / np.sqrt(s), r * np.sqrt(2 * moved))
        return moved / (1.0 / (r * r))

    def slope_value(self, s, eps: float):
        """λ in s's dtype: None where it is 1 (eps added to s), 1 + eps/√s outside the root (1 in a set whose
        statistic is exactly 0: its deviations are 0, so λ multiplies nothing there), the floor's mask (1 where r
        moves with s, 0 where eps holds it)."""
        if self.root == "added":
            return None
        eps = eps * self.eps_scale
        if self.root == "floored":
            return (s > eps * eps).astype(s.dtype)
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(s > 0, 1 + eps / np.sqrt(s), 1).astype(s.dtype)

    def slope_error(self, s, ds, eps: float):
        """δλ for an error ds in s: the floor's 1 in a set whose statistic lies within ds of eps² (a correct kernel
        may put it on either side), 0 elsewhere; outside the root (λ − 1)·½·δs/s; None where λ = 1."""
        if self.root == "added":
            return None
        eps = eps * self.eps_scale
        if self.root == "floored":
            return (np.abs(s - eps * eps) <= ds).astype(float)
        with np.errstate(divide="ignore", invalid="ignore"):
            return _finite(np.where(s > 0, (eps / np.sqrt(s)) * 0.5 * ds / s, 0.0))

    def ambiguous(self, s, ds, eps: float):
        """Where a correct kernel's λ·h may be anything up to √(Σg²/D) although the reference's is about 0: outside
        the root, a set whose statistic lies within its error ds of 0. There λ·h = Σ(g·d)/(D·√s) depends on the
        deviations' direction alone, which rounding sets (a row of equal values whose mean rounds); None for a root
        under which λ·h is continuous at s = 0 (eps added to s, or r held by the floor)."""
        return s <= ds if self.root == "outside" else None

    def _rate_error(self, rate, s, ds):
        """|δ(2λ')| for an error ds in s: |2λ'|·(3/2)·δs/s (0 where s = 0, as the rate)."""
        with np.errstate(divide="ignore", invalid="ignore"):
            return _finite(np.abs(rate) * 1.5 * ds / s)

    def _rate_value(self, s, eps: float):
        """2λ'(s) = −eps·s^(−3/2) outside the root (0 in a set whose statistic is 0, as λ's)."""
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(s > 0, -eps * self.eps_scale / (s * np.sqrt(s)), 0).astype(s.dtype)


def root_error(s, ds):
    """δ√s for an error ds in s ≥ 0: ds/(√s + √(s − ds)) (the larger of the two ways s may move), at most √ds (a
    statistic within its error of 0)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.fmin(ds / (np.sqrt(s) + np.sqrt(np.maximum(s - ds, 0))), np.sqrt(ds))


def _finite(a):
    """An error map's value where its first-order formula met 0/0 or inf·0 (a set whose statistic is 0): 0."""
    return np.where(np.isfinite(a), a, 0.0)


# The forms the ops declare
STANDARD = StatisticForm()                            # 1/√(mean(d²) + eps)
