"""The names of the RL methods (`algo.method`): the one list of them.

A leaf module (it imports nothing), so that config validation (csa_jax/config_fields.py)
can read the names without importing the methods' code, which itself imports the config.
csa_jax/algorithms/__init__.py maps each name to its implementation and refuses, when it
is imported, a method class whose `name` is not listed here or a name with no class.
"""

METHODS = ("estimator", "istar", "spa", "mtdpo")
