"""SPA-RL: stepwise progress attribution (Wang et al., 2025, arXiv 2505.20732; code:
WangHanLinHenry/SPA-RL-Agent).

After SFT, once per run: explore `explore_k` rollouts on each of the first
`explore_tasks` training tasks with the SFT policy (at the rollout temperature, 1 by
default), then train a progress estimator, the SFT model plus a linear head on its last
hidden state at the end of each action, so that the sum of its per-step predictions c_t
matches the episode's outcome R (1 if won):

  L = mean over episodes of (sum_t c_t - R)^2.

During RL the estimator is frozen and each step's reward is

  r_t = progress_coef * c_t - grounding * (1 - valid_t)   (valid: the environment executed it)

(`spa.grounding_mode="penalty"`, the default), or the paper's literal
r_t = progress_coef * c_t + grounding * valid_t (`"bonus"`).

Why not the paper's form (measured in reports/spa_grounding.md). The two differ by
+grounding on every step, and a constant reward per step, summed into the discounted
return, pays for episode length: a step's return becomes about grounding x (the steps left
in its episode) plus its progress to go. On a task where a win ends the episode early and
a loss runs to the step limit (coin_doors: wins in ~10 steps, losses at the limit of 25),
the loss's steps got the higher advantages (grounding 0.5: a 25-step loss's first step
returns ~11, a 6-step win's ~4), so the credit was anti-correlated with the oracle's step
labels from the first iteration on (credit Spearman -0.24, -0.34, -0.14 on the very
rollouts where GRPO had +0.19, +0.13, +0.17), the policy learned to wander (episodes 14.6
-> 20.9 steps; greedy episodes of seeds 1 and 2 all ran to the limit) and every seed lost
held-out success. The estimator was not the cause (its sums were 0.9 on won episodes and
0.1 on lost ones). "penalty" keeps the paper's contrast between an executed and a rejected
action and drops the constant. `spa/adv_won_minus_lost` and `spa/adv_steps_left_corr`
(every iteration) show which way the credit points.

Budget. The exploration's environment steps count against `rl_env_steps` like the RL
rollouts' (the trainer adds `Prepared.env_steps`), so RL gets the budget minus the
exploration, and the run ends within one iteration of the budget as every method's does;
exploration stops after the chunk (one wave of the pool) in which it reaches
`spa.explore_share` of the budget (0.25: at KeyDoor H = 4 the whole 100 tasks x 5, at
H = 48 about 60 episodes), because 500 episodes of 49 steps alone would be 2.5 budgets.
Without `rl_env_steps` (a budget in iterations) the exploration's steps come on top of the
rollouts, as in the coin_doors study (about 18,400 steps against the others' 9,700).

Differences from the authors, on purpose:
- advantages: the discounted return of r (gamma 0.99) standardised over the active steps
  of the task group, with the project's clipped update (and KL anchor, episode row
  weighting), instead of PPO with a value head and GAE (a deviation: no critic here);
- the released code drops c_t from the reward (it uses R - mean of the others plus the
  grounding term); this follows the paper and keeps c_t;
- the head reads the final hidden state at the row's last input position (the prompt and
  the action up to its end-of-action token), as the paper's linear head on the model's
  representation; the code puts Linear(vocab, 1) on the LM-head logits there;
- the estimator is trained with AdamW without weight decay, like the iStar PRM;
- the grounding term is a penalty on rejected actions, not a bonus on executed ones
  (above), and exploration is capped by the step budget.

Exploration is resumable: each chunk of episodes is written to `workdir/spa_explore/`
when played and read back instead of replayed; the estimator (and a `ready` flag) lives
in the aux state, so a run resumed after the estimator was trained skips both.
"""

from __future__ import annotations

import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from csa_jax.algorithms import base
from csa_jax.estimators import discounted_returns
from csa_jax.rollout import groups
from csa_jax.update import train_step as ts

# Exploration chunk k samples with jax.random.fold_in(key(seed), _EXPLORE_KEY + k).
_EXPLORE_KEY = 7_000_000


# ----------------------------------------------------------------------------------------
# Pure functions.


def progress_loss(c_ExT, mask_ExT, outcome_E, valid_E):
  """Mean over valid episodes of (sum_t c_t - R)^2 (0 without any valid episode)."""
  total_E = jnp.where(mask_ExT, c_ExT, 0.0).sum(-1)
  err_E = jnp.where(valid_E, (total_E - outcome_E) ** 2, 0.0)
  return err_E.sum() / jnp.maximum(jnp.sum(valid_E), 1)


def spa_step_rewards(c_BxGxT, valid_BxGxT, mask_BxGxT, *, progress_coef, grounding,
                     invalid_penalty=0.0, grounding_mode="penalty"):
  """r_t = progress_coef * c_t + the grounding term - invalid_penalty * [action rejected],
  on active steps (the penalty is the project's knob, off in `spa`). The grounding term
  is -grounding * [action rejected] ("penalty") or +grounding * [action executed]
  ("bonus", the paper's literal form: the same contrast plus +grounding on every step)."""
  valid = jnp.asarray(valid_BxGxT, bool)
  g = grounding * valid if grounding_mode == "bonus" else -grounding * ~valid
  r = progress_coef * jnp.asarray(c_BxGxT, jnp.float32) + g - invalid_penalty * ~valid
  return jnp.where(mask_BxGxT, r, 0.0)


@jax.jit
def spa_advantages(step_rewards_BxGxT, mask_BxGxT, gamma, eps=1e-6):
  """Discounted returns standardised over the active steps of each group (unbiased std);
  0 where a group has fewer than 2 active steps or returns without spread."""
  mask = jnp.asarray(mask_BxGxT, bool)
  ret = discounted_returns(step_rewards_BxGxT, mask, gamma)
  n = mask.sum((1, 2), keepdims=True)
  mean = jnp.where(mask, ret, 0.0).sum((1, 2), keepdims=True) / jnp.maximum(n, 1)
  dev = jnp.where(mask, ret - mean, 0.0)
  std = jnp.sqrt((dev ** 2).sum((1, 2), keepdims=True) / jnp.maximum(n - 1, 1))
  ok = (n > 1) & (std > 0)
  return jax.lax.stop_gradient(jnp.where(mask & ok, dev / (std + eps), 0.0))


# ----------------------------------------------------------------------------------------
# The estimator on packed row batches.


def progress(graphdef, params, batch):
  """c per row: the linear head on the final hidden state at the row's last input."""
  model = nnx.merge(graphdef, params["body"])
  last_R = batch["attn_mask"].sum(-1) - 1
  h_Rx1xD = model.hidden_states(batch["inputs"], attention_mask_BxT=batch["attn_mask"],
                                at_BxK=last_R[:, None])
  head = params["head"]
  return h_Rx1xD[:, 0].astype(jnp.float32) @ head["w"] + head["b"]


def _scatter(batch, c_R, num_units, max_turns):
  valid = batch["valid"] > 0
  where = (batch["unit"], batch["step"])
  c_UxT = jnp.zeros((num_units, max_turns), jnp.float32).at[where].add(
      jnp.where(valid, c_R, 0.0))
  mask_UxT = jnp.zeros((num_units, max_turns), jnp.int32).at[where].max(
      valid.astype(jnp.int32)) > 0
  return c_UxT, mask_UxT


def _train_step(graphdef, tx, num_units, max_turns):
  def loss_fn(params, batch, outcome_U):
    c_UxT, mask_UxT = _scatter(batch, progress(graphdef, params, batch), num_units, max_turns)
    return progress_loss(c_UxT, mask_UxT, outcome_U, mask_UxT.any(-1))

  def step(state, batch, outcome_U):
    loss, grads = jax.value_and_grad(loss_fn)(state.params, batch, outcome_U)
    return ts.apply_update(tx, state, loss, grads, {"loss": loss})

  return jax.jit(step, donate_argnums=0)


class SPA(base.Algorithm):
  name = "spa"

  def __init__(self):
    self._fns = None

  def init_aux(self, cfg, params) -> dict:
    s = cfg.algo.spa
    d = cfg.model.hidden_size
    head = {"w": jnp.zeros((d,), jnp.float32), "b": jnp.zeros((), jnp.float32)}
    # A copy: the policy's buffers are donated to its jitted step.
    est = {"body": jax.tree.map(jnp.copy, params), "head": head}
    return {"estimator": ts.init_state(est, base.aux_optimizer(s.learning_rate, s.grad_clip)),
            "ready": jnp.zeros((), jnp.int32)}

  def _compile(self, ctx):
    if self._fns is None:
      c, s = ctx.cfg, ctx.cfg.algo.spa
      tx = base.aux_optimizer(s.learning_rate, s.grad_clip)
      rows = self._rows(ctx)
      self._fns = (_train_step(ctx.graphdef, tx, rows, c.rollout.max_turns),
                   jax.jit(lambda p, b: progress(ctx.graphdef, p, b)))
    return self._fns

  def _rows(self, ctx) -> int:
    return max(ctx.cfg.algo.spa.batch_rows, ctx.cfg.rollout.max_turns)

  def _pack(self, ctx, units):
    r = ctx.cfg.rollout
    # At most one unit per row, so `rows` units per batch is never the binding limit.
    return base.pack(units, rows_per_batch=self._rows(ctx), units_per_batch=self._rows(ctx),
                     seq_len=r.seq_len,
                     action_len=r.max_action_tokens, pad_id=ctx.pad_id)

  # -- once per run: exploration and the estimator --------------------------------------

  def explore_cap(self, cfg) -> float:
    """The exploration's share of the `rl_env_steps` budget (no cap without one)."""
    return cfg.algo.spa.explore_share * cfg.rl_env_steps if cfg.rl_env_steps else float("inf")

  def explore(self, ctx) -> list[dict]:
    """The exploration episodes as {"won", "rows", "steps"}, played chunk by chunk or read
    back, until `explore_tasks` tasks are explored or the chunk that reaches the cap."""
    c, s = ctx.cfg, ctx.cfg.algo.spa
    tasks = [(c.env.train_split, i) for i in range(min(s.explore_tasks, c.env.num_train_tasks))]
    per_chunk = max(1, c.rollout.num_envs // s.explore_k)  # one wave of the pool
    directory = os.path.join(ctx.workdir, "spa_explore")
    os.makedirs(directory, exist_ok=True)
    episodes, cap = [], self.explore_cap(c)
    for k, start in enumerate(range(0, len(tasks), per_chunk)):
      if explored_steps(episodes) >= cap:
        break
      path = os.path.join(directory, f"chunk_{k:05d}.json")
      if not os.path.exists(path):
        chunk = [t for t in tasks[start:start + per_chunk] for _ in range(s.explore_k)]
        key = jax.random.fold_in(jax.random.key(c.seed), _EXPLORE_KEY + k)
        eps = [{"won": bool(tr.won), "rows": groups.step_rows(tr, c.rollout.max_turns),
                "steps": int(tr.length)} for tr in ctx.play(chunk, key)]
        with open(path + ".tmp", "w") as f:
          json.dump(eps, f)
        os.replace(path + ".tmp", path)  # a chunk on disk is always whole
      with open(path) as f:
        episodes.extend(json.load(f))
    return episodes

  def train_estimator(self, ctx, est, episodes: list[dict]):
    """`spa.epochs` shuffled passes over the episodes; returns (state, the last epoch's
    batch losses)."""
    c, s = ctx.cfg, ctx.cfg.algo.spa
    train_step, _ = self._compile(ctx)
    units = [[(0, row) for row in ep["rows"]] for ep in episodes if ep["rows"]]
    outcome = np.array([float(ep["won"]) for ep in episodes if ep["rows"]], np.float32)
    losses = []
    for epoch in range(s.epochs):
      order = np.random.default_rng([c.seed, epoch]).permutation(len(units))
      losses = []
      for idx, batch in self._pack(ctx, [units[i] for i in order]):
        out_U = np.zeros(self._rows(ctx), np.float32)
        out_U[:len(idx)] = outcome[order[idx]]
        est, m = train_step(est, ctx.to_device(batch), jnp.asarray(out_U))
        losses.append(float(m["loss"]))
    return est, losses

  def _setup(self, ctx, aux) -> tuple[dict, dict, int]:
    t0 = time.perf_counter()
    episodes = self.explore(ctx)
    t1 = time.perf_counter()
    est, losses = self.train_estimator(ctx, aux["estimator"], episodes)
    m = {"spa/explore_episodes": float(len(episodes)),
         "spa/explore_success": float(np.mean([ep["won"] for ep in episodes])),
         # The mean batch loss over the last epoch.
         "spa/estimator_loss": float(np.mean(losses)) if losses else float("nan"),
         "perf/explore_s": t1 - t0, "perf/estimator_train_s": time.perf_counter() - t1}
    # Every explored step counts, read back or not: the checkpoint before exploration
    # did not count them.
    played = explored_steps(episodes)
    m["spa/explore_steps"] = float(played)
    if not ctx.cfg.rl_env_steps:
      print(f"spa: no rl_env_steps budget, so the {played} exploration steps come on top of "
            f"the rollouts of rl_iterations={ctx.cfg.rl_iterations}")
    return {"estimator": est, "ready": jnp.ones((), jnp.int32)}, m, played

  # -- every iteration ---------------------------------------------------------------------

  def progress_BxGxT(self, ctx, est_params, groups_batch) -> np.ndarray:
    _, progress_fn = self._compile(ctx)
    c_BxGxT = np.zeros(groups_batch.arrays.mask_BxGxT.shape, np.float32)
    place_Ux2 = np.asarray([(b, g) for b, g, _ in groups_batch.places()], np.int64)
    for idx, batch in self._pack(ctx, groups.episode_units(groups_batch,
                                                            ctx.cfg.rollout.max_turns)):
      c_R = np.asarray(progress_fn(est_params, ctx.to_device(batch)))
      ok = batch["valid"] > 0
      b, g = place_Ux2[np.asarray(idx)[batch["unit"][ok]]].T
      c_BxGxT[b, g, batch["step"][ok]] = c_R[ok]
    return c_BxGxT

  def prepare(self, ctx, it, batch, params, aux) -> base.Prepared:
    c, s = ctx.cfg, ctx.cfg.algo.spa
    arrays = batch.arrays
    m, played = {}, 0
    if not int(aux["ready"]):
      aux, m, played = self._setup(ctx, aux)
    t0 = time.perf_counter()
    c_BxGxT = self.progress_BxGxT(ctx, aux["estimator"].params, batch)
    m["perf/aux_s"] = time.perf_counter() - t0
    r_BxGxT = spa_step_rewards(c_BxGxT, ~arrays.invalid_BxGxT, arrays.mask_BxGxT,
                               progress_coef=s.progress_coef, grounding=s.grounding,
                               invalid_penalty=c.algo.invalid_penalty,
                               grounding_mode=s.grounding_mode)
    adv_BxGxT = np.asarray(spa_advantages(r_BxGxT, jnp.asarray(arrays.mask_BxGxT), s.gamma))
    act = arrays.mask_BxGxT
    m |= {"spa/progress_mean": float(c_BxGxT[act].mean()) if act.any() else 0.0,
          "spa/progress_sum_won": _mean_sum(c_BxGxT, act, arrays.rewards_BxG > 0),
          "spa/progress_sum_lost": _mean_sum(c_BxGxT, act, arrays.rewards_BxG <= 0)}
    m |= advantage_diagnostics(adv_BxGxT, act, arrays.rewards_BxG > 0)
    rows = groups.rl_rows(batch, adv_BxGxT, c.algo.row_weight)
    return base.Prepared(rows=rows, aux=aux, metrics=m, adv_BxGxT=adv_BxGxT,
                         skip=base.skip_update(adv_BxGxT, c.algo), env_steps=played)


def explored_steps(episodes: list[dict]) -> int:
  """Environment steps of exploration episodes."""
  return sum(int(ep["steps"]) for ep in episodes)


def advantage_diagnostics(adv_BxGxT, mask_BxGxT, won_BxG) -> dict[str, float]:
  """Which way the credit points, per iteration: "spa/adv_won_minus_lost", the mean
  advantage of won episodes' steps minus lost ones' in the groups that have both (> 0 when
  the credit points the right way; NaN without such a group), and
  "spa/adv_steps_left_corr", the correlation over active steps between a step's advantage
  and the steps left in its episode (near 1 when the return counts steps, not progress)."""
  mask = np.asarray(mask_BxGxT, bool)
  won = np.asarray(won_BxG, bool)
  mixed_B = won.any(1) & ~won.all(1)
  w = mask & (won & mixed_B[:, None])[..., None]
  l = mask & (~won & mixed_B[:, None])[..., None]
  diff = (float(adv_BxGxT[w].mean() - adv_BxGxT[l].mean()) if w.any() and l.any()
          else float("nan"))
  left = mask.sum(-1, keepdims=True) - np.cumsum(mask, -1) + 1  # this step included
  x, y = adv_BxGxT[mask], left[mask].astype(np.float64)
  corr = float(np.corrcoef(x, y)[0, 1]) if x.size > 1 and x.std() > 0 and y.std() > 0 \
      else float("nan")
  return {"spa/adv_won_minus_lost": diff, "spa/adv_steps_left_corr": corr}


def _mean_sum(c_BxGxT, mask_BxGxT, which_BxG) -> float:
  """Mean over the chosen episodes of sum_t c_t (NaN if none): should approach R."""
  sums = np.where(mask_BxGxT, c_BxGxT, 0.0).sum(-1)[which_BxG & mask_BxGxT.any(-1)]
  return float(sums.mean()) if sums.size else float("nan")
