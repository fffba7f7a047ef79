"""The delayed-credit testbed: KeyDoor (environments/keydoor.py) at horizons 4, 16 and 48.

    python launch.py --exp keydoor_h16_csa_state     # and _grpo, _csa, _gigpo, _dapo, ...
    python -m studies.sweep --family keydoor_h4,keydoor_h16,keydoor_h48 --name horizon

A decisive choice at the first step (which key to take; the task line names it), then H
routine steps whose actions do not change the outcome, the reward only at the end; oracle
labels are exact (+1 / -1 on the decisive step, 0 on routine ones). The expert takes the
right key's partner colour with probability 0.55 (right with probability 0.45), and SFT
clones all of its 100 episodes, lost ones too (`sft.demo_filter=all`), so the SFT start is
about as noisy at the decisive step at every horizon: what RL must learn is the same one
choice, behind 4, 16 or 48 steps of routine noise. `keydoor2_h16` has a second decisive
step (a fork) midway.

Budget: the proposal's 10,000 environment interactions of RL per run (`rl_env_steps`),
whatever the horizon (at H = 4 that is about 62 iterations of 4 tasks x G = 8, at H = 48
about 7); evaluation on 400 held-out test tasks, greedy and sampled at T = 1.
"""

import dataclasses

from csa_jax.config import (AlgoConfig, EnvConfig, EvalConfig, ExperimentConfig,
                            OptimConfig, RolloutConfig, SFTConfig, TokenizerConfig)
from csa_jax.model import ModelConfig
from experiments.variants import register_family

HORIZONS = (4, 16, 48)
EXPERT_NOISE = 0.55
MAX_PROMPT_TOKENS = 64
MAX_ACTION_TOKENS = 6


def base(horizon: int = 16, decisions: int = 1) -> ExperimentConfig:
  length = horizon + decisions
  return ExperimentConfig(
      name=f"keydoor_h{horizon}",
      seed=0,
      env=EnvConfig(name="keydoor",
                    kwargs={"horizon": horizon, "decisions": decisions, "num_keys": 4,
                            "expert_noise": EXPERT_NOISE, "routine_noise": 0.5},
                    train_split="train", eval_split="test", num_train_tasks=5000),
      tokenizer=TokenizerConfig(vocab_size=512),
      model=ModelConfig.tiny(vocab_size=512, hidden_size=96, intermediate_size=256,
                             num_layers=2, num_heads=2, num_kv_heads=1, head_dim=48,
                             max_seq_len=MAX_PROMPT_TOKENS + MAX_ACTION_TOKENS),
      rollout=RolloutConfig(tasks_per_iter=4, group_size=8, max_turns=length,
                            history_turns=1, max_prompt_tokens=MAX_PROMPT_TOKENS,
                            max_action_tokens=MAX_ACTION_TOKENS, num_envs=64),
      algo=AlgoConfig(epochs=1, minibatch_size=64),
      optim=OptimConfig(learning_rate=1e-4, grad_clip=1.0),
      sft=SFTConfig(num_demos=100, epochs=12, batch_size=64, learning_rate=2e-3,
                    demo_filter="all"),
      eval=EvalConfig(num_episodes=400, greedy=True, sampled=True, every=0),
      rl_iterations=1000,
      rl_env_steps=10_000,
      checkpoint_every=5,
  )


# The matched-updates study (reports/horizon_matched): the same number of RL iterations at
# every horizon (the 63 that 10,000 steps buy at H = 4; no step budget), held-out
# evaluations every 8 iterations (200 tasks, sampled: the learning curve) beside the
# 400-task ones before and after RL, the oracle key's exact probability at every
# evaluation, and, at H = 4 (the mechanism arms), the decisive and routine rows' gradient
# norms and entropies. SFT clones 800 demonstrations for 12 epochs (the horizon study's
# 100 for 12 left 3 of 8 H = 48 starts near 0.16; 400 for 3 left one at 0.22, 400 for 12
# one of six at 0.165), chosen on SFT starts alone (the study's notes).
MATCHED_ITERATIONS = 63


def matched(horizon: int) -> ExperimentConfig:
  cfg = base(horizon)
  return dataclasses.replace(
      cfg, name=f"keydoor_matched_h{horizon}", rl_iterations=MATCHED_ITERATIONS,
      rl_env_steps=0,
      sft=dataclasses.replace(cfg.sft, num_demos=800, epochs=12),
      eval=dataclasses.replace(cfg.eval, every=8, every_episodes=200, every_greedy=False,
                               oracle_prob=True),
      algo=dataclasses.replace(cfg.algo, log_row_classes=horizon == 4))


for _h in HORIZONS:
  register_family(f"keydoor_h{_h}", lambda h=_h: base(h),
                  f"KeyDoor, decisive key then {_h} routine steps (delayed credit)")
  register_family(f"keydoor_matched_h{_h}", lambda h=_h: matched(h),
                  f"KeyDoor H = {_h}, {MATCHED_ITERATIONS} RL iterations at every horizon")
register_family("keydoor2_h16", lambda: dataclasses.replace(base(16, 2), name="keydoor2_h16"),
                "KeyDoor with a second decisive step (a fork) in 16 routine steps")
