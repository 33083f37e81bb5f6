"""Seed statistics of the paper experiments: mean with a 95 % confidence interval, and the paired test.

No scipy in the environment: Student's t distribution comes from the regularised incomplete beta
function (:func:`betainc`, the continued fraction of Numerical Recipes §6.4, Lentz's method), which is
all a two-sided p-value and a 0.975 quantile need:

    P(|T| > t) = I_{nu / (nu + t^2)}(nu / 2, 1 / 2)            (T ~ Student t with nu degrees of freedom)

*Paired* means: the same seeds, the same warm start and the same held-out prompts on both sides, so
the per-seed differences ``a_i - b_i`` carry the comparison and the seed-to-seed spread that both
sides share cancels; the test is the one-sample t test of those differences against 0.
"""

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

ALPHA = 0.05  # "held" needs p < ALPHA


def betainc(a: float, b: float, x: float) -> float:
    """The regularised incomplete beta function ``I_x(a, b)`` for ``a, b > 0`` and ``0 <= x <= 1``."""
    if not (a > 0 and b > 0 and 0.0 <= x <= 1.0):
        raise ValueError(f"betainc needs a, b > 0 and 0 <= x <= 1; got a={a}, b={b}, x={x}")
    if x in (0.0, 1.0):
        return x
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x > (a + 1.0) / (a + b + 2.0):  # the continued fraction converges fast only below this point
        return 1.0 - betainc(b, a, 1.0 - x)
    tiny, c, d = 1e-300, 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        for num in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                    -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= c * d
        if abs(c * d - 1.0) < 1e-15:
            break
    return math.exp(log_front) * h / a


def t_two_sided_p(t: float, dof: int) -> float:
    """``P(|T| >= |t|)`` for Student's t with ``dof`` degrees of freedom."""
    if dof < 1:
        raise ValueError(f"a t test needs at least 1 degree of freedom; got {dof}")
    if math.isinf(t):
        return 0.0
    return betainc(dof / 2.0, 0.5, dof / (dof + t * t))


def t_quantile_975(dof: int) -> float:
    """The 0.975 quantile of Student's t (the half-width factor of a 95 % interval), by bisection."""
    lo, hi = 0.0, 1000.0
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t_two_sided_p(mid, dof) > ALPHA else (lo, mid)
    return (lo + hi) / 2


@dataclass(frozen=True)
class Interval:
    """Mean over ``n`` finite values and the half-width of its 95 % t interval (0 for one value)."""

    mean: float
    half_width: float
    n: int

    def cell(self, digits: int = 3) -> str:
        if self.n == 0:
            return "-"
        if self.n == 1:
            return f"{self.mean:.{digits}f} (1 seed)"
        return f"{self.mean:.{digits}f} ± {self.half_width:.{digits}f}"


def interval(values: Sequence[float]) -> Interval:
    v = [float(x) for x in values if not math.isnan(x)]
    if not v:
        return Interval(float("nan"), float("nan"), 0)
    if len(v) == 1:
        return Interval(v[0], 0.0, 1)
    return Interval(statistics.fmean(v), t_quantile_975(len(v) - 1) * statistics.stdev(v) / math.sqrt(len(v)), len(v))


@dataclass(frozen=True)
class Paired:
    """The paired t test of ``a - b`` over seeds: mean difference, its 95 % half-width, t, p, n."""

    diff: float
    half_width: float
    t: float
    p: float
    n: int

    @property
    def held(self) -> bool:
        return self.n >= 2 and self.p < ALPHA

    def verdict(self, expected_sign: int) -> str:
        """"held" when the difference has the expected sign at p < 0.05, "reversed" when the opposite
        sign is significant, else "not resolved"."""
        if not self.held:
            return "not resolved"
        return "held" if (self.diff > 0) == (expected_sign > 0) else "reversed"

    def text(self) -> str:
        return (f"Δ = {self.diff:+.3f} ± {self.half_width:.3f}, paired t({self.n - 1}) = {self.t:.2f}, "
                f"p = {self.p:.3g}, n = {self.n} seeds")


def paired(a: Sequence[float], b: Sequence[float]) -> Paired:
    """The paired t test of ``a_i - b_i`` (same seeds in the same order); pairs with a NaN are skipped."""
    if len(a) != len(b):
        raise ValueError(f"paired test needs the same seeds on both sides; got {len(a)} and {len(b)} values")
    d = [x - y for x, y in zip(a, b, strict=True) if not (math.isnan(x) or math.isnan(y))]
    n = len(d)
    if n < 2:
        return Paired(d[0] if d else float("nan"), float("nan"), float("nan"), float("nan"), n)
    mean, sd = statistics.fmean(d), statistics.stdev(d)
    if sd == 0.0:
        t = 0.0 if mean == 0.0 else math.copysign(math.inf, mean)
    else:
        t = mean / (sd / math.sqrt(n))
    return Paired(mean, t_quantile_975(n - 1) * sd / math.sqrt(n), t, t_two_sided_p(t, n - 1), n)


def pearson(a: Sequence[float], b: Sequence[float]) -> float:
    """Pearson's r of paired values (NaN pairs skipped); nan under 3 pairs or no spread."""
    pairs = [(x, y) for x, y in zip(a, b, strict=True) if not (math.isnan(x) or math.isnan(y))]
    if len(pairs) < 3:
        return float("nan")
    ma, mb = statistics.fmean(x for x, _ in pairs), statistics.fmean(y for _, y in pairs)
    sab = sum((x - ma) * (y - mb) for x, y in pairs)
    saa, sbb = sum((x - ma) ** 2 for x, _ in pairs), sum((y - mb) ** 2 for _, y in pairs)
    return sab / math.sqrt(saa * sbb) if saa > 0 and sbb > 0 else float("nan")


@dataclass(frozen=True)
class Welch:
    """Welch's unpaired t test of mean(a) - mean(b): difference, 95 % half-width, t, Welch-Satterthwaite dof, p."""

    diff: float
    half_width: float
    t: float
    dof: float
    p: float


def welch(a: Sequence[float], b: Sequence[float]) -> Welch:
    a = [x for x in a if not math.isnan(x)]
    b = [x for x in b if not math.isnan(x)]
    if len(a) < 2 or len(b) < 2:
        return Welch(float("nan"), float("nan"), float("nan"), float("nan"), float("nan"))
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    diff, se = statistics.fmean(a) - statistics.fmean(b), math.sqrt(va + vb)
    if se == 0.0:
        return Welch(diff, 0.0, 0.0 if diff == 0 else math.copysign(math.inf, diff), float(len(a) + len(b) - 2),
                     1.0 if diff == 0 else 0.0)
    dof = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    t = diff / se
    return Welch(diff, t_quantile_975(dof) * se, t, dof, t_two_sided_p(t, dof))


def holm(ps: Sequence[float]) -> list[float]:
    """Holm-Bonferroni adjusted p-values (step-down, made monotone, capped at 1), in the input order; a NaN
    stays NaN and does not count in the family."""
    idx = [i for i, p in enumerate(ps) if not math.isnan(p)]
    order = sorted(idx, key=lambda i: ps[i])
    out = [float("nan")] * len(ps)
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(order) - rank) * ps[i]))
        out[i] = running
    return out
