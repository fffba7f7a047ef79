"""The estimators' registry: each estimator registers beside its definition with `@register`.

    @register("csa", step_term=csa_step_term)
    @functools.partial(jax.jit, static_argnames=("ddof",))
    def csa_advantages(rewards_BxG, logp_BxGxT, mask_BxGxT, *, lam, eps, ddof): ...

A registered function's positional parameters are the arrays it reads (names from
`INPUTS`) and its keyword-only parameters its knobs. Every knob is the `AlgoConfig` field
of the same name (`algo.lam`, `algo.eps`, ...) and takes its value from there, so a knob
has no default in the signature: the config is its one home. Refused when it registers,
before anything runs: a name registered twice, an input that is not in `INPUTS`, a knob
that is no config field (it would never be set: a typo must not fall back to a default),
a knob with a default. The trainer calls every estimator with one keyword signature
(`Estimator.__call__`); `csa_jax.algorithms.estimator.compute_advantages` passes the knobs.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Callable

import jax

from csa_jax.algo_config import AlgoConfig

# The arrays an estimator may read (csa_jax/rollout/groups.py's GroupArrays, the rewards shaped).
INPUTS = ("rewards_BxG", "logp_BxGxT", "mask_BxGxT", "step_rewards_BxGxT",
          "state_id_BxGxT", "invalid_BxGxT")


@dataclasses.dataclass(frozen=True)
class Estimator:
  """An advantage estimator callable with the trainer's uniform keyword signature.

  `est(rewards_BxG=..., logp_BxGxT=..., mask_BxGxT=..., step_rewards_BxGxT=...,
  state_id_BxGxT=..., invalid_BxGxT=..., **knobs) -> adv_BxGxT`. Arrays it does not use
  may be given or left out; `requires` lists those it needs, `hparams` the knobs it
  takes, each of them (a missing or an unknown one is an error). `step_term`, where the
  estimator has one, is its step term A_S alone, as an Estimator of its own (the credit
  study compares it).
  """

  name: str
  fn: Callable[..., jax.Array]
  requires: tuple[str, ...]
  hparams: tuple[str, ...]
  step_term: "Estimator | None" = None

  def __call__(self, **kwargs: Any) -> jax.Array:
    arrays = {k: kwargs.pop(k) for k in INPUTS if k in kwargs}
    unknown = sorted(set(kwargs) - set(self.hparams))
    if unknown:
      raise ValueError(f"estimator {self.name!r} got unknown hparams {unknown}; it "
                       f"accepts {list(self.hparams)}")
    missing = [k for k in self.requires if arrays.get(k) is None]
    if missing:
      raise ValueError(f"estimator {self.name!r} needs {missing}; it uses "
                       f"{list(self.requires)}")
    unset = [k for k in self.hparams if k not in kwargs]
    if unset:
      raise ValueError(f"estimator {self.name!r} needs the knobs {unset} (their values are "
                       "the AlgoConfig fields of those names)")
    return self.fn(**{k: arrays[k] for k in self.requires}, **kwargs)


_REGISTRY: dict[str, Estimator] = {}


def _config_fields() -> set[str]:
  return {f.name for f in dataclasses.fields(AlgoConfig)}


def describe(name: str, fn: Callable[..., jax.Array]) -> Estimator:
  """The Estimator of `fn` (its inputs and knobs read from its signature), checked: see
  the module docstring for what is refused."""
  params = inspect.signature(fn).parameters.values()
  requires = tuple(p.name for p in params if p.kind == p.POSITIONAL_OR_KEYWORD)
  hparams = tuple(p.name for p in params if p.kind == p.KEYWORD_ONLY)
  other = [p.name for p in params if p.kind not in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
  if other:
    raise ValueError(f"estimator {name!r}: parameters {other} are neither inputs nor knobs")
  unknown = sorted(set(requires) - set(INPUTS))
  if unknown:
    raise ValueError(f"estimator {name!r} requires unknown inputs {unknown}; "
                     f"valid: {list(INPUTS)}")
  missing = sorted(set(hparams) - _config_fields())
  if missing:
    raise ValueError(f"estimator {name!r} declares hparams {missing} that are not "
                     "fields of AlgoConfig (csa_jax/algo_config.py): add them there (with a "
                     "default) so that `--set algo.<name>=...` reaches it")
  defaults = sorted(p.name for p in params if p.default is not p.empty)
  if defaults:
    raise ValueError(f"estimator {name!r} gives defaults to {defaults}: a default lives "
                     "in its AlgoConfig field only")
  return Estimator(name, fn, requires, hparams)


def register(name: str, *, step_term: Callable[..., jax.Array] | None = None):
  """Decorator: registers the function as estimator `name` (and `step_term`, if given, as
  its step term alone) and returns it unchanged."""

  def add(fn):
    if name in _REGISTRY:
      raise ValueError(f"estimator {name!r} is registered twice")
    est = describe(name, fn)
    if step_term is not None:
      est = dataclasses.replace(est, step_term=describe(f"{name} step term", step_term))
    _REGISTRY[name] = est
    return fn

  return add


def list_estimators() -> list[str]:
  return sorted(_REGISTRY)


def get_estimator(name: str) -> Estimator:
  """The estimator registered as `name`; see `Estimator` for the call signature and each
  estimator's function for its definition."""
  if name not in _REGISTRY:
    raise ValueError(f"unknown advantage estimator {name!r}; known: "
                     f"{', '.join(list_estimators())}")
  return _REGISTRY[name]
