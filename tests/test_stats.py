"""The report's statistics against closed forms, tables and exact enumeration."""

import math

import pytest

from studies import stats

T975 = {1: 12.7062047, 2: 4.3026527, 4: 2.7764451, 9: 2.2621572, 15: 2.1314495456,
        30: 2.0422725}
Z975 = 1.959963984540054  # the standard normal's 0.975 quantile


@pytest.mark.parametrize("df", sorted(T975))
def test_t_quantile_known_values(df):
  assert stats.t_quantile(0.975, df) == pytest.approx(T975[df], abs=1e-6)
  assert stats.t_quantile(0.025, df) == pytest.approx(-T975[df], abs=1e-6)


def test_mean_ci_one_value_has_no_interval():
  m, lo, hi = stats.mean_ci([0.4, float("nan")])
  assert m == 0.4 and math.isnan(lo) and math.isnan(hi)


# ----------------------------------------------------------------------------- proportions


def wilson_ref(k, n, z=Z975):
  """The closed form (2k + z^2 +- z sqrt(z^2 + 4k(n - k)/n)) / (2(n + z^2))."""
  root = z * math.sqrt(z * z + 4 * k * (n - k) / n)
  return (2 * k + z * z - root) / (2 * (n + z * z)), (2 * k + z * z + root) / (2 * (n + z * z))


@pytest.mark.parametrize("k,n", [(0, 10), (10, 10), (5, 10), (1, 100), (97, 100), (0, 1),
                                 (143, 400)])
def test_wilson_against_closed_form(k, n):
  p, lo, hi = stats.wilson(k, n)
  assert p == k / n
  ref = wilson_ref(k, n)
  assert (lo, hi) == pytest.approx((max(ref[0], 0.0), min(ref[1], 1.0)), abs=1e-9)
  assert 0.0 <= lo <= p <= hi <= 1.0


def test_wilson_tabulated():
  # 0 of 10: the upper end 0.2775 of the 95% Wilson interval (e.g. Newcombe 1998, table I).
  assert stats.wilson(0, 10)[2] == pytest.approx(0.27753, abs=1e-5)
  assert stats.wilson(10, 10)[1] == pytest.approx(1 - 0.27753, abs=1e-5)
  assert all(math.isnan(v) for v in stats.wilson(0, 0))


def sign_p_ref(wins, losses):
  """Sum of the Binomial(n, 1/2) probabilities of splits at least as far from n/2."""
  from fractions import Fraction
  n = wins + losses
  far = abs(wins - Fraction(n, 2))
  return float(sum(Fraction(math.comb(n, i), 2 ** n) for i in range(n + 1)
                   if abs(i - Fraction(n, 2)) >= far))


@pytest.mark.parametrize("wins,losses", [(5, 0), (0, 5), (3, 3), (0, 0), (12, 3), (1, 0),
                                         (40, 61), (700, 640)])
def test_sign_test_against_enumeration(wins, losses):
  assert stats.sign_test_p(wins, losses) == pytest.approx(sign_p_ref(wins, losses), rel=1e-12)


def test_sign_test_known_values():
  assert stats.sign_test_p(5, 0) == 0.0625  # 2 / 2^5: the smallest p five seeds can give
  assert stats.sign_test_p(3, 3) == 1.0 and stats.sign_test_p(0, 0) == 1.0


def test_mean_ci_is_cut_to_the_parameter_space():
  x = [0.98, 1.0, 1.0, 0.9]
  m, lo, hi = stats.mean_ci(x)
  assert hi > 1.0  # the plain t-interval reaches past 1 ...
  assert stats.mean_ci(x, bounds=(0.0, 1.0)) == (m, lo, 1.0)  # ... the rate's stops there
  d = [-0.95, -1.0, -0.6]
  m, lo, hi = stats.mean_ci(d)
  assert lo < -1.0 and stats.mean_ci(d, bounds=(-1.0, 1.0)) == (m, -1.0, hi)
  one = stats.mean_ci([0.5], bounds=(0.0, 1.0))
  assert one[0] == 0.5 and math.isnan(one[1]) and math.isnan(one[2])

