"""RL methods behind one seam (base.py): the estimator methods, iStar, SPA-RL, M-DPO.

`get(name)` builds the method named by `algo.method`; the trainer calls only the
protocol of `base.Algorithm` and never branches on a name. `pack_state`/`unpack_state`
put a method's aux state beside the train state in the one pytree a checkpoint saves.
"""

from __future__ import annotations

from typing import Any

from csa_jax.algorithms.base import Algorithm, Context, Prepared
from csa_jax.algorithms.estimator import EstimatorAlgorithm
from csa_jax.algorithms.istar import IStar
from csa_jax.algorithms.mtdpo import MultiTurnDPO
from csa_jax.algorithms.spa import SPA
from csa_jax.methods import METHODS

# Each name of the one list of RL methods (csa_jax/methods.py) with its implementation.
_METHODS = {a.name: a for a in (EstimatorAlgorithm, IStar, SPA, MultiTurnDPO)}
if tuple(_METHODS) != METHODS:  # a method added to one place and not the other
  raise ImportError(f"csa_jax/methods.py lists {METHODS}, csa_jax/algorithms implements "
                    f"{tuple(_METHODS)}")


def get(name: str) -> Algorithm:
  if name not in _METHODS:
    raise ValueError(f"unknown algo.method {name!r}; known: {', '.join(sorted(_METHODS))}")
  return _METHODS[name]()


def label(algo) -> str:
  """What a run is called in logs: "estimator csa", "istar", "spa", "mtdpo"."""
  return f"estimator {algo.estimator}" if algo.method == "estimator" else algo.method


def pack_state(state, aux) -> Any:
  """The saved tree: the train state alone for methods without aux state (checkpoints
  of estimator methods keep their layout), else {"train": state, "aux": aux}."""
  return {"train": state, "aux": aux} if aux else state


def unpack_state(tree, aux_template) -> tuple[Any, Any]:
  return (tree["train"], tree["aux"]) if aux_template else (tree, aux_template)


__all__ = ["Algorithm", "Context", "Prepared", "get", "label", "pack_state", "unpack_state"]
