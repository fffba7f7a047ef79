"""The jitted updates: behaviour cloning and the PPO-style clipped policy step.

Functional NNX (as in Tunix/MaxText): the model is split once into a static graph
definition and a parameter pytree; the steps are pure functions of
(TrainState, batch) -> (TrainState, metrics), jitted with the state donated, so XLA
updates parameters and optimizer state in place. Batches are the fixed-shape arrays of
`csa_jax.update.data`: [N, L] inputs, and [N, A] action-token targets at input positions act_pos;
the loss falls where loss_mask is 1.

LoRA policies (csa_jax/model/lora.py): `TrainState.params` is the whole model's State, but
only its trainable part (the adapters; everything in a full-parameter run) has optimizer
state, gradients and donated buffers. `Update` splits the state before the jitted step and
joins it after: the frozen base goes in as a plain argument, so it is neither copied nor
invalidated, and a KL reference over the same base is passed as its adapters alone.
"""

from __future__ import annotations

from typing import Any, Callable

import flax
import jax
import jax.numpy as jnp
import optax
from flax import nnx

from csa_jax import losses
from csa_jax.config import AlgoConfig, OptimConfig
from csa_jax.distributed import mesh as mesh_lib
from csa_jax.distributed import processes as dist
from csa_jax.model import lora, token_logprobs
from csa_jax.model.sampling import SamplingConfig, sampling_logprobs

Batch = dict[str, jax.Array]


@flax.struct.dataclass
class TrainState:
  step: jax.Array
  params: Any  # nnx.State of nnx.Param
  opt_state: optax.OptState


def make_optimizer(cfg: OptimConfig, learning_rate: float | None = None,
                   total_steps: int | None = None) -> optax.GradientTransformation:
  lr = cfg.learning_rate if learning_rate is None else learning_rate
  if cfg.warmup_steps > 0:
    lr = optax.linear_schedule(0.0, lr, cfg.warmup_steps)
  mu_dtype = getattr(cfg, "mu_dtype", "") or None  # AdamW's first moment: bf16 halves it
  return optax.chain(
      optax.clip_by_global_norm(cfg.grad_clip) if cfg.grad_clip > 0 else optax.identity(),
      optax.adamw(lr, b1=cfg.b1, b2=cfg.b2, weight_decay=cfg.weight_decay,
                  mu_dtype=mu_dtype),
  )


def init_state(params, tx: optax.GradientTransformation) -> TrainState:
  """A fresh state; the optimizer's moments exist for the trainable part only."""
  return TrainState(step=jnp.zeros((), jnp.int32), params=params,
                    opt_state=tx.init(lora.trainable(params)))


def placed_state(params, tx: optax.GradientTransformation, mesh) -> TrainState:
  """A fresh state placed as the jitted update returns it: the parameters by their
  logical axes, the optimizer's moments like their parameter, its counts replicated. A
  fresh optimizer's arrays otherwise sit unplaced, and the second update compiles the
  whole step again for the placed state the first one returned."""
  state = init_state(params, tx)
  if dist.multi():  # a global array from each process's copy: dist.on_mesh
    return dist.on_mesh(state, mesh)
  p_sh = mesh_lib.state_shardings(params, mesh, mesh_lib.TRAIN_RULES)
  return jax.device_put(state, TrainState(
      step=mesh_lib.replicated(mesh), params=p_sh,
      opt_state=mesh_lib.opt_state_shardings(tx, state.opt_state, lora.trainable(p_sh),
                                             mesh)))


def reference_params(params, dtype: str = ""):
  """A KL reference template of `params`: cast to `dtype` ("bfloat16": half the bytes of a
  float32 copy, and the same logits when the model computes in bfloat16, since every
  parameter is cast to the compute dtype before use); with adapters, `params` itself (the
  reference is the SFT adapters over the policy's own base)."""
  if not dtype or lora.tree_has_lora(params):
    return params
  return jax.tree.map(lambda x: x.astype(dtype), params)


def action_logits(graphdef, params, batch: Batch) -> jax.Array:
  """Logits [N, A, V] at the positions that predict action tokens; for a packed batch
  (csa_jax/update/data.py, `segment_ids` present) at its act_idx slots of the flattened
  [S * L] sequences, [R, A, V] in row order; for a prefixed one (`prefix` present) with
  the prefix computed once: the same arrays as the rows unpacked."""
  model = nnx.merge(graphdef, params)
  if "prefix" in batch:  # every row holds the same prefix: one row of it serves them all
    return model.logits(model.hidden_states_prefixed(
        batch["prefix"][:1], batch["inputs"], attention_mask_BxS=batch["attn_mask"],
        at_BxK=batch["act_pos"]))
  if "segment_ids" not in batch:
    return model(batch["inputs"], attention_mask_BxT=batch["attn_mask"],
                 logit_positions_BxK=batch["act_pos"])
  x_SxLxD = model.hidden_states(batch["inputs"], positions_BxT=batch["positions"],
                                attention_mask_BxT=batch["attn_mask"],
                                segment_ids_BxT=batch["segment_ids"])
  x_RxAxD = jnp.take(x_SxLxD.reshape(-1, x_SxLxD.shape[-1]), batch["act_idx"], axis=0)
  return model.logits(x_RxAxD)


def apply_update(tx, state: TrainState, loss, grads, metrics) -> tuple[TrainState, dict]:
  """One optimizer step, skipped when the loss or the gradient is not finite.

  A NaN/Inf step would poison Adam's moments for good, so the new state is selected
  with `jnp.where` (no host round-trip): a skipped step leaves parameters, optimizer
  state and the step counter exactly as they were, and says so in `nonfinite_loss` /
  `nonfinite_grad` (1.0 when that part was not finite); the host loop counts them.
  """
  params, frozen = lora.split(state.params)  # only the adapters move in a LoRA model
  if frozen:
    grads = lora.trainable(grads)
  grad_norm = optax.tree.norm(grads)
  loss_ok, grad_ok = jnp.isfinite(loss), jnp.isfinite(grad_norm)
  ok = loss_ok & grad_ok
  # Zero the gradient of a skipped step so the discarded update itself stays finite.
  grads = jax.tree.map(lambda g: jnp.where(ok, g, jnp.zeros_like(g)), grads)
  updates, opt_state = tx.update(grads, state.opt_state, params)
  new = TrainState(step=state.step + 1, params=optax.apply_updates(params, updates),
                   opt_state=opt_state)
  old = TrainState(step=state.step, params=params, opt_state=state.opt_state)
  state = jax.tree.map(lambda n, o: jnp.where(ok, n, o), new, old)
  state = state.replace(params=lora.merge(state.params, frozen))
  metrics = dict(metrics, grad_norm=grad_norm,
                 nonfinite_loss=(~loss_ok).astype(jnp.float32),
                 nonfinite_grad=(~grad_ok).astype(jnp.float32))
  return state, metrics


def value_and_grad_micro(loss_fn, params, batch: Batch, *extra, micro_batches: int = 1):
  """((loss, metrics), grads) of `loss_fn(params, batch, *extra)`, computed over
  `micro_batches` slices of the batch one after another (gradient accumulation): the
  activations of one slice are live at a time, which is what lets long rows of a big
  model fit (verl's micro-batches). Row i goes to slice i % micro_batches, so each slice
  keeps the batch's sharding over 'data'. Loss, metrics and gradients are the means over
  slices: equal to the whole batch's for a loss that is a mean over rows of equal weight
  ("seq-mean-..."); for a token mean, each slice's token mean is averaged, as in verl."""
  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
  if micro_batches == 1:
    return grad_fn(params, batch, *extra)
  # Each array is sliced along its own first axis (a packed batch has S sequences and R
  # rows; data.pack_rows lays out each slice's rows in that slice's sequences).
  for k, v in batch.items():
    if v.shape[0] % micro_batches:
      raise ValueError(f"{k}: a batch of {v.shape[0]} rows does not split into "
                       f"{micro_batches} micro-batches")
  sliced = {k: jnp.moveaxis(v.reshape(v.shape[0] // micro_batches, micro_batches,
                                      *v.shape[1:]), 1, 0)
            for k, v in batch.items()}

  def body(acc, mb):
    out = grad_fn(params, mb, *extra)
    return jax.tree.map(jnp.add, acc, out), None

  first = jax.tree.map(lambda v: v[0], sliced)
  zeros = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype),
                       jax.eval_shape(grad_fn, params, first, *extra))
  total, _ = jax.lax.scan(body, zeros, sliced)
  return jax.tree.map(lambda x: x / micro_batches, total)


class Update:
  """A jitted update `(state, batch, ref_params=None) -> (state, metrics)` of
  `loss_fn(params, batch, ref_params) -> (loss, metrics)`, over the state's trainable part.

  The jitted program takes (trainable state, frozen base, batch, reference's trainable
  part), donates the first alone, and differentiates the loss with respect to the
  trainable parameters only (`value_and_grad_micro` over `micro_batches` slices). For a
  full-parameter model the frozen part is empty and the reference is passed whole.
  `lower` lowers the same program for given (abstract) arguments (the dry run).
  """

  def __init__(self, tx, loss_fn, micro_batches: int = 1):
    def step(state: TrainState, frozen, batch: Batch, ref_trainable):
      def loss_t(params, batch, ref_trainable):
        ref = None if ref_trainable is None else lora.merge(ref_trainable, frozen)
        return loss_fn(lora.merge(params, frozen), batch, ref)

      (loss, metrics), grads = value_and_grad_micro(loss_t, state.params, batch, ref_trainable,
                                                    micro_batches=micro_batches)
      return apply_update(tx, state, loss, grads, metrics)

    self._jit = jax.jit(step, donate_argnums=0)

  @staticmethod
  def _args(state: TrainState, batch: Batch, ref_params):
    params, frozen = lora.split(state.params)
    if ref_params is not None and frozen:
      ref_params = lora.trainable(ref_params)
    return TrainState(step=state.step, params=params, opt_state=state.opt_state), frozen, \
        batch, ref_params

  def __call__(self, state: TrainState, batch: Batch, ref_params=None):
    args = self._args(state, batch, ref_params)
    new, metrics = self._jit(*args)
    return new.replace(params=lora.merge(new.params, args[1])), metrics

  def lower(self, state: TrainState, batch: Batch, ref_params=None):
    return self._jit.lower(*self._args(state, batch, ref_params))


def make_sft_step(graphdef, tx, micro_batches: int = 1
                  ) -> Callable[[TrainState, Batch], tuple[TrainState, dict]]:
  """Mean negative log-likelihood of the expert's action tokens."""

  def loss_fn(params, batch, ref_params):
    del ref_params
    logp_NxA = token_logprobs(action_logits(graphdef, params, batch), batch["targets"])
    mask = batch["loss_mask"]
    nll = -(logp_NxA * mask).sum() / jnp.maximum(mask.sum(), 1.0)
    return nll, {"nll": nll}

  return Update(tx, loss_fn, micro_batches)


def make_rl_loss(graphdef, algo: AlgoConfig, sampling_cfg: SamplingConfig):
  """(params, batch, ref_params) -> (loss, metrics): what the RL step differentiates.

  The ratio's numerator is the log-prob under the same distribution the rollout sampled
  from (temperature, top-k, top-p of `sampling_cfg`), as the sampler recorded its
  denominator, so a fresh policy has ratio exactly 1. The KL term compares the policy
  and the reference under that same distribution (as verl does, both logits over the
  temperature), so a policy equal to its reference has KL 0 at any temperature.
  `ref_params` is used only when algo.kl_coef > 0.
  """

  def loss_fn(params, batch, ref_params):
    logits_NxAxV = action_logits(graphdef, params, batch)
    logp_NxA = sampling_logprobs(logits_NxAxV, batch["targets"], sampling_cfg)
    mask = batch["loss_mask"]
    loss, metrics = losses.clipped_policy_loss(
        logp_NxA, batch["old_logp"], batch["adv"], mask,
        clip_low=algo.clip_low, clip_high=algo.clip_high,
        dual_clip=algo.dual_clip if algo.dual_clip > 0 else None, agg=algo.loss_agg)
    metrics = dict(metrics, pg_loss=loss,
                   entropy=losses.entropy_from_logits(logits_NxAxV, mask))
    if algo.entropy_coef:
      loss = loss - algo.entropy_coef * metrics["entropy"]
    if algo.kl_coef:
      ref_logp = jax.lax.stop_gradient(sampling_logprobs(
          action_logits(graphdef, ref_params, batch), batch["targets"], sampling_cfg))
      kl = losses.kl_penalty(logp_NxA, ref_logp, mask, kind=algo.kl_kind, agg=algo.loss_agg)
      loss = loss + algo.kl_coef * kl
      metrics["kl_ref"] = kl
    return loss, metrics

  return loss_fn


def make_rl_step(graphdef, tx, algo: AlgoConfig, sampling_cfg: SamplingConfig,
                 micro_batches: int = 1):
  """The clipped policy-gradient step over `make_rl_loss`."""
  return Update(tx, make_rl_loss(graphdef, algo, sampling_cfg), micro_batches)
