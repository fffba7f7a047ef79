"""The orbax checkpointer: what it restores equals what it saved, max_to_keep holds, a
checkpoint that does not fit the model fails with one line (and nothing is moved), a
damaged latest step falls back to the previous one, and a step saved twice is replaced."""

import os

import jax
import numpy as np
import optax
import pytest
from flax import nnx

from csa_jax.model import Decoder, ModelConfig
from csa_jax.run.checkpoint import Checkpointer, CheckpointError
from csa_jax.update import train_step as ts


def _state(vocab_size=32, num_layers=2, tx=None, seed=0):
  cfg = ModelConfig.tiny(vocab_size, max_seq_len=16, hidden_size=16, intermediate_size=32,
                         head_dim=4, num_layers=num_layers)
  _, params = nnx.split(Decoder(cfg, rngs=nnx.Rngs(seed)), nnx.Param)
  return ts.init_state(params, tx or optax.adam(1e-3))


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
  """Steps 1..5 saved with max_to_keep=2; step k holds the params of seed k."""
  directory = str(tmp_path_factory.mktemp("ckpt"))
  ck = Checkpointer(directory, max_to_keep=2)
  for k in range(1, 6):
    ck.save(k, _state(seed=k), {"phase": "rl", "iteration": k})
  ck.wait()
  yield ck
  ck.close()


def test_max_to_keep_holds_and_restore_equals_save(saved):
  assert saved.latest_step() == 5
  assert sorted(os.listdir(saved.directory)) == ["4", "5"]
  for k in (4, 5):
    state, meta = saved.restore(_state(), step=k)
    assert meta == {"phase": "rl", "iteration": k}
    want = _state(seed=k)
    for got, ref in zip(jax.tree.leaves(state), jax.tree.leaves(want), strict=True):
      np.testing.assert_array_equal(np.asarray(got), np.asarray(ref))


@pytest.mark.parametrize("template", [
    lambda: _state(vocab_size=40),  # a tensor of another shape
    lambda: _state(num_layers=3),  # another tree structure
    lambda: _state(tx=optax.sgd(1e-3)),  # another optimizer state
], ids=["shape", "layers", "optimizer"])
def test_a_mismatched_model_raises_one_line(saved, template):
  with pytest.raises(CheckpointError) as e:
    saved.restore(template())
  msg = str(e.value)
  assert "\n" not in msg
  assert msg.startswith(f"checkpoint 5 in {saved.directory} does not match the model")
  # Every step failed alike: a different model, not damage; nothing was moved aside.
  assert sorted(os.listdir(saved.directory)) == ["4", "5"]
  assert not os.path.exists(saved.directory + ".corrupt")


def _saved_pair(directory):
  ck = Checkpointer(directory, max_to_keep=3)
  for k in (1, 2):
    ck.save(k, _state(seed=k), {"iteration": k})
  ck.close()


def _files(root, part):
  return [os.path.join(r, f) for r, _, fs in os.walk(root) for f in fs
          if part in os.path.join(r, f)]


@pytest.mark.parametrize("damage", ["truncated array", "missing manifest", "bad meta"])
def test_a_damaged_latest_step_falls_back_to_the_previous(tmp_path, capsys, damage):
  directory = str(tmp_path / "checkpoints")
  _saved_pair(directory)
  step2 = os.path.join(directory, "2")
  if damage == "truncated array":  # a disk that filled up, a copy cut short
    for f in _files(os.path.join(step2, "state"), "/d/"):
      with open(f, "r+b") as fh:
        fh.truncate(8)
  elif damage == "missing manifest":
    for f in _files(os.path.join(step2, "state"), "manifest.ocdbt"):
      os.remove(f)
  else:
    (meta,) = [f for f in _files(os.path.join(step2, "meta"), "metadata")]
    with open(meta, "w") as fh:
      fh.write('{"iteration": ')
  ck = Checkpointer(directory, max_to_keep=3)
  state, meta = ck.restore(_state())
  assert meta == {"iteration": 1}
  for got, ref in zip(jax.tree.leaves(state), jax.tree.leaves(_state(seed=1)), strict=True):
    np.testing.assert_array_equal(np.asarray(got), np.asarray(ref))
  err = capsys.readouterr().err
  assert "checkpoint 2" in err and "damaged" in err and "resuming from step 1" in err
  # The damaged step is kept aside, and the resumed run can save step 2 again.
  assert ck.all_steps() == [1]
  assert os.listdir(directory + ".corrupt") == ["2"]
  ck.save(2, _state(seed=7), {"iteration": 2})
  ck.wait()
  assert ck.restore(_state())[1] == {"iteration": 2}
  ck.close()


def test_saving_a_step_again_replaces_it(tmp_path):
  """Orbax alone keeps the first save of a step; the run's final record depends on this."""
  ck = Checkpointer(str(tmp_path / "c"))
  ck.save(3, _state(seed=1), {"phase": "rl"})
  ck.save(3, _state(seed=2), {"phase": "done"})
  ck.wait()
  state, meta = ck.restore(_state())
  assert meta == {"phase": "done"}
  for got, ref in zip(jax.tree.leaves(state), jax.tree.leaves(_state(seed=2)), strict=True):
    np.testing.assert_array_equal(np.asarray(got), np.asarray(ref))
  ck.close()


def test_no_checkpoint_raises(tmp_path):
  ck = Checkpointer(str(tmp_path / "empty"))
  try:
    with pytest.raises(CheckpointError, match="no checkpoint in"):
      ck.restore(_state())
  finally:
    ck.close()
