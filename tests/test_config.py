"""Config overrides: typed leaves, clear errors, frozen results."""

import dataclasses

import pytest

import experiments
from csa_jax.config import ConfigError, apply_overrides


@pytest.fixture
def cfg():
  return experiments.get_experiment("quickstart_coin")


def test_overrides_parse_to_declared_types(cfg):
  out = apply_overrides(cfg, ["rollout.group_size=4", "algo.lam=0.25", "algo.estimator=grpo",
                              "algo.dynamic_sampling=true", "env.kwargs.step_limit=9",
                              "env.kwargs.game=twc"])
  assert out.rollout.group_size == 4 and isinstance(out.rollout.group_size, int)
  assert out.algo.lam == 0.25 and out.algo.estimator == "grpo"
  assert out.algo.dynamic_sampling is True
  assert out.env.kwargs["step_limit"] == 9 and out.env.kwargs["game"] == "twc"
  # The original is untouched (frozen, replaced not mutated).
  assert cfg.rollout.group_size == 8 and cfg.env.kwargs["game"] == "coin"
  with pytest.raises(dataclasses.FrozenInstanceError):
    out.rollout.group_size = 3


@pytest.mark.parametrize("pair, needle", [
    ("rollout.grup_size=4", "unknown config key 'rollout.grup_size'"),
    ("nope=1", "unknown config key 'nope'"),
    ("rollout.group_size=four", "expected int"),
    ("algo.dynamic_sampling=maybe", "expected a bool"),
    ("rollout=3", "a section"),
    ("rollout.group_size", "key=value"),
    ("rollout.group_size=1", "group_size must be >= 2"),
    ("algo.loss_agg=sum", "loss_agg"),
    ("rollout.anchor=observation", "rollout.anchor must be 'state' or 'faithful'"),
])
def test_bad_overrides_say_what_is_wrong(cfg, pair, needle):
  with pytest.raises(ConfigError, match=needle.replace("(", r"\(").replace(".", r"\.")):
    apply_overrides(cfg, [pair])


def test_unknown_key_lists_valid_keys(cfg):
  with pytest.raises(ConfigError) as e:
    apply_overrides(cfg, ["algo.lamda=1"])
  assert "lam" in str(e.value) and "clip_high" in str(e.value)


def test_registry_lists_and_rejects():
  names = experiments.list_experiments()
  assert "quickstart" in names and names["quickstart"]
  with pytest.raises(KeyError, match="known: .*quickstart"):
    experiments.get_experiment("no_such_experiment")


def test_overlap_halves_the_sampler_rows_prefill_chunk_must_divide(cfg):
  """rollout.overlap samples ceil(num_envs / 2) prompts per call: a prefill chunk must
  divide that; optim.pack_rows and rollout.overlap parse as bools."""
  ok = apply_overrides(cfg, ["rollout.num_envs=8", "rollout.prefill_chunk=4",
                             "rollout.overlap=true", "optim.pack_rows=false"])
  assert ok.rollout.overlap and not ok.optim.pack_rows
  apply_overrides(cfg, ["rollout.num_envs=8", "rollout.prefill_chunk=8"])  # no overlap: fine
  with pytest.raises(ConfigError, match="must divide the sampler's rows per call \\(4"):
    apply_overrides(cfg, ["rollout.num_envs=8", "rollout.prefill_chunk=8", "rollout.overlap=true"])
  with pytest.raises(ConfigError, match="expected a bool"):
    apply_overrides(cfg, ["optim.pack_rows=sometimes"])


def test_spa_bonus_variant_changes_only_the_grounding_mode_and_keeps_family_spa_settings():
  """Catches a variant whose nested dict replaces the family's whole algo.spa (the full-size
  ALFWorld families set their own SPA learning rate and explore_k) or that differs from
  `spa` in another field."""
  import dataclasses
  from experiments import get_experiment, list_experiments
  names = [n for n in list_experiments() if n.endswith("_spa_bonus")]
  assert "alfworld_qwen7b_spa_bonus" in names and "coin_doors_spa_bonus" in names
  for name in names:
    bonus, spa = get_experiment(name), get_experiment(name[:-len("_bonus")])
    assert bonus.algo.spa.grounding_mode == "bonus" and spa.algo.spa.grounding_mode == "penalty"
    assert dataclasses.replace(bonus.algo.spa, grounding_mode="penalty") == spa.algo.spa, name
    assert dataclasses.replace(bonus, name=spa.name,
                               algo=dataclasses.replace(bonus.algo, spa=spa.algo.spa)) == spa
  full = get_experiment("alfworld_qwen7b_spa_bonus").algo.spa
  assert (full.learning_rate, full.explore_k) == (3e-6, 10)
