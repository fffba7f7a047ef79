"""Speed of the jitted CSA and GiGPO advantages against NumPy, measured in one run.

Three implementations of each estimator on the same padded batch (B=128 task groups,
G=8 rollouts, T=50 steps by default):
  jax      csa_jax.estimators, jitted (compile excluded, block_until_ready);
  numpy    the same math vectorised in NumPy (reductions over axes; GiGPO step groups
           via np.unique on (group, state) keys);
  loop     a per-group Python loop with a dict of step groups, the way verl-agent's
           gigpo/core_gigpo.py computes GiGPO (and CSA written the same way).
All three are checked to agree before timing. Prints medians and ratios.

  .venv/bin/python benchmarks/advantages.py [--B 128 --G 8 --T 50 --reps 20]
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

import jax
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.timing import median_seconds
from csa_jax import estimators as est_lib
from csa_jax.config import AlgoConfig

# The estimators' knobs at their config defaults (the references below use them too).
ALGO = AlgoConfig()
EPS = ALGO.eps
TIE_RTOL = 1e-6
L_TIE_ATOL = 1e-5


def make_batch(B, G, T, n_states, seed=0):
  rng = np.random.default_rng(seed)
  lengths = rng.integers(T // 4, T + 1, size=(B, G))
  mask = np.arange(T)[None, None] < lengths[..., None]
  rewards = rng.integers(0, 2, size=(B, G)).astype(np.float32)
  logp = (-rng.gamma(2.0, 2.0, size=(B, G, T))).astype(np.float32)
  step_rewards = np.zeros((B, G, T), np.float32)
  step_rewards[np.arange(B)[:, None], np.arange(G)[None], lengths - 1] = rewards
  # Each window of 5 steps draws from `n_states` states of its own, so rollouts of a
  # group share anchor states at nearby steps (mean step-group size ~6 by default).
  state_id = (rng.integers(0, n_states, size=(B, G, T))
              + n_states * (np.arange(T) // 5)).astype(np.int32)
  return rewards, logp, mask, step_rewards, state_id


# --------------------------------------------------------------------------------
# Vectorised NumPy.
# --------------------------------------------------------------------------------


def np_standardize(x, active, axis, ddof=1, atol=0.0):
  x = np.where(active, x, 0.0)
  n = active.sum(axis, keepdims=True)
  mean = x.sum(axis, keepdims=True) / np.maximum(n, 1)
  hi = np.where(active, x, -np.inf).max(axis, keepdims=True)
  lo = np.where(active, x, np.inf).min(axis, keepdims=True)
  ok = (n >= max(2, ddof + 1)) & (hi - lo > TIE_RTOL * np.maximum(hi, -lo)) & (hi - lo > atol)
  c = np.where(active & ok, x - mean, 0.0)
  std = np.sqrt((c**2).sum(axis, keepdims=True) / np.maximum(n - ddof, 1))
  return c / (std + EPS)


def np_csa(rewards, logp, mask, lam=ALGO.lam):
  a_e = np_standardize(rewards, mask.any(-1), -1)
  n = mask.sum(1, keepdims=True)
  lp = np.where(mask, logp, 0.0)
  dev = np.where(mask, lp - lp.sum(1, keepdims=True) / np.maximum(n, 1), 0.0)
  l = a_e[..., None] * dev
  atol = (L_TIE_ATOL * np.where(mask, np.abs(a_e)[..., None], 0).max(1, keepdims=True)
          * np.abs(lp).max(1, keepdims=True))
  a_s = np_standardize(l, mask, 1, atol=atol)
  return np.where(mask, a_e[..., None] + lam * a_s, 0.0)


def np_gigpo(step_rewards, mask, state_id, gamma=ALGO.gamma, w=ALGO.w):
  B, G, T = mask.shape
  r = np.where(mask, step_rewards, 0.0)
  a_e = np_standardize(r.sum(-1), mask.any(-1), -1)
  ret = np.zeros_like(r)
  running = np.zeros((B, G))
  for t in reversed(range(T)):  # T steps, vectorised over B x G
    running = np.where(mask[..., t], r[..., t] + gamma * running, running)
    ret[..., t] = np.where(mask[..., t], running, 0.0)
  keys = np.stack([np.broadcast_to(np.arange(B)[:, None, None], mask.shape)[mask],
                   state_id[mask]], -1)
  _, seg = np.unique(keys, axis=0, return_inverse=True)
  seg = seg.reshape(-1)
  x = ret[mask]
  n = np.bincount(seg)
  mean = np.bincount(seg, x) / n
  hi = np.full(n.shape, -np.inf)
  lo = np.full(n.shape, np.inf)
  np.maximum.at(hi, seg, x)
  np.minimum.at(lo, seg, x)
  scale = np.maximum(np.abs(hi), np.abs(lo))
  ok = (n >= 2) & (hi - lo > TIE_RTOL * scale)
  c = np.where(ok[seg], x - mean[seg], 0.0)
  std = np.sqrt(np.bincount(seg, c**2) / np.maximum(n - 1, 1))
  a_s = np.zeros(mask.shape)
  a_s[mask] = c / (std[seg] + EPS)
  return np.where(mask, a_e[..., None] + w * a_s, 0.0)


# --------------------------------------------------------------------------------
# Per-group Python loops (verl-agent style).
# --------------------------------------------------------------------------------


def loop_standardize(values, atol=0.0):
  n = len(values)
  if n < 2:
    return [0.0] * n
  hi, lo = max(values), min(values)
  if hi - lo <= TIE_RTOL * max(abs(hi), abs(lo)) or hi - lo <= atol:
    return [0.0] * n
  mean = sum(values) / n
  std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
  return [(v - mean) / (std + EPS) for v in values]


def loop_csa(rewards, logp, mask, lam=ALGO.lam):
  B, G, T = mask.shape
  out = np.zeros(mask.shape)
  for b in range(B):
    real = [i for i in range(G) if mask[b, i].any()]
    a_e = dict(zip(real, loop_standardize([float(rewards[b, i]) for i in real])))
    for t in range(T):
      act = [i for i in range(G) if mask[b, i, t]]
      if not act:
        continue
      m = sum(float(logp[b, i, t]) for i in act) / len(act)
      ls = [a_e[i] * (float(logp[b, i, t]) - m) for i in act]
      atol = (L_TIE_ATOL * max(abs(a_e[i]) for i in act)
              * max(abs(float(logp[b, i, t])) for i in act))
      for i, s in zip(act, loop_standardize(ls, atol)):
        out[b, i, t] = a_e[i] + lam * s
  return out


def loop_gigpo(step_rewards, mask, state_id, gamma=ALGO.gamma, w=ALGO.w):
  B, G, T = mask.shape
  out = np.zeros(mask.shape)
  for b in range(B):
    real = [i for i in range(G) if mask[b, i].any()]
    totals = [sum(float(step_rewards[b, i, t]) for t in range(T) if mask[b, i, t])
              for i in real]
    a_e = dict(zip(real, loop_standardize(totals)))
    groups = {}
    for i in real:
      running = 0.0
      rets = {}
      for t in reversed(range(T)):
        if mask[b, i, t]:
          running = float(step_rewards[b, i, t]) + gamma * running
          rets[t] = running
      for t, v in rets.items():
        groups.setdefault(int(state_id[b, i, t]), []).append((i, t, v))
    for members in groups.values():
      for (i, t, _), s in zip(members, loop_standardize([v for _, _, v in members])):
        out[b, i, t] = a_e[i] + w * s
  return out


# --------------------------------------------------------------------------------


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--B", type=int, default=128)
  p.add_argument("--G", type=int, default=8)
  p.add_argument("--T", type=int, default=50)
  p.add_argument("--states", type=int, default=6, help="distinct states per 5 steps")
  p.add_argument("--reps", type=int, default=20)
  p.add_argument("--loop_reps", type=int, default=3)
  args = p.parse_args()
  rewards, logp, mask, step_rewards, state_id = make_batch(args.B, args.G, args.T,
                                                           args.states)
  dev = [jax.device_put(x) for x in (rewards, logp, mask, step_rewards, state_id)]
  knobs = lambda name: {k: getattr(ALGO, k) for k in est_lib.get_estimator(name).hparams}
  jax_csa = lambda: est_lib.csa_advantages(*dev[:3], **knobs("csa")).block_until_ready()
  jax_gig = lambda: est_lib.gigpo_advantages(dev[3], dev[2], dev[4],
                                             **knobs("gigpo")).block_until_ready()

  t0 = time.perf_counter()
  ref = {"csa": np.asarray(jax_csa())}
  compile_csa = time.perf_counter() - t0
  t0 = time.perf_counter()
  ref["gigpo"] = np.asarray(jax_gig())
  compile_gig = time.perf_counter() - t0
  impls = {
      "csa": (jax_csa, lambda: np_csa(rewards, logp, mask),
              lambda: loop_csa(rewards, logp, mask)),
      "gigpo": (jax_gig, lambda: np_gigpo(step_rewards, mask, state_id),
                lambda: loop_gigpo(step_rewards, mask, state_id)),
  }
  for name, (_, np_fn, loop_fn) in impls.items():
    np.testing.assert_allclose(np_fn(), ref[name], atol=1e-4, rtol=1e-4)
    np.testing.assert_allclose(loop_fn(), ref[name], atol=1e-4, rtol=1e-4)

  _, size = est_lib.step_groups(dev[4], dev[2])
  size = np.asarray(size)[mask]
  print(f"backend={jax.default_backend()} devices={jax.device_count()} "
        f"B={args.B} G={args.G} T={args.T} active steps={int(mask.sum())} "
        f"mean GiGPO step-group size={size.mean():.2f} (singletons {np.mean(size == 1):.0%})")
  print(f"first call (compile + run): csa {compile_csa * 1e3:.0f} ms, "
        f"gigpo {compile_gig * 1e3:.0f} ms")
  print(f"{'estimator':10s} {'jax (ms)':>10s} {'numpy (ms)':>11s} {'loop (ms)':>10s} "
        f"{'numpy/jax':>10s} {'loop/jax':>9s}")
  for name, (jax_fn, np_fn, loop_fn) in impls.items():
    tj = median_seconds(jax_fn, args.reps)
    tn = median_seconds(np_fn, args.reps)
    tl = median_seconds(loop_fn, args.loop_reps)
    print(f"{name:10s} {tj * 1e3:10.3f} {tn * 1e3:11.3f} {tl * 1e3:10.1f} "
          f"{tn / tj:10.1f} {tl / tj:9.0f}")


if __name__ == "__main__":
  main()
