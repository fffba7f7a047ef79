"""The update, the last phase of an RL iteration: training rows in, new parameters out.

- data.py: grain pipelines from steps to fixed-shape token batches;
- train_step.py: the jitted policy-gradient and SFT steps (losses in csa_jax/losses.py);
- oracle_rows.py: rows split by their oracle step label (decisive, routine);
- guard.py: the host's guard against a diverging run.
"""
