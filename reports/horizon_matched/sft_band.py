"""The study's gate between its SFT starts and its first RL run: the seeds' SFT starts must
lie in the band the notes fix (sampled held-out success, 400 episodes).

    python reports/horizon_matched/sft_band.py [--low 0.30] [--high 0.55] [--seeds 8]
        [--horizons 4,16,48]
        prints each start of seeds 0..7; exits 1 if one is missing or outside the band

    python reports/horizon_matched/sft_band.py --select 8 [--horizons 48] [--max-seed 15]
        the inclusion rule (notes, Deviations): seeds are taken in order; a seed with a
        finished start outside the band at any of the horizons is excluded, and all its
        starts move to sft_excluded/FAMILY/; prints the first 8 seeds not excluded,
        comma-separated, on stdout, and exits 0 when all their starts at the horizons are
        finished and inside the band, 3 when some are still to run (the list says which
        seeds the sweep runs next), 1 when the rule would need a seed above --max-seed
"""

import argparse
import json
import os
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
HORIZONS = (4, 16, 48)
RUNS = os.path.join(HERE, "runs")
EXCLUDED = os.path.join(HERE, "sft_excluded")
STARTS = os.path.join(HERE, "starts")
MORE_TO_RUN = 3


def family(horizon: int) -> str:
  return f"keydoor_matched_h{horizon}"


def start(horizon: int, seed: int, root: str = RUNS) -> dict | None:
  """The SFT start's evaluation line (step 0), or None if the run has not finished."""
  run = os.path.join(root, family(horizon), f"sft_seed{seed}")
  if not os.path.exists(os.path.join(run, "DONE")):
    return None
  with open(os.path.join(run, "metrics.jsonl")) as f:
    return next(r for r in map(json.loads, f) if "eval_sampled/success" in r)


def row(horizon: int, seed: int, r: dict | None, ok: bool | None) -> str:
  if r is None:
    return f"| {horizon} | {seed} | | | | missing |"
  return (f"| {horizon} | {seed} | {r['eval_sampled/success']:.3f} | "
          f"{r.get('eval/success', float('nan')):.3f} | "
          f"{r.get('eval_oracle/prob', float('nan')):.3f} | {'yes' if ok else 'NO'} |")


HEADER = ["| horizon | seed | sampled | greedy | right-key probability | in band |",
          "|---|---|---|---|---|---|"]


def check(a) -> int:
  """Seeds 0..seeds-1 at every horizon, as registered first."""
  bad = []
  print("\n".join(HEADER))
  for h in a.horizons:
    for s in range(a.seeds):
      r = start(h, s)
      ok = r is not None and a.low <= r["eval_sampled/success"] <= a.high
      print(row(h, s, r, ok))
      if r is None:
        bad.append(f"H = {h} seed {s}: not finished")
      elif not ok:
        bad.append(f"H = {h} seed {s}: {r['eval_sampled/success']:.3f}")
  if bad:
    print(f"outside [{a.low}, {a.high}] or missing: " + "; ".join(bad), file=sys.stderr)
    return 1
  print(f"all {len(a.horizons) * a.seeds} starts in [{a.low}, {a.high}]")
  return 0


def exclude(seed: int) -> None:
  """Moves every start of an excluded seed out of the study's runs (all horizons), and
  drops its kept weights (the sweep's starts/): no run starts from them."""
  for h in HORIZONS:
    shutil.rmtree(os.path.join(STARTS, family(h), f"sft_seed{seed}"), ignore_errors=True)
    src = os.path.join(RUNS, family(h), f"sft_seed{seed}")
    if os.path.isdir(src):
      dst = os.path.join(EXCLUDED, family(h), f"sft_seed{seed}")
      os.makedirs(os.path.dirname(dst), exist_ok=True)
      shutil.rmtree(dst, ignore_errors=True)
      shutil.move(src, dst)


def excluded(seed: int) -> bool:
  return any(start(h, seed, EXCLUDED) is not None for h in HORIZONS)


def select(a) -> int:
  """The inclusion rule: the first `select` seeds with no start outside the band."""
  chosen, pending = [], False
  print("\n".join(HEADER), file=sys.stderr)
  seed = 0
  while len(chosen) < a.select:
    if seed > a.max_seed:
      print(f"the inclusion rule needs a seed above {a.max_seed}: {len(chosen)} of "
            f"{a.select} seeds in the band ({chosen})", file=sys.stderr)
      return 1
    if excluded(seed):
      print(f"| | {seed} | | | | excluded before |", file=sys.stderr)
      seed += 1
      continue
    starts = {h: start(h, seed) for h in a.horizons}
    out = [h for h, r in starts.items()
           if r is not None and not a.low <= r["eval_sampled/success"] <= a.high]
    for h, r in starts.items():
      print(row(h, seed, r, h not in out), file=sys.stderr)
    if out:
      exclude(seed)
      print(f"seed {seed} excluded (H = {', '.join(map(str, out))} outside "
            f"[{a.low}, {a.high}]): its starts moved to sft_excluded/", file=sys.stderr)
    else:
      chosen.append(seed)
      pending |= any(r is None for r in starts.values())
    seed += 1
  print(",".join(map(str, chosen)))
  return MORE_TO_RUN if pending else 0


def main() -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--low", type=float, default=0.30)
  p.add_argument("--high", type=float, default=0.55)
  p.add_argument("--seeds", type=int, default=8)
  p.add_argument("--horizons", default=",".join(map(str, HORIZONS)),
                 help="comma-separated horizons to check (default all three)")
  p.add_argument("--select", type=int, default=0, metavar="N",
                 help="apply the inclusion rule and print the first N seeds it keeps")
  p.add_argument("--max-seed", type=int, default=15,
                 help="the last seed the inclusion rule may try (default 15: 16 seeds)")
  a = p.parse_args()
  a.horizons = [int(h) for h in a.horizons.split(",")]
  return select(a) if a.select else check(a)


if __name__ == "__main__":
  sys.exit(main())
