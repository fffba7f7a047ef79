"""Studies: tools that run and read many experiments (apart from the named experiments in
experiments/, which only build configs).

- `studies.sweep`: methods x seeds (x families) from shared SFT starts, resumable.
- `studies.report`: a sweep's committed run files -> summary.csv, plots, a Markdown page.
  It reads runs with `studies.runs`, computes intervals with `studies.stats` and draws
  with `studies.plots`.
- `studies.credit`: every estimator's step credit on the same rollouts, against oracle
  labels (`studies.credit_report` writes its page).
- `studies.entropy_by_position`: a run's per-action-token entropy, SFT against RL.
"""
