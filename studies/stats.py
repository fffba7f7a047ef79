"""The statistics of a study report: Student-t intervals over seeds, Wilson intervals over
one run's episodes, the exact sign test, paired differences and a moving average.

Plain Python and NumPy (no scipy), each against an independent reference in
tests/test_report.py.
"""

from __future__ import annotations

import math
import statistics
from typing import Iterable, Sequence

import numpy as np

NAN = float("nan")
RATE = (0.0, 1.0)   # parameter space of a success rate or an AUC
DIFF = (-1.0, 1.0)  # of a difference of two rates, or of a rank correlation


def t_cdf(t: float, df: int) -> float:
  """Student-t CDF for an integer number of degrees of freedom.

  The closed-form finite series of Abramowitz & Stegun 26.7.3-4 for P(|T| < t): exact for
  integer df, which is all a CI over seeds (df = n - 1) needs, and no scipy.
  """
  if df < 1 or int(df) != df:
    raise ValueError(f"df must be a positive integer, got {df}")
  theta = math.atan(abs(t) / math.sqrt(df))
  c2 = math.cos(theta) ** 2
  if df % 2:  # odd: 2/pi (theta + sin cos (1 + 2/3 c2 + 2*4/(3*5) c2^2 + ...))
    term, total = 1.0, 1.0 if df > 1 else 0.0
    for k in range(1, (df - 1) // 2):
      term *= c2 * (2 * k) / (2 * k + 1)
      total += term
    a = 2 / math.pi * (theta + math.sin(theta) * math.cos(theta) * total)
  else:  # even: sin (1 + 1/2 c2 + 1*3/(2*4) c2^2 + ...)
    term, total = 1.0, 1.0
    for k in range(1, df // 2):
      term *= c2 * (2 * k - 1) / (2 * k)
      total += term
    a = math.sin(theta) * total
  return 0.5 + math.copysign(0.5 * a, t)


def t_quantile(p: float, df: int) -> float:
  """Inverse of `t_cdf` by bisection (the CDF is monotone; 200 halvings reach float64)."""
  if not 0 < p < 1:
    raise ValueError(f"p must be in (0, 1), got {p}")
  if p < 0.5:
    return -t_quantile(1 - p, df)
  lo, hi = 0.0, 1.0
  while t_cdf(hi, df) < p:
    lo, hi = hi, 2 * hi
  for _ in range(200):
    mid = 0.5 * (lo + hi)
    if mid in (lo, hi):
      break
    lo, hi = (mid, hi) if t_cdf(mid, df) < p else (lo, mid)
  return 0.5 * (lo + hi)


def clip_interval(lo: float, hi: float, bounds: tuple[float, float] | None
                  ) -> tuple[float, float]:
  """A symmetric t-interval on a bounded quantity can reach past the bound (4 seeds of a
  rate near 1 gave an upper end of 1.004): values there are impossible, so cutting them
  off drops no possible value the interval covers. NaN stays NaN."""
  if bounds is None:
    return lo, hi
  return (max(lo, bounds[0]) if np.isfinite(lo) else lo,
          min(hi, bounds[1]) if np.isfinite(hi) else hi)


def mean_ci(values: Sequence[float], level: float = 0.95,
            bounds: tuple[float, float] | None = None) -> tuple[float, float, float]:
  """Mean and Student-t interval over the finite values (seeds), truncated to `bounds`
  (the parameter space); NaN bounds for one value."""
  x = np.asarray([v for v in values if np.isfinite(v)], np.float64)
  if len(x) == 0:
    return NAN, NAN, NAN
  m = float(x.mean())
  if len(x) == 1:
    return m, NAN, NAN
  half = t_quantile(0.5 + level / 2, len(x) - 1) * float(x.std(ddof=1)) / math.sqrt(len(x))
  return (m, *clip_interval(m - half, m + half, bounds))


def band(y_SxP: np.ndarray, level: float = 0.95, bounds: tuple[float, float] | None = None
         ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """`mean_ci` along the seed axis of a curve per seed (no NaN inside)."""
  n = y_SxP.shape[0]
  m = y_SxP.mean(0)
  if n < 2:
    return m, np.full_like(m, NAN), np.full_like(m, NAN)
  half = t_quantile(0.5 + level / 2, n - 1) * y_SxP.std(0, ddof=1) / math.sqrt(n)
  lo, hi = m - half, m + half
  if bounds is not None:
    lo, hi = np.maximum(lo, bounds[0]), np.minimum(hi, bounds[1])
  return m, lo, hi


def wilson(successes: float, n: float, level: float = 0.95) -> tuple[float, float, float]:
  """Rate and Wilson score interval of `successes` in `n` episodes.

  One run's evaluation is n Bernoulli outcomes; the Wald interval p +- z sqrt(p(1-p)/n)
  leaves [0, 1] and shrinks to a point at 0 or n successes, the Wilson interval (the set
  of rates a two-sided score test does not reject) does neither (Brown, Cai & DasGupta
  2001, "Interval estimation for a binomial proportion", recommend it over Wald)."""
  if not n > 0:
    return NAN, NAN, NAN
  z = statistics.NormalDist().inv_cdf(0.5 + level / 2)
  p = successes / n
  denom = 1 + z * z / n
  centre = (p + z * z / (2 * n)) / denom
  half = z / denom * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
  # It always holds p and lies in [0, 1] (ends at 0 and 1 when k = 0 or n): the min, max
  # and clip only undo rounding.
  return p, *clip_interval(min(centre - half, p), max(centre + half, p), RATE)


def sign_test_p(wins: int, losses: int) -> float:
  """Exact two-sided sign test on the discordant pairs (McNemar's exact test): under the
  null a pair that differs is a win or a loss with probability 1/2 each, so p is twice
  the binomial tail of the rarer side (capped at 1; 1 when no pair differs)."""
  n = wins + losses
  if n == 0:
    return 1.0
  tail = sum(math.comb(n, i) for i in range(min(wins, losses) + 1))
  return min(1.0, 2 * tail / 2 ** n)  # int / int: exact up to the final rounding


def paired_deltas(a: dict[int, float], b: dict[int, float]) -> list[float]:
  """a(seed) - b(seed) over the seeds where both are finite: the same SFT start, so the
  start's luck cancels."""
  return [a[s] - b[s] for s in sorted(a) if s in b and np.isfinite(a[s]) and np.isfinite(b[s])]


def finite_mean(values: Iterable[float]) -> float:
  x = [v for v in values if np.isfinite(v)]
  return float(np.mean(x)) if x else NAN


def smooth(y: np.ndarray, window: int) -> np.ndarray:
  """Centred moving average; near the ends the window shrinks to what exists."""
  y = np.asarray(y, np.float64)
  c = np.concatenate([[0.0], np.cumsum(y)])
  i = np.arange(len(y))
  lo = np.maximum(i - window // 2, 0)
  hi = np.minimum(i + window - window // 2, len(y))
  return (c[hi] - c[lo]) / (hi - lo)

