"""The orbax checkpointer: what it restores equals what it saved, max_to_keep holds, and a
checkpoint that does not fit the model fails with one line."""

import os

import jax
import numpy as np
import optax
import pytest
from flax import nnx

from csa_jax import train_step as ts
from csa_jax.checkpoint import Checkpointer, CheckpointError
from csa_jax.model import Decoder, ModelConfig


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
  assert msg.startswith(f"checkpoint 5 in {saved.directory} does not match the model: ")


def test_no_checkpoint_raises(tmp_path):
  ck = Checkpointer(str(tmp_path / "empty"))
  try:
    with pytest.raises(CheckpointError, match="no checkpoint in"):
      ck.restore(_state())
  finally:
    ck.close()
