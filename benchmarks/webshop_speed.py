"""Steps/s of the WebShop re-creation: expert and random episodes, half each, on the default
generated catalogue (3,000 products); also the one-off catalogue build and reset times.

    PYTHONPATH=. python -m benchmarks.webshop_speed [--episodes 200] [--source real --data_dir DIR]

Random episodes pick uniformly among the admissible actions, except that on the search page
they search for 2-6 random words of the instruction (the admissible list there is only the
template "search[<your query>]"), so they visit results and item pages and often buy;
expert episodes search, page, open, choose options and buy (5-10 steps).
"""

import argparse
import random
import time

from environments import make_env


def main(argv=None):
  ap = argparse.ArgumentParser()
  ap.add_argument("--episodes", type=int, default=200)
  ap.add_argument("--source", default="generated")
  ap.add_argument("--data_dir", default=None)
  args = ap.parse_args(argv)
  t0 = time.perf_counter()
  kwargs = {"source": args.source} | ({"data_dir": args.data_dir} if args.data_dir else {})
  env = make_env("webshop", **kwargs)
  build = time.perf_counter() - t0
  rng = random.Random(0)
  n_train = env.num_tasks("train")
  steps = {"expert": 0, "random": 0}
  secs = {"expert": 0.0, "random": 0.0}
  resets, wins, bought = 0.0, 0, 0
  for k in range(args.episodes):
    policy = "expert" if k % 2 == 0 else "random"
    t = time.perf_counter()
    r = env.reset("train", (k * 7919) % n_train)
    resets += time.perf_counter() - t
    t = time.perf_counter()
    while not r.done:
      if policy == "expert":
        a = env.expert_action()
      elif r.info.extra["page"] == "search":
        words = r.info.task.split()
        a = f"search[{' '.join(rng.sample(words, min(len(words), rng.randint(2, 6))))}]"
      else:
        a = rng.choice(r.info.admissible_actions)
      r = env.step(a)
      steps[policy] += 1
    secs[policy] += time.perf_counter() - t
    wins += policy == "expert" and r.info.won
    bought += policy == "random" and r.info.extra["page"] == "done"
  total = sum(steps.values()) / (sum(secs.values()) + resets)
  print(f"catalogue build + index: {build:.2f} s ({len(env.world.products)} products, "
        f"{sum(len(g) for g in env.world.goals.values())} goals)")
  print(f"reset: {1e3 * resets / args.episodes:.2f} ms (includes the expert's query on first use)")
  for p in steps:
    print(f"{p}: {steps[p]} steps, {steps[p] / secs[p]:.0f} steps/s")
  print(f"mix (resets included): {total:.0f} steps/s; "
        f"expert won {wins}/{(args.episodes + 1) // 2}, "
        f"random bought in {bought}/{args.episodes // 2}")


if __name__ == "__main__":
  main()
