"""The study's gate between its SFT starts and its first RL run: every seed's SFT start at
every horizon must lie in the band the notes fix (sampled held-out success, 400 episodes).
Prints each start and exits 1 if one is missing or outside the band.

    python reports/horizon_matched/sft_band.py [--low 0.30] [--high 0.55] [--seeds 8]
        [--horizons 4,16,48]
"""

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
HORIZONS = (4, 16, 48)


def start(family: str, seed: int) -> dict | None:
  """The SFT start's evaluation line (step 0), or None if the run has not finished."""
  run = os.path.join(HERE, "runs", family, f"sft_seed{seed}")
  if not os.path.exists(os.path.join(run, "DONE")):
    return None
  with open(os.path.join(run, "metrics.jsonl")) as f:
    return next(r for r in map(json.loads, f) if "eval_sampled/success" in r)


def main() -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--low", type=float, default=0.30)
  p.add_argument("--high", type=float, default=0.55)
  p.add_argument("--seeds", type=int, default=8)
  p.add_argument("--horizons", default=",".join(map(str, HORIZONS)),
                 help="comma-separated horizons to check (default all three)")
  a = p.parse_args()
  horizons = [int(h) for h in a.horizons.split(",")]
  bad = []
  print("| horizon | seed | sampled | greedy | right-key probability | in band |")
  print("|---|---|---|---|---|---|")
  for h in horizons:
    for s in range(a.seeds):
      r = start(f"keydoor_matched_h{h}", s)
      if r is None:
        bad.append(f"H = {h} seed {s}: not finished")
        print(f"| {h} | {s} | | | | missing |")
        continue
      x = r["eval_sampled/success"]
      ok = a.low <= x <= a.high
      bad += [] if ok else [f"H = {h} seed {s}: {x:.3f}"]
      print(f"| {h} | {s} | {x:.3f} | {r.get('eval/success', float('nan')):.3f} | "
            f"{r.get('eval_oracle/prob', float('nan')):.3f} | {'yes' if ok else 'NO'} |")
  if bad:
    print(f"outside [{a.low}, {a.high}] or missing: " + "; ".join(bad), file=sys.stderr)
    return 1
  print(f"all {len(horizons) * a.seeds} starts in [{a.low}, {a.high}]")
  return 0


if __name__ == "__main__":
  sys.exit(main())
