"""The error terms of one normalisation, one function per source of error (docs/tolerance.md, Rule 1).

`tolerance.element_bounds` composes them: the statistics a set's sums give and how wrong they may be, x̂ and its
error, what a casting chain's roundings may flip, then the bound of each output from those. Each function names the
section of docs/tolerance.md it implements; the symbols are the doc's (μ, σ², r, x̂, g = γ·dy, ḡ, h), spelled out.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..cases import Case, CaseInputs
from ..numerics.dtypes import ROUNDS_XHAT, TINY, UNIT_ROUNDOFF, may_round_across, quantise


@dataclass(frozen=True)
class Precisions:
    """The unit roundoffs a case's formulas round in (Rule 1, "Precisions"), none finer than the precision the
    kernel computes in."""
    accumulation: float  # u_a: every sum
    storage: float       # u_o: the input's dtype, where the x-shaped outputs are stored
    parameters: float    # u_p: the parameters and their gradients
    output: float        # u_y: y's own storage (the input's, or promoted with the weight's)

    @property
    def moments(self) -> float:
        """u_s: the saved statistics' precision, the accumulation's or the parameters' where that is coarser (torch's
        CPU kernels keep a plain f16/bf16 input's mean and invstd in f16/bf16)."""
        return max(self.accumulation, self.parameters)

    @classmethod
    def of(cls, case: Case) -> "Precisions":
        return cls(UNIT_ROUNDOFF[case.dtypes.accumulation], case.dtypes.unit(case.dtype),
                   case.dtypes.unit(case.param_dtype), case.dtypes.unit(case.record.output_dtype(case, "y")))


@dataclass(frozen=True)
class SetSums:
    """How sums over a case's normalisation sets (and over each channel, for the parameters' gradients) grow their
    rounding error: ρ(M) = λ·√M for independent errors, M where every term is equal (correlated errors: Higham,
    Thm 4.2)."""
    view: Any
    growth: float  # λ

    @property
    def size(self) -> int:
        return self.view.set_size

    def mean(self, a: np.ndarray) -> np.ndarray:
        """The set's mean of `a` (what centring subtracts: μ, ḡ)."""
        return self.view.mean(a)

    def statistic(self, a: np.ndarray) -> np.ndarray:
        """The set's statistic of `a`, Σa/D in the view's form: its mean (its total where the form's statistic is
        one: ScaleNorm's; Σa/(M − 1) for an unbiased one)."""
        return self.view.reduce(a)

    def rho(self, n: int) -> float:
        return self.growth * np.sqrt(max(n, 1))

    def per_set(self, terms: np.ndarray) -> np.ndarray:
        """ρ(M) of each set's sum of `terms`, or M where they are all equal."""
        axes = self.view.axes
        equal = terms.max(axis=axes, keepdims=True) == terms.min(axis=axes, keepdims=True)
        return np.where(equal, float(self.size), self.rho(self.size))

    def per_channel(self, terms: np.ndarray) -> np.ndarray:
        """The same for each parameter's sum over its channel (an expanded dy makes its terms equal)."""
        summed = self.view.param_summed_axes
        equal = (terms.max(axis=summed) == terms.min(axis=summed)).reshape(self.view.param_shape)
        count = self.view.channel_count
        return np.where(equal, float(count), self.rho(count))


def independent_errors_sum(errors: np.ndarray, summed, count: int, growth: float) -> np.ndarray:
    """The error of a sum (`summed`: over which axes) of `count` terms, each carrying an error up to `errors` from
    roundings of its own elements (a different set's statistics, its own products): independent errors grow like
    λ·√(Σe²), as ρ(M) does for a sum's own roundings; never more than Σe, and Σe where every term's is the same (the
    same elements repeated: correlated errors)."""
    linear, square = summed(errors), summed(errors * errors)
    same = np.isclose(linear * linear, count * square, rtol=1e-9, atol=0.0)
    return np.where(same, linear, np.minimum(linear, growth * np.sqrt(square)))


@dataclass(frozen=True)
class Statistics:
    """Per set: the mean and the statistic s the layer normalises with (the biased variance, in the standard form),
    and how wrong a correct kernel's may be."""
    mean: np.ndarray
    var: np.ndarray
    mean_error: np.ndarray
    var_error: np.ndarray


def rank_masks(case: Case, view) -> list[np.ndarray]:
    """Per rank of a split case, 1 where it holds an element and 0 elsewhere, in the grouped view (the split axis
    may be any of its dims: the rows for SyncBN, the hidden dim for a hidden-parallel norm)."""
    masks = []
    for rank in range(len(case.split)):
        m = np.zeros(case.shape)
        m[case.record.layout.data_index(case.split, rank)] = 1.0
        masks.append(view.group(m))
    return masks


def batch_statistics(case: Case, x: np.ndarray, sums: SetSums, u: Precisions, rounding: float) -> Statistics:
    """Training mode (Rule 1, δμ and δσ²): the statistics of each set's sums at u_a. An uncentred op (RMSNorm) holds
    μ = 0 exactly, σ² being the mean of squares. Two-pass and Welford variances both lose about u_a·ρ(M) of σ², and
    Welford's running mean adds a term in |μ|·mean|x − μ|; E[x²] − E[x]² would lose u_a·μ², which is what must not
    pass. Σ(x − μ̃)² = Σ(x − μ)² + M·δμ², and the variance may be held in the moments' dtype; SyncBN's primitives pass
    invstd between ranks and recover σ² from it, losing u_a·(σ² + eps). In another statistic form (Σd²/D) the same
    terms are the statistic's, and δμ² counts M/D times. A statistic about the mean of an uncentred op's sets
    (StatisticForm.about_mean) has these μ and δμ."""
    form = sums.view.form
    centred = form.centres(case.record.centred)
    mean = sums.mean(x) if centred else np.zeros_like(sums.mean(x))
    deviation = x - mean
    var = sums.statistic(deviation * deviation)
    growth = sums.per_set(x)
    mean_error = ((u.accumulation * growth * sums.mean(np.abs(x)) + rounding * u.moments * np.abs(mean)) if centred
                  else np.zeros_like(mean))
    if case.split is not None and case.record.layout.splits_sets:
        mean_error = mean_error + merged_rank_means_error(case, x, sums, u, rounding)
    var_error = (u.accumulation * growth * (var + np.abs(mean) * sums.statistic(np.abs(deviation)))
                 + mean_error * mean_error * form.per_mean(sums.size) + rounding * u.moments * var
                 + rounding * u.accumulation * case.eps_value)
    return Statistics(mean, var, mean_error, var_error)


def merged_rank_means_error(case: Case, x: np.ndarray, sums: SetSums, u: Precisions, rounding: float) -> np.ndarray:
    """A set split over ranks (SyncBatchNorm): each rank's mean rounded to the moments' dtype, merged by the counts,
    c·u_s·Σ_r n_r/M·|μ_r| = c·u_s·Σ_r |Σ_{set ∩ r} x| / M."""
    return rounding * u.moments * sum(np.abs((x * m).sum(axis=sums.view.axes, keepdims=True)) / max(sums.size, 1)
                                      for m in rank_masks(case, sums.view))


def running_statistics(case: Case, inputs: CaseInputs, x: np.ndarray, sums: SetSums, u: Precisions,
                       rounding: float) -> Statistics:
    """Eval mode ("Eval mode"): the running statistics, exact inputs a kernel may convert to its own precision."""
    view = case.view
    mean, var = (np.broadcast_to(view.per_channel_values(r), sums.mean(x).shape)  # one per set, like the batch's
                 for r in (inputs.running_mean, inputs.running_var))
    return Statistics(mean, var, rounding * u.moments * np.abs(mean), rounding * u.moments * (var + case.eps_value))


@dataclass(frozen=True)
class Normalised:
    """x̂ = (x − μ)·r with r = φ(s) (1/√(σ² + eps) in the standard form), and their errors (Rule 1, δr/r and δx̂)."""
    deviation: np.ndarray    # x − μ
    rstd: np.ndarray         # r
    rstd_rel_error: np.ndarray  # δr/r
    xhat: np.ndarray
    xhat_error: np.ndarray   # δx̂
    # The form's slope λ = −2φ'(s)/r³, in dx = r·(g − ḡ − λ·x̂·h) (None: 1, eps added to s), and its error δλ: where
    # eps floors r, 1 where r moves with the statistics and 0 where the floor holds it, δλ = 1 in a set whose
    # statistic is within its error of the floor, which a kernel may put on either side
    slope: np.ndarray | None = None
    slope_error: np.ndarray | None = None
    statistic: np.ndarray | None = None  # s (training mode)
    # Where a correct kernel's λ·h may be anything up to √(Σg²/D) (StatisticForm.ambiguous; None: nowhere)
    ambiguous: np.ndarray | None = None
    # The statistic's (x − μ)·r and its error, where the output's x̂ is not it (an uncentred op whose statistic is
    # about the mean: x̂ = x·r); dx's term λ·h takes it (None: x̂)
    shat: np.ndarray | None = None
    shat_error: np.ndarray | None = None


def normalised(case: Case, x: np.ndarray, stats: Statistics, u: Precisions, rounding: float) -> Normalised:
    """r and x̂ from the statistics; in eval mode kernels fold the statistics into y = x·(γr) + (β − μγr), rounding
    x·s and μ·s separately."""
    form, eps = case.view.form, case.eps_value
    deviation = x - stats.mean
    rstd = form.r_value(stats.var, eps)  # 1/√(σ² + eps) (1/√max(σ², eps²) where eps floors r)
    xhat = deviation * rstd
    rel = form.relative_error(stats.var, stats.var_error, eps) + rounding * u.moments  # ½·δσ²/(σ² + eps)
    xhat_error = rstd * stats.mean_error + np.abs(xhat) * rel
    if not case.training:  # (the running statistics are constants: nothing moves r, whatever floors it)
        xhat_error = xhat_error + rounding * u.accumulation * rstd * (np.abs(x) + np.abs(stats.mean))
        return Normalised(deviation, rstd, rel, xhat, xhat_error)
    shat = shat_error = None
    if not case.record.centred and form.about_mean:  # (the output scales x itself; the statistic's deviations beside)
        shat, shat_error, deviation, xhat = xhat, xhat_error, x, x * rstd
        xhat_error = np.abs(xhat) * rel
    return Normalised(deviation, rstd, rel, xhat, xhat_error, form.slope_value(stats.var, eps),
                      form.slope_error(stats.var, stats.var_error, eps), stats.var,
                      form.ambiguous(stats.var, stats.var_error, eps), shat, shat_error)


def read_either(norm: Normalised, other: Normalised) -> Normalised:
    """A fused prologue rounds the value the norm reads for storage (add + norm's h), and a kernel may normalise
    the unrounded value instead, or scale the stored one by the unrounded value's rstd (and keep that rstd for its
    backward: "Fused prologues"). What either moves x̂ and r, element by element, is an input error of the norm: it
    enters δx̂ and δr/r, and through them every output, summed as magnitudes where a gradient sums over a channel
    (dγ's terms move with x̂ each, and their moves need not cancel). The other value's mean is not allowed: a row
    centred on another row's mean is off centre by what rounding moved the mean, times r."""
    rstd_moved = 2 * np.abs(other.rstd - norm.rstd)  # (twice, as the prologue's moved outputs: docs/tolerance.md)
    return replace(norm, rstd_rel_error=norm.rstd_rel_error + rstd_moved / norm.rstd,
                   xhat_error=norm.xhat_error + 2 * np.abs(other.xhat - norm.xhat) + np.abs(norm.deviation) * rstd_moved)


def inexact_input(case: Case, norm: Normalised, error: np.ndarray, sums: SetSums) -> Normalised:
    """The norm's input known to within `error` element by element (a stage before it that a kernel may round:
    "Fused stages"): δμ = mean δv, δσ² ≤ 2·mean(|v − μ|·δv) to first order, so δr/r gains mean(|v − μ|·δv)/(σ² + eps)
    (in the view's form: StatisticForm.input_relative_error) and δx̂ gains r·(δv + δμ) + |x̂|·that."""
    moved = sums.statistic(np.abs(norm.deviation) * error)
    rel = sums.view.form.input_relative_error(moved, norm.rstd, norm.statistic)
    mean_error = sums.mean(error) if case.record.centred else 0.0
    return replace(norm, rstd_rel_error=norm.rstd_rel_error + rel,
                   xhat_error=norm.xhat_error + norm.rstd * (error + mean_error) + np.abs(norm.xhat) * rel)


def casting_flips(case: Case, norm: Normalised) -> np.ndarray | float:
    """What a casting chain's rounding to the input dtype may flip ("Uncentred statistics (RMSNorm)"): one that
    rounds x̂ before the weight (before-weight) may round an x̂ known to within δx̂ to the other neighbour, one
    input-dtype ulp of it; one that rounds rstd first (rstd-input) may flip rstd itself, which moves the whole row's
    x·rstd by |x|·ulp(rstd) before that rounding. 0 for a chain that rounds once at the end."""
    if case.casting == "rstd-input":
        rstd_flip = np.abs(norm.deviation) * may_round_across(norm.rstd, norm.rstd * norm.rstd_rel_error, case.dtype)
        return rstd_flip + may_round_across(norm.deviation * quantise(norm.rstd, case.dtype),
                                            norm.xhat_error + rstd_flip, case.dtype)
    if case.casting == "before-weight":
        return may_round_across(norm.xhat, norm.xhat_error, case.dtype)
    return 0.0


def output_error(gamma, beta, norm: Normalised, flips, u: Precisions, rounding: float) -> np.ndarray:
    """B(y) = c·u_y·(|γx̂| + |β|) + |γ|·(δx̂ + flips): y's own rounding, and x̂'s error through γ (a flip is covered by
    y's rounding unless y is promoted to a finer dtype, so it enters here)."""
    return rounding * u.output * (np.abs(gamma * norm.xhat) + np.abs(beta)) + np.abs(gamma) * (norm.xhat_error + flips)


@dataclass(frozen=True)
class AfterNorm:
    """A fused epilogue z = f(y) seen from the norm: z's bound, the dy its backward receives and that dy's error."""
    output_error: np.ndarray
    dy: np.ndarray
    dy_error: np.ndarray


def epilogue_errors(epilogue, y_norm, y_error, dz, u: Precisions, rounding: float) -> AfterNorm:
    """z = f(y) inherits y's error through f'(y), at second order ½|f''|·δy² where f'(y) = 0 (SiLU's minimum; f''
    varies slowly), plus f's own roundings, twice c·u_y (f is several element-wise operations: exp, add, divide,
    multiply). Its backward's dy = dz·f'(y) is recomputed from an inexact y (through f'') and rounded to the input
    dtype."""
    grad1, grad2 = epilogue.grad(y_norm), epilogue.grad2(y_norm)
    dy = dz * grad1
    dy_error = np.abs(dz * grad2) * y_error + rounding * u.storage * np.abs(dy)
    bound = (np.abs(grad1) * y_error + 0.5 * np.abs(grad2) * y_error * y_error
             + epilogue.rounding(y_norm, u.output, rounding))
    return AfterNorm(bound, dy, dy_error)


def input_gradient_error(case: Case, sums: SetSums, norm: Normalised, gamma, dy, dy_error, u: Precisions,
                         rounding: float) -> np.ndarray:
    """B(dx) for dx = r·(g − ḡ − x̂·λh), g = γ·dy, h = Σ(g·x̂)/D (eval mode: dx = r·g, the statistics do not depend
    on x; an uncentred op has no ḡ; λ = 1 unless the statistic form says otherwise; x̂·λh's x̂ is the statistic's
    (x − μ)·r where the output's is not, Normalised.shat): the three terms' own rounding at u_o, each sum's growth at
    u_a, what δx̂, δr/r and δλ carry in, and the error of the dy received (a fused epilogue's). A casting chain that
    rounds x̂ rounds the gradient reaching it too (autograd casts it to x̂'s dtype, the input's): δg gains
    u_o·(|g| + tiny), a subnormal g's rounding being absolute."""
    xhat, rstd = norm.xhat, norm.rstd
    zeros = np.zeros_like(sums.mean(xhat))
    g = gamma * dy
    g_error = np.abs(gamma) * dy_error
    if case.casting in ROUNDS_XHAT:  # (below the dtype's smallest normal, a rounding is up to u_o·tiny away)
        g_error = g_error + u.storage * (np.abs(g) + TINY[case.dtype])
    with_gbar = case.record.centred and case.training
    gbar = sums.mean(g) if with_gbar else zeros
    h = sums.statistic(g * xhat) if case.training else zeros
    gbar_error = (u.accumulation * sums.per_set(g) * sums.mean(np.abs(g)) + sums.mean(g_error) if with_gbar
                  else zeros)
    h_error = (u.accumulation * sums.per_set(g * xhat) * sums.statistic(np.abs(g * xhat))
               + sums.statistic(np.abs(g) * norm.xhat_error) + sums.statistic(g_error * np.abs(xhat))
               if case.training else zeros)
    slope_error = 0.0
    if norm.slope is not None:
        # λ·h and |h|·δλ: a set whose r eps floors has no h, and one at the floor may have it or not ("Floored
        # statistics"); δh counts as λ's on the side where r moves (1 for the floor)
        h, slope_error = h * norm.slope, np.where(norm.slope_error > 0, np.abs(h) * norm.slope_error, 0.0)
        h_error = h_error * np.maximum(np.abs(norm.slope), 1.0)
    shat, shat_error = (xhat, norm.xhat_error) if norm.shat is None else (norm.shat, norm.shat_error)
    dx = rstd * (g - gbar - shat * h)
    bound = (rounding * u.storage * rstd * (np.abs(g) + np.abs(gbar) + np.abs(shat * h))
             + rstd * (g_error + gbar_error + np.abs(shat) * (h_error + slope_error) + np.abs(h) * shat_error)
             + np.abs(dx) * norm.rstd_rel_error)
    if norm.ambiguous is not None and case.training:
        # λ·h of either sign up to √(Σg²/D) where the set's deviations are rounding's ("Statistic forms"): times a
        # kernel's x̂, within δx̂ of the reference's
        spread = np.where(norm.ambiguous, np.sqrt(sums.statistic(g * g)), 0.0)
        bound = bound + rstd * (np.abs(xhat) + norm.xhat_error) * spread
    return bound


def kink_spread(case: Case, sums: SetSums, norm: Normalised, g) -> dict[str, np.ndarray] | None:
    """What the directional derivatives (order 2, forward mode) of a correct kernel may be off by in the sets where its
    λ·h jumps ("Statistic forms": StatisticForm.ambiguous, a statistic within its error of 0 with eps outside the
    root), by formula (d2dy, d2weight, d2x); None where no set is. Rounding sets the direction of such a set's
    deviations d, and every form bounds what any direction gives: |λ·w| ≤ λ·√s·√stat(ḋ²) and λ·r·√s ≤ 1, so
    ṙ = −λr³w lies within ±r²·√stat(ḋ²), λ·h within ±√stat(g²), d·ṙ within ±(|x̂| + δx̂)·r·√stat(ḋ²) (|d|·r ≤ |x̂| +
    δx̂), and x̂·(λh)˙ within ±((|x̂| + δx̂)·√stat(ġ²) + 2r·√D·√stat(g²)·√stat(ḋ²)) (|d|/√s ≤ √D). `g`: the grouped
    inputs (engine.expected.Grouped)."""
    if norm.ambiguous is None or not case.training or not norm.ambiguous.any():
        return None
    view, r, xhat = sums.view, norm.rstd, norm.xhat
    d_dot = g.ddx - sums.mean(g.ddx) if case.record.centred else g.ddx
    grad, grad_dot = g.gamma * g.dy, g.ddweight * g.dy
    tangent = np.sqrt(sums.statistic(d_dot * d_dot))
    jump = np.sqrt(sums.statistic(grad * grad))  # λ·h's range
    size = np.abs(xhat) + norm.xhat_error  # a kernel's |x̂|
    moved = size * r * tangent  # d·ṙ's range
    gbar = np.abs(sums.mean(grad)) if case.record.centred else 0.0
    d2x = (r * r * tangent * (np.abs(grad) + gbar + size * jump)
           + r * ((np.abs(d_dot) * r + moved) * jump + size * np.sqrt(sums.statistic(grad_dot * grad_dot))
                  + 2 * r * np.sqrt(view.form.divisor_of(sums.size)) * jump * tangent))
    where = norm.ambiguous
    return {"d2dy": np.where(where, np.abs(g.gamma) * moved, 0.0),
            "d2weight": view.channel_sum(np.where(where, np.abs(g.dy) * moved, 0.0)),
            "d2x": np.where(where, d2x, 0.0)}


def parameter_gradient_errors(sums: SetSums, norm: Normalised, flips, dy, dy_error, u: Precisions,
                              rounding: float) -> dict[str, np.ndarray]:
    """B(dγ) = u_a·ρ·Σ|dy·x̂| + Σ(|dy|·(δx̂ + flips) + δdy·|x̂|) + c·u_p·|dγ| and B(dβ) = u_a·ρ·Σ|dy| + Σδdy + c·u_p·|dβ|,
    the sums over each channel."""
    view, xhat = sums.view, norm.xhat
    dweight, dbias = view.channel_sum(dy * xhat), view.channel_sum(dy)
    return {
        "dweight": (u.accumulation * sums.per_channel(dy * xhat) * view.channel_sum(np.abs(dy * xhat))
                    + view.channel_sum(np.abs(dy) * (norm.xhat_error + flips) + dy_error * np.abs(xhat))
                    + rounding * u.parameters * np.abs(dweight)),
        "dbias": (u.accumulation * sums.per_channel(dy) * view.channel_sum(np.abs(dy)) + view.channel_sum(dy_error)
                  + rounding * u.parameters * np.abs(dbias)),
    }


def replicated_rounding_errors(case: Case, sums: SetSums, norm: Normalised, dy, u: Precisions,
                               rounding: float) -> dict[str, np.ndarray]:
    """A split case whose ranks each hold all of γ and β: each rank rounds its local dγ/dβ to the parameter dtype
    before they are summed, and local sums can be much larger than their total: c·u_p·Σ_r |local_r| on top."""
    view, masks = sums.view, rank_masks(case, sums.view)
    return {name: rounding * u.parameters * np.sum([np.abs(view.channel_sum(terms * m)) for m in masks], axis=0)
            for name, terms in (("dweight", dy * norm.xhat), ("dbias", dy))}


def saved_statistics_errors(stats: Statistics, norm: Normalised, u: Precisions, rounding: float,
                            shape) -> dict[str, np.ndarray]:
    """The saved mean, invstd (and rstd), one per set in the moments' precision: B(mean) = δμ + c·u_s·|μ|,
    B(invstd) = r·δr/r."""
    rstd = (norm.rstd * norm.rstd_rel_error).reshape(shape)
    return {"mean": (stats.mean_error + rounding * u.moments * np.abs(stats.mean)).reshape(shape),
            "invstd": rstd, "rstd": rstd}


def running_update_errors(case: Case, inputs: CaseInputs, sums: SetSums, stats: Statistics, u: Precisions,
                          rounding: float) -> dict[str, np.ndarray]:
    """The running statistics a training step updates, m·batch + (1 − m)·running: one statistic per channel
    (BatchNorm) or the batch average of the per-instance ones (InstanceNorm); eval mode leaves them exactly as they
    were."""
    if not case.training:
        return {"running_mean": np.zeros(case.channels), "running_var": np.zeros(case.channels)}
    mom, unbiased = case.momentum, sums.size / max(sums.size - 1, 1)
    rm, rv = inputs.running_mean, inputs.running_var
    mean_c, var_c = stats.mean.mean(axis=0).reshape(-1), stats.var.mean(axis=0).reshape(-1)
    return {
        "running_mean": mom * stats.mean_error.mean(axis=0).reshape(-1) + rounding * u.parameters * (
            np.abs((1 - mom) * rm) + np.abs(mom * mean_c)),
        "running_var": mom * unbiased * stats.var_error.mean(axis=0).reshape(-1) + rounding * u.parameters * (
            np.abs((1 - mom) * rv) + np.abs(mom * unbiased * var_c)),
    }
