"""Preemption: SIGTERM / SIGINT become a request to stop at the next safe point.

Cloud TPU and SLURM preempt with SIGTERM and a grace period; a user stops with Ctrl-C.
Inside `StopOnSignal`, the first such signal only sets `requested` (the host loop checks
it after each iteration, saves a checkpoint and raises `Interrupted`); a second one
exits at once, without saving, for a run that must die now.
"""

from __future__ import annotations

import os
import signal
import sys
import threading

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Interrupted(Exception):
  """The run stopped on a signal; `saved` says where it can be resumed from (or None).
  `during`: where in SFT it stopped (then `saved` holds SFT's progress, not an RL
  checkpoint)."""

  def __init__(self, signum: int, saved: str | None, iteration: int | None,
               during: str | None = None):
    self.signum, self.saved, self.iteration = signum, saved, iteration
    name = signal.Signals(signum).name
    if during:
      where = (f"during SFT, {during}; its progress is saved in {saved}" if saved
               else f"during SFT, {during}; nothing saved, SFT restarts from the beginning")
    else:
      where = (f"after RL iteration {iteration}; checkpoint saved in {saved}" if saved
               else "before the first checkpoint; nothing to resume")
    super().__init__(f"stopped by {name} {where}")

  @property
  def exit_code(self) -> int:
    return 128 + self.signum


class StopOnSignal:
  """Context manager; `requested` is the first signal's number, or None."""

  def __init__(self):
    self.requested: int | None = None
    self._previous: dict[int, object] = {}

  def _handle(self, signum, frame):
    del frame
    if self.requested is not None:
      print(f"\n{signal.Signals(signum).name} again: exiting now without saving",
            file=sys.stderr, flush=True)
      os._exit(128 + signum)  # no unwinding: env threads or a save may hang otherwise
    self.requested = signum
    print(f"\n{signal.Signals(signum).name}: stopping after this SFT batch or RL iteration "
          "and saving a checkpoint (send it again to exit at once)", file=sys.stderr,
          flush=True)

  def __enter__(self) -> StopOnSignal:
    # Handlers can only be installed from the main thread (a run driven from a worker
    # thread, as some tests do, simply keeps the default behaviour).
    if threading.current_thread() is threading.main_thread():
      for s in SIGNALS:
        self._previous[s] = signal.signal(s, self._handle)
    return self

  def __exit__(self, *exc) -> None:
    for s, h in self._previous.items():
      signal.signal(s, h)
    self._previous.clear()
