"""The seam between the trainer's loop and one RL method.

An RL iteration is: play B x G episodes (the trainer), turn them into training rows
(`Algorithm.prepare`, which may also train an auxiliary model), update the policy on
the rows (`Algorithm.update`). A method's extra state (an auxiliary model's parameters
and optimizer state) is one pytree, `aux`, that the trainer only carries and
checkpoints; `init_aux` builds it from the SFT parameters. The estimator methods
(GRPO, CSA, GiGPO, ...) are the simplest case: no aux state, advantages from a jitted
estimator, the clipped update.

Also here, what several methods share: the clipped update over shuffled minibatches,
and `pack`, which lays whole units (a task group, an episode, a pair of episodes) into
fixed-shape row batches with each row's place in its unit, so that a loss over whole
episodes is one jitted function over padded [units, ..., T] arrays.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import grain
import jax
import numpy as np
import optax

from csa_jax import perf as perf_lib
from csa_jax.config import ExperimentConfig, OptimConfig, micro_batches
from csa_jax.model.sampling import SamplingConfig
from csa_jax.rollout.episodes import Trajectory
from csa_jax.rollout.groups import GroupBatch
from csa_jax.update import data as data_lib
from csa_jax.update import train_step as ts


@dataclasses.dataclass
class Context:
  """What the trainer lends a method for the run (host handles; nothing here is saved)."""

  cfg: ExperimentConfig
  graphdef: Any
  tx: optax.GradientTransformation  # the policy's optimizer
  sampling_cfg: SamplingConfig
  # (rows, batch_size, *, seed, epochs) -> shuffled fixed-shape batches (data.batches).
  batches: Callable[..., grain.MapDataset]
  to_device: Callable[[dict], dict]
  pad_id: int
  # (tasks, jax key) -> one episode per task with the current sampling policy, whose
  # randomness comes from that key alone (SPA's exploration).
  play: Callable[[list[tuple[str, int]], jax.Array], list[Trajectory]]
  workdir: str
  ref_params: Any = None  # the SFT policy when loaded (KL anchor, M-DPO reference)
  # The run's csa_jax.perf.Timer: `update` times batch building and update steps in it.
  perf: Any = None


@dataclasses.dataclass
class Prepared:
  """An iteration's training input, made by `Algorithm.prepare`."""

  rows: list  # training rows (data.Row, or a method's own row dicts)
  aux: Any  # the aux state after this iteration's auxiliary updates
  metrics: dict[str, float]
  adv_BxGxT: np.ndarray | None = None  # per-step advantages, for adv/ and credit/ metrics
  skip: bool = False  # nothing to learn from: no policy update (and no Adam drift)
  env_steps: int = 0  # environment steps the method played itself (exploration)


class Algorithm:
  """The protocol; this base class is the clipped update without aux state."""

  name = "base"
  # Whether `Context.ref_params` must hold the SFT policy even without a KL term.
  needs_sft_reference = False
  # Whether the method runs with several processes: each plays its share of the task
  # groups and the update is one collective. Methods with an auxiliary model or episodes
  # of their own (exploration) do not split those across processes yet.
  multiprocess = False

  def init_aux(self, cfg: ExperimentConfig, params) -> dict:
    """Aux state from the SFT parameters ({} for none); also the restore template."""
    del cfg, params
    return {}

  def prepare(self, ctx: Context, it: int, batch: GroupBatch, params, aux) -> Prepared:
    """Training rows from this iteration's task groups (groups.GroupBatch: the episodes
    by group and their padded arrays)."""
    raise NotImplementedError

  def make_step(self, ctx: Context):
    """The jitted policy step: (state, batch, ref_params) -> (state, metrics)."""
    return ts.make_rl_step(ctx.graphdef, ctx.tx, ctx.cfg.algo, ctx.sampling_cfg,
                           micro_batches(ctx.cfg.optim, ctx.cfg.algo.minibatch_size))

  def update(self, ctx: Context, step, state, prep: Prepared, it: int, ref_params,
             observe: Callable[[dict], None] = lambda upd: None):
    """The clipped update over `algo.epochs` shuffles of the rows in minibatches; every
    step's metrics go through `observe` (the trainer's non-finite guard); returns the
    state and the last step's metrics."""
    a = ctx.cfg.algo
    perf = ctx.perf if ctx.perf is not None else perf_lib.Timer()
    ds = ctx.batches(prep.rows, a.minibatch_size, seed=ctx.cfg.seed + it, epochs=a.epochs)
    upd, batches = {}, data_lib.iterate(ds)
    while True:
      with perf.phase("batch"):
        batch = next(batches, None)
        if batch is None:
          break
        on_device = ctx.to_device(batch)
      perf.count_train_batch(*data_lib.token_counts(
          batch, micro_batches(ctx.cfg.optim, a.minibatch_size)))
      with perf.phase("update"):  # observe reads the metrics: the step has finished
        state, upd = step(state, on_device, ref_params)
        observe(upd)
    return state, upd


def skip_update(adv_BxGxT: np.ndarray, algo) -> bool:
  """With every advantage 0 (all groups uniform) the policy gradient is 0, yet Adam's
  moments would still move the parameters (m / sqrt(v) decays slowly): no update, unless
  a KL or entropy term has a gradient of its own."""
  return not adv_BxGxT.any() and not (algo.kl_coef or algo.entropy_coef)


def aux_optimizer(learning_rate: float, grad_clip: float) -> optax.GradientTransformation:
  """AdamW for an auxiliary model (no weight decay, as the authors' PRM and estimator)."""
  return ts.make_optimizer(OptimConfig(learning_rate=learning_rate, grad_clip=grad_clip,
                                       weight_decay=0.0))


# ----------------------------------------------------------------------------------------
# Packing whole units into fixed-shape row batches.

# Per-row placement arrays next to data.BATCH_KEYS: the row's unit in the batch, its
# slot inside the unit (rollout g, or winner 0 / loser 1), its step t, and 1 on real rows.
PLACE_KEYS = ("unit", "slot", "step", "valid")


def pack(units: Sequence[Sequence[tuple[int, data_lib.Row]]], *, rows_per_batch: int,
         units_per_batch: int, seq_len: int, action_len: int, pad_id: int
         ) -> list[tuple[list[int], dict[str, np.ndarray]]]:
  """Greedy in-order packing: each batch holds whole units, at most `units_per_batch`
  of them and `rows_per_batch` rows, padded with rows whose `valid` (and loss mask) is 0.

  A unit is a list of (slot, row) with row["t"] its step. Returns, per batch, the indices
  of its units and its arrays: data.BATCH_KEYS [R, ...] and PLACE_KEYS [R].
  """
  out, cur, n = [], [], 0
  for u, rows in enumerate(units):
    if len(rows) > rows_per_batch:
      raise ValueError(f"a unit of {len(rows)} rows does not fit a batch of "
                       f"{rows_per_batch}")
    if cur and (n + len(rows) > rows_per_batch or len(cur) == units_per_batch):
      out.append(cur)
      cur, n = [], 0
    cur.append(u)
    n += len(rows)
  if cur:
    out.append(cur)
  return [(idx, _batch_arrays([units[u] for u in idx], rows_per_batch, seq_len, action_len,
                              pad_id)) for idx in out]


def _batch_arrays(units, rows_per_batch, seq_len, action_len, pad_id) -> dict[str, np.ndarray]:
  arrays, place = [], []
  for k, unit in enumerate(units):
    for slot, row in unit:
      arrays.append(data_lib.row_arrays(row, seq_len, action_len))
      place.append((k, slot, row["t"], 1))
  empty = data_lib.row_arrays({"prompt_ids": [pad_id, pad_id], "action_ids": [],
                               "old_logps": [], "advantage": 0.0}, seq_len, action_len)
  arrays += [empty] * (rows_per_batch - len(arrays))
  place += [(0, 0, 0, 0)] * (rows_per_batch - len(place))
  batch = {k: np.stack([a[k] for a in arrays]) for k in data_lib.BATCH_KEYS}
  place_Rx4 = np.asarray(place, np.int32)
  batch |= {k: place_Rx4[:, i] for i, k in enumerate(PLACE_KEYS)}
  return batch
