"""Software-engineering tasks: the `swe` environment, SWE-bench-format grading, a sandbox,
and the offline `source=synth` task set (see env.py, grading.py, sandbox.py, synth.py)."""
