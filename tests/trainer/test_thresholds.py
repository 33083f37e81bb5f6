"""Proposition 1 effective bounds (``asyncrl.trainer.thresholds``): hand-derived values and round trips."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from asyncrl.trainer.thresholds import behaviour_weight, effective_bounds

CLIP = (0.8, 1.2)


def close(a: tuple[float, float], b: tuple[float, float]) -> bool:
    return all(math.isclose(x, y, rel_tol=1e-12) or x == y for x, y in zip(a, b, strict=True))


def test_behaviour_weight() -> None:
    assert [behaviour_weight(n) for n in range(4)] == [1.0, 0.5, 1 / 3, 0.25]
    with pytest.raises(ValueError, match="gap must be >= 0"):
        behaviour_weight(-1)


def test_gap_zero_keeps_clip_and_opens_mask() -> None:
    eb = effective_bounds((0.5, 2.0), CLIP, 0, "loglinear")
    assert eb.mask == (0.0, math.inf) and eb.clip == CLIP
    assert effective_bounds((0.5, 2.0), CLIP, 0, "linear") == eb


def test_loglinear_by_hand() -> None:
    # gap 2: alpha = 1/3, r_d = r^(2/3), r_s = r^(1/3).
    #   mask [0.99, 1.01] -> [0.99^1.5, 1.01^1.5] = [0.985037, 1.015037]
    #   clip [0.8, 1.2]   -> [0.8^3, 1.2^3]      = [0.512, 1.728]
    eb = effective_bounds((0.99, 1.01), CLIP, 2, "loglinear")
    assert close(eb.mask, (0.99**1.5, 1.01**1.5)) and close(eb.clip, (0.512, 1.728))
    assert math.isclose(eb.mask[0], 0.985037, rel_tol=1e-6)
    # gap 1: alpha = 1/2, both exponents 2: mask [0.5, 2] -> [0.25, 4]; clip -> [0.64, 1.44].
    eb = effective_bounds((0.5, 2.0), CLIP, 1, "loglinear")
    assert close(eb.mask, (0.25, 4.0)) and close(eb.clip, (0.64, 1.44))
    # gap 3: alpha = 1/4: mask^(4/3), clip^4: 1.2^4 = 2.0736, 0.8^4 = 0.4096.
    eb = effective_bounds((0.5, 2.0), CLIP, 3, "loglinear")
    assert close(eb.clip, (0.4096, 2.0736)) and close(eb.mask, (0.5 ** (4 / 3), 2.0 ** (4 / 3)))


def test_linear_by_hand() -> None:
    # gap 1, alpha = 1/2: r_d = 0.5 + 0.5 r -> mask a maps to (a - 0.5) / 0.5:
    #   a = 0.5 -> 0 ; a = 2 -> 3.
    # r_s = r / (0.5 + 0.5 r) -> clip c maps to 0.5 c / (1 - 0.5 c): 0.8 -> 0.4/0.6 = 2/3 ; 1.2 -> 0.6/0.4 = 1.5.
    eb = effective_bounds((0.5, 2.0), CLIP, 1, "linear")
    assert close(eb.mask, (0.0, 3.0)) and close(eb.clip, (2 / 3, 1.5))
    # gap 3, alpha = 1/4: mask 0.9 -> 0.65/0.75 = 0.866667 ; 1.1 -> 0.85/0.75 = 1.133333;
    # clip 0.8 -> 0.2/0.4 = 0.5 ; 1.2 -> 0.3/0.1 = 3.
    eb = effective_bounds((0.9, 1.1), CLIP, 3, "linear")
    assert close(eb.mask, (0.65 / 0.75, 0.85 / 0.75)) and close(eb.clip, (0.5, 3.0))


def test_linear_unreachable_bounds() -> None:
    # gap 1: r_s = r / (0.5 + 0.5 r) < 2 for every r, so an upper clip 2.5 is never reached (inf);
    # a mask lower bound 0.2 < alpha = 0.5 is never reached either (r_d >= alpha): 0.
    eb = effective_bounds((0.2, 2.0), (0.8, 2.5), 1, "linear")
    assert eb.mask[0] == 0.0 and eb.clip[1] == math.inf
    assert eb.as_json() == {"mask": [0.0, 3.0], "clip": [pytest.approx(2 / 3), None]}


def test_errors_name_the_rule() -> None:
    with pytest.raises(ValueError, match="--mask needs 0 < LO < 1 < HI"):
        effective_bounds((1.2, 2.0), CLIP, 1, "linear")
    with pytest.raises(ValueError, match="--clip needs"):
        effective_bounds((0.5, 2.0), (0.8, 0.9), 1, "linear")
    with pytest.raises(ValueError, match="unknown interpolation 'cubic'; valid: linear, loglinear"):
        effective_bounds((0.5, 2.0), CLIP, 1, "cubic")  # type: ignore[arg-type]


@settings(max_examples=100, deadline=None)
@given(gap=st.integers(1, 8), lo=st.floats(0.3, 0.99), hi=st.floats(1.01, 3.0), interp=st.sampled_from(["linear", "loglinear"]))
def test_effective_bounds_map_back_onto_the_decoupled_bounds(gap: int, lo: float, hi: float, interp: str) -> None:
    # At r = an effective bound, the decoupled ratio equals the original bound (when reachable).
    a = 1.0 / (gap + 1)

    def r_d(r: float) -> float:
        return r ** (1 - a) if interp == "loglinear" else a + (1 - a) * r

    def r_s(r: float) -> float:
        return r**a if interp == "loglinear" else r / (a + (1 - a) * r)

    eb = effective_bounds((lo, hi), (lo, hi), gap, interp)  # type: ignore[arg-type]
    for bound, r in zip((lo, hi), eb.mask, strict=True):
        if 0.0 < r < math.inf:
            assert math.isclose(r_d(r), bound, rel_tol=1e-9)
    for bound, r in zip((lo, hi), eb.clip, strict=True):
        if 0.0 < r < math.inf:
            assert math.isclose(r_s(r), bound, rel_tol=1e-9)
        else:  # unreachable: the supremum of r_s stays below the bound
            assert interp == "linear" and bound >= 1 / (1 - a)
