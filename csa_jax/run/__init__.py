"""Run control, the top layer: what drives the other packages and what a run leaves behind.

- trainer.py: SFT, the RL loop and the evaluations of one run;
- posttrain.py: after training (evaluate, export, play a saved policy);
- checkpoint.py, sft_progress.py: resuming after a stop or a crash;
- loggers.py: where metrics go; signals.py: stopping at a safe point;
- dry_run.py: the memory plan of a run, compiled ahead of time.
"""
