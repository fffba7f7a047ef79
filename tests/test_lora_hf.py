"""LoRA adapters against Hugging Face peft + transformers (PyTorch, CPU): adapters trained
here on a tiny HF-format checkpoint, exported in the PEFT format
(csa_jax/model/hf.py, `save_peft`) and loaded with `peft.PeftModel.from_pretrained` onto
the same base in transformers, give this project's logits within the HF-parity
tolerance; the merged export loads into plain transformers with the same logits."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from csa_jax.model import LoRAConfig, hf
from tests.test_hf_parity import LLAMA_KW, QWEN_KW, REL_TOL, V, _hf_model, _rel_err


@pytest.fixture(scope="module")
def torch_hf():
  import torch  # pylint: disable=import-outside-toplevel
  import transformers  # pylint: disable=import-outside-toplevel
  torch.set_num_threads(1)
  return torch, transformers


def _trained_adapters(model, seed=0):
  """The adapters as training leaves them: A and B both non-zero."""
  key = jax.random.key(seed)
  for i, (path, var) in enumerate(nnx.to_flat_state(nnx.state(model, nnx.LoRAParam))):
    scale = 0.2 if path[-1] == "lora_b" else 0.3
    var.set_value(scale * jax.random.normal(jax.random.fold_in(key, i),
                                            var.get_value().shape))
  return model


@pytest.mark.parametrize("arch,kw,scan", [("llama", LLAMA_KW, False), ("qwen2", QWEN_KW, True)])
def test_peft_loads_our_adapters_onto_the_same_base(torch_hf, tmp_path, arch, kw, scan):
  import peft  # pylint: disable=import-outside-toplevel
  torch, transformers = torch_hf
  base_dir, adapter_dir = str(tmp_path / "base"), str(tmp_path / "adapter")
  _hf_model(torch_hf, arch, seed=3, **kw).save_pretrained(base_dir)
  cfg = LoRAConfig(rank=4, alpha=8.0, targets=("q_proj", "k_proj", "v_proj", "o_proj",
                                               "gate_proj", "up_proj", "down_proj"))
  ours = _trained_adapters(hf.load_model(base_dir, lora=cfg, scan_layers=scan))
  hf.save_peft(ours, adapter_dir, base_model_name_or_path=base_dir)
  with open(os.path.join(adapter_dir, hf.ADAPTER_CONFIG)) as f:
    assert json.load(f)["r"] == 4

  ids = np.random.default_rng(0).integers(0, V, (3, 40))
  want = np.asarray(ours(jnp.asarray(ids)))
  base_hf = transformers.AutoModelForCausalLM.from_pretrained(base_dir).eval()
  with torch.no_grad():
    plain = base_hf(torch.tensor(ids)).logits.numpy()
  assert _rel_err(want, plain) > 10 * REL_TOL  # the adapters change the model
  adapted_hf = peft.PeftModel.from_pretrained(base_hf, adapter_dir).eval()
  with torch.no_grad():
    got = adapted_hf(torch.tensor(ids)).logits.numpy()
  assert _rel_err(want, got) < REL_TOL

  merged_dir = str(tmp_path / "merged")
  hf.save_pretrained(ours, merged_dir)  # an adapted model is written merged
  merged_hf = transformers.AutoModelForCausalLM.from_pretrained(merged_dir).eval()
  with torch.no_grad():
    got = merged_hf(torch.tensor(ids)).logits.numpy()
  assert _rel_err(want, got) < REL_TOL
