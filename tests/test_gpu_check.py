"""benchmarks/gpu_check.py's tiny mode, with only what the GPU image will have importable.

Every run goes through benchmarks/gpu_image.py's blocker (a sitecustomize.py on
PYTHONPATH, so the environment pool's worker processes are blocked too): the image's
packages (benchmarks/gpu_image_packages.txt) and the wheels the check carries
(benchmarks/gpu_wheels.txt) import, nothing else installed here does.
"""

import importlib.metadata
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import gpu_image  # noqa: E402  pylint: disable=wrong-import-position


def _run(tmp_path, args, with_wheels=True, timeout=900):
  block = tmp_path / ("block_wheels" if with_wheels else "block_bare")
  gpu_image.write_sitecustomize(str(block), with_wheels=with_wheels)
  log = tmp_path / "blocked.log"
  env = dict(os.environ, PYTHONPATH=str(block), GPU_IMAGE_BLOCKED_LOG=str(log))
  proc = subprocess.run([sys.executable] + args, cwd=ROOT, capture_output=True, text=True,
                        env=env, timeout=timeout)
  blocked = log.read_text().split() if log.exists() else []
  return proc, set(blocked[1::2])


def test_carried_wheels_are_the_versions_tested_here_and_not_on_the_image():
  image = gpu_image.image_packages()
  for line in open(gpu_image.WHEEL_LIST, encoding="utf-8"):
    line = line.split("#", 1)[0].strip()
    if not line:
      continue
    name, version = line.split()[-1].split("==")
    assert importlib.metadata.version(name) == version, name
    if not line.startswith("replace "):
      assert gpu_image.normalize(name) not in image, f"{name} is on the image already"


def test_the_blocker_hides_what_the_image_lacks_and_the_wheels_bring_it(tmp_path):
  probe = ("import importlib.util as u\n"
           "print('absent', [m for m in ('grain', 'tensorflow_datasets', 'array_record', "
           "'alfworld', 'textworld', 'tensorboardX', 'scienceworld', 'textworld_express') "
           "if u.find_spec(m) is None])\n"
           "try:\n  import grain\n  print('grain imported')\n"
           "except ModuleNotFoundError:\n  print('grain refused')\n"
           "import jax, flax, optax, orbax.checkpoint, tokenizers, safetensors\n")
  bare, _ = _run(tmp_path, ["-c", probe], with_wheels=False)
  assert bare.returncode == 0, bare.stderr[-2000:]
  assert ("absent ['grain', 'tensorflow_datasets', 'array_record', 'alfworld', 'textworld', "
          "'tensorboardX', 'scienceworld', 'textworld_express']") in bare.stdout
  assert "grain refused" in bare.stdout

  # With the wheels: what the iterations part imports, and the alfworld environment
  # registered (environments/__init__.py registers only engines it finds).
  probe = ("import launch, csa_jax.run.trainer, environments.demos, tensorboardX, environments\n"
           "import importlib.util as u\n"
           "print('envs', environments.list_envs(), 'scienceworld', "
           "u.find_spec('scienceworld'))\n")
  full, blocked = _run(tmp_path, ["-c", probe])
  assert full.returncode == 0, full.stderr[-2000:]
  assert "'alfworld'" in full.stdout and "scienceworld None" in full.stdout
  assert "scienceworld" in blocked  # the blocker was asked, and refused


# Slow (about a minute): the blocker test above keeps the script's imports in the default
# suite; `make test-slow` runs the script's parts.
@pytest.mark.slow
def test_gpu_check_tiny_parity_sampler_and_mfu_on_the_image_packages(tmp_path):
  """parity at the tiny size, the sampler against transformers, the update's MFU (~30 s)."""
  proc, _ = _run(tmp_path, ["benchmarks/gpu_check.py", "--tiny",
                            "--parts", "parity,sampler,mfu"])
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  out = proc.stdout
  assert "parity qwen2 OK, llama OK" in out
  assert "ratio ours / best transformers" in out and "greedy tokens equal: 100.0%" in out
  assert "update tiny float32 B=2 L=64:" in out and "of matmul peak" in out


@pytest.mark.slow
def test_gpu_check_tiny_iterations_on_the_image_packages(tmp_path):
  """launch.py --exp alfworld_csa on a random 2-layer HF checkpoint: game generation,
  expert demonstrations (TFDS + grain), SFT, one RL iteration, two evaluations (about
  1 minute alone, 3-4 on a loaded 2-core machine, mostly compiling)."""
  proc, blocked = _run(tmp_path, ["benchmarks/gpu_check.py", "--tiny", "--parts",
                                  "iterations"])
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  lines = [l for l in proc.stdout.splitlines() if "] iteration 1: " in l]
  assert len(lines) == 1, proc.stdout[-3000:]
  perf = dict(kv.rsplit(" ", 1) for kv in lines[0].split("] iteration 1: ")[1].split(", "))
  assert {"rollout_s", "adv_s", "update_s", "env_steps_total"} <= set(perf)
  # 2 tasks x 2 rollouts of at most 2 turns; a random policy does not win in fewer.
  assert float(perf["env_steps_total"]) == 8 and float(perf["update_s"]) > 0
  assert "alfworld_csa iterations: 1," in proc.stdout
  assert "scienceworld" in blocked
