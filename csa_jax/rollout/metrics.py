"""Metrics (host side): what the proposal measures, and where it is written.

- success rate and episode length of a set of trajectories;
- the JSONL files a run writes (csa_jax/run/loggers.py writes them): per-episode outcomes
  (`EPISODES_FILE`), how they are replaced and read back.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any, Sequence

import numpy as np

from csa_jax.distributed import processes as dist
from csa_jax.rollout.episodes import Trajectory


def episode_metrics(trajs: Sequence[Trajectory], prefix: str) -> dict[str, float]:
  return episode_rates(episode_sums(trajs), prefix)


def episode_sums(trajs: Sequence[Trajectory]) -> dict[str, int]:
  """The integer counts the episode metrics are ratios of (summed across processes by
  csa_jax/distributed/processes.py before the ratios are taken)."""
  steps = [s for t in trajs for s in t.steps]
  return {"episodes": len(trajs), "won": sum(t.won for t in trajs),
          "length": sum(t.length for t in trajs), "steps": len(steps),
          "invalid": sum(not s.valid for s in steps),
          "errors": sum(t.error is not None for t in trajs),
          "dropped": sum(s.actions_dropped for s in steps)}


def episode_rates(sums: dict[str, int], prefix: str) -> dict[str, float]:
  n, steps = max(sums["episodes"], 1), sums["steps"]
  return {
      f"{prefix}/success": sums["won"] / n,
      f"{prefix}/episode_len": sums["length"] / n,
      f"{prefix}/episodes": float(sums["episodes"]),
      f"{prefix}/env_steps": float(steps),
      f"{prefix}/invalid_action_frac": sums["invalid"] / steps if steps else 0.0,
      f"{prefix}/errors": float(sums["errors"]),
      # Admissible actions the prompt budget left out of the list, per step (see
      # prompts.build_prompt): non-zero means the policy did not see every action.
      f"{prefix}/actions_dropped": sums["dropped"] / steps if steps else 0.0,
  }


EPISODES_FILE = os.path.join("eval", "episodes.jsonl")
EPISODE_KEYS = ("step", "policy", "split", "index", "success", "length", "return")
# Per held-out task, the probability of the oracle action at its first step
# (csa_jax/rollout/evaluation.py, OracleProbs): step, policy ("eval_oracle"), split, index, prob.
ORACLE_FILE = os.path.join("eval", "oracle_probs.jsonl")


def episode_records(trajs, step: int, policy: str) -> list[dict[str, Any]]:
  """One record per evaluated episode (`EPISODE_KEYS`), so that two policies evaluated on
  the same tasks can be compared task by task; `policy` is the evaluation's prefix
  ("eval": greedy, "eval_sampled": sampled) and `step` the RL iteration (0: SFT)."""
  return [{"step": int(step), "policy": policy, "split": tr.task[0], "index": int(tr.task[1]),
           "success": int(bool(tr.won)), "length": int(tr.length),
           "return": float(sum(st.reward for st in tr.steps))} for tr in trajs]


def gathered_episode_metrics(trajs, prefix: str) -> dict[str, float]:
  """`episode_metrics` over every process's episodes (their sums, then the rates)."""
  sums = episode_sums(trajs)
  if dist.multi():
    keys = sorted(sums)
    total = dist.reduce_sum(np.asarray([sums[k] for k in keys], np.int64))
    sums = {k: int(v) for k, v in zip(keys, total)}
  return episode_rates(sums, prefix)


def gathered_episode_records(trajs, step: int, policy: str) -> list[dict]:
  """`episode_records` of every process's episodes, in process order (each process
  plays a share of one split's tasks, so the split is the same everywhere)."""
  records = episode_records(trajs, step, policy)
  if not dist.multi():
    return records
  cols = {k: dist.gather_concat(np.asarray([r[k] for r in records], np.float64))
          for k in ("index", "success", "length", "return")}
  split = records[0]["split"] if records else ""
  splits = [s for s in dist.gather_concat(np.frombuffer(split.encode().ljust(64), np.uint8)
                                          ).reshape(-1, 64)]
  split = next((bytes(s).decode().strip() for s in splits if bytes(s).strip()), "")
  return [{"step": int(step), "policy": policy, "split": split, "index": int(i),
           "success": int(w), "length": int(n), "return": float(g)}
          for i, w, n, g in zip(cols["index"], cols["success"], cols["length"],
                                cols["return"])]


def write_episodes(path: str, records: list[dict[str, Any]]) -> None:
  """Adds one evaluation's episode records to the JSONL file at `path`, replacing any
  records of the same (step, policy): a resumed run that replays an evaluation (they are
  deterministic) writes it once, not twice."""
  keys = {(r["step"], r["policy"]) for r in records}
  old = read_jsonl(path, tolerate_partial_last=True) if os.path.exists(path) else []
  kept = [r for r in old if (r["step"], r["policy"]) not in keys]
  os.makedirs(os.path.dirname(path), exist_ok=True)
  rewrite_jsonl(path, kept + list(records))


def rewrite_jsonl(path: str, records: list[dict[str, Any]]) -> None:
  """Replaces the JSONL file at `path` by `records`, atomically: the new lines go to a
  temporary file that then takes the old one's name, so a kill mid-write leaves the old
  file whole (a resume that drops lines must not lose the ones it keeps)."""
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in records)
  os.replace(tmp, path)


def read_jsonl(path: str, tolerate_partial_last: bool = False) -> list[dict[str, Any]]:
  """The records of a JSONL file (metrics.jsonl, eval/episodes.jsonl).

  A last line without its newline (a write the process did not live to finish) is dropped
  silently with `tolerate_partial_last` (a resume expects one). Any other line that is not
  a JSON object, as such a cut line becomes once a resumed run appends the next one to it,
  is dropped with one warning for the file, as a damaged checkpoint is: the records around
  it are whole, and a resume rewrites the file without it.
  """
  with open(path) as f:
    lines = [(n, line) for n, line in enumerate(f, 1) if line.strip()]
  if tolerate_partial_last and lines and not lines[-1][1].endswith("\n"):
    lines = lines[:-1]
  records, damaged = [], []
  for n, line in lines:
    try:
      record = json.loads(line)
    except json.JSONDecodeError:
      record = None
    if isinstance(record, dict):
      records.append(record)
    else:
      damaged.append(n)
  if damaged:
    print(f"warning: {path}: dropped {len(damaged)} damaged line(s) (line "
          f"{', '.join(map(str, damaged[:3]))}{', ...' if len(damaged) > 3 else ''}): not a "
          "JSON object, as a write cut short by a crash leaves", file=sys.stderr)
  return records
