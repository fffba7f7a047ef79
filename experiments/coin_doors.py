"""The CPU testbed for comparing credit assignment: TextWorldExpress "coin" in a 6-room
house with closed doors, a tiny policy from scratch, G = 8, about 8,000 environment
interactions of RL per run.

    python launch.py --exp coin_doors_grpo          # and _csa, _dapo, _gigpo, _rloo, ...
    python -m studies.sweep --family coin_doors --seeds 5 --commit

Why this task: the quickstart's 4-room open house has too little headroom (SFT
already wins 85-95% of sampled episodes, so most groups of 8 are uniform and carry no
signal). With 6 rooms and doors the agent must open doors before it can move, and the
coin is further away: expert walks of 2-31 steps (mean 11.8 over 30 train tasks), so a
won episode needs about 8-15 actions, a mix of routine ones ("look around", moving along
an explored corridor) and decisive ones (which door to open, which room to enter,
"take coin" once it is seen). Moves through a closed door and other actions outside the
admissible list are invalid (they waste a step), so the invalid-action rate is a direct
read of policy drift. Behaviour cloning on the proposal's 100 demonstrations gives a
sampled held-out success of about 0.67 (seed 0, 100 test episodes): room to improve, and
groups of 8 are mixed often enough for every estimator to get signal.
"""

import dataclasses

from csa_jax.config import AlgoConfig, EvalConfig, OptimConfig, RolloutConfig, SFTConfig
from experiments import quickstart
from experiments.variants import register_family

COIN_DOORS = "numLocations=6,numDistractorItems=0,includeDoors=1,limitInventorySize=0"


def base():
  q = quickstart.coin_base()
  return dataclasses.replace(
      q, name="coin_doors",
      env=dataclasses.replace(q.env, kwargs={"game": "coin", "game_params": COIN_DOORS,
                                             "step_limit": 25}),
      model=dataclasses.replace(q.model, max_seq_len=208),
      rollout=RolloutConfig(tasks_per_iter=4, group_size=8, max_turns=25, history_turns=3,
                            max_prompt_tokens=192, max_action_tokens=8, num_envs=32),
      algo=AlgoConfig(epochs=1, minibatch_size=64),
      optim=OptimConfig(learning_rate=1e-4, grad_clip=1.0),
      sft=SFTConfig(num_demos=100, epochs=12, batch_size=64, learning_rate=2e-3),
      eval=EvalConfig(num_episodes=100, greedy=True, sampled=True, every=0),
      rl_iterations=20,
      checkpoint_every=5,
  )


register_family("coin_doors", base, "TWX coin, 6 rooms with doors (the CPU testbed)")
