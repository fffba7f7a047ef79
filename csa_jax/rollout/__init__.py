"""The rollout, the first phase of an RL iteration: tasks in, trajectories and the arrays the
estimators read out.

- prompts.py: the text an agent sees at each step and how its answer is read;
- episodes.py: playing multi-turn episodes against the environment pool (`Trajectory`);
- policy.py: the policy a run builds (`build_policy`) and the jitted sampler as a host-side
  policy (`SamplerPolicy`);
- groups.py: the task group (B tasks played G times), its padded [B, G, T] arrays and rows;
- evaluation.py: held-out evaluation; metrics.py: episode metrics and the run's JSONL files;
- sft_rows.py: expert demonstrations as behaviour-cloning rows;
- setup_checks.py: the one-line refusals a run makes before it writes anything.
"""
