"""The host's guard against a diverging run: the jitted step skips an update whose loss or
gradient is not finite (`train_step.apply_update`); this counts the skips and stops the
run after too many in a row."""

from __future__ import annotations


class NonFiniteError(RuntimeError):
  """Too many updates in a row had a non-finite loss or gradient: the run diverged."""


class NonFiniteGuard:
  """Counts the updates the jitted step skipped (`train_step.apply_update`) and stops
  the run after `limit` in a row (0: never), naming where and what was not finite."""

  def __init__(self, limit: int):
    self.limit, self.in_a_row, self.total = limit, 0, 0

  def observe(self, metrics: dict, where: str) -> bool:
    """True when this update was skipped."""
    what = [name for name in ("loss", "grad") if float(metrics[f"nonfinite_{name}"]) > 0]
    if not what:
      self.in_a_row = 0
      return False
    self.in_a_row += 1
    self.total += 1
    if self.limit and self.in_a_row >= self.limit:
      raise NonFiniteError(
          f"{where}: {self.in_a_row} updates in a row skipped because the "
          f"{' and the '.join('gradient' if w == 'grad' else w for w in what)} "
          f"{'were' if len(what) > 1 else 'was'} not finite "
          f"(optim.max_nonfinite_in_a_row={self.limit}); lower optim.learning_rate or "
          "resume from an earlier checkpoint")
    return True

  def state(self) -> dict:
    return {"in_a_row": self.in_a_row, "total": self.total}

  def load(self, state: dict) -> None:
    self.in_a_row, self.total = int(state["in_a_row"]), int(state["total"])
