"""Tests for the expert-demonstration tfds builder (array_record, read back through grain)."""

import os
import subprocess
import sys

import grain
import pytest

import environments.faulty  # noqa: F401  (registers "faulty")
from environments import make_env
from environments.demos import collect_demos, decode_record, demo_data_source

KWARGS = {"game": "mapreader", "step_limit": 40}
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _replay(record):
  """Independent check: replaying the stored actions reproduces the stored episode."""
  env = make_env("twx", **KWARGS)
  try:
    r = env.reset(record["split"], record["index"])
    assert r.info.task == record["task"]
    for obs, adm, action, reward in zip(record["observations"], record["admissible"],
                                        record["actions"], record["rewards"]):
      assert r.observation == obs
      assert "\n".join(r.info.admissible_actions) == adm
      r = env.step(action)
      assert r.reward == pytest.approx(reward, abs=1e-6)
    assert r.done and r.info.won == record["won"]
  finally:
    env.close()


def test_collect_demos_records_expert_episodes():
  records = collect_demos("twx", KWARGS, "train", [0, 5])
  assert [r["index"] for r in records] == [0, 5]
  for record in records:
    assert record["won"] and len(record["actions"]) == len(record["observations"]) > 0
    _replay(record)


def test_tfds_array_record_roundtrip_into_grain(tmp_path):
  source = demo_data_source(str(tmp_path), "twx", KWARGS, num_tasks={"train": 4, "dev": 2})
  assert len(source) == 4
  ds = grain.MapDataset.source(source).map(decode_record)
  got = sorted((ds[i] for i in range(len(ds))), key=lambda r: r["index"])
  assert got == collect_demos("twx", KWARGS, "train", range(4))
  dev = demo_data_source(str(tmp_path), "twx", KWARGS, split="dev",
                         num_tasks={"train": 4, "dev": 2}, build=False)
  assert sorted(decode_record(r)["index"] for r in dev) == [0, 1]
  batch = next(iter(ds.batch(2, batch_fn=list).to_iter_dataset()))
  assert len(batch) == 2


def test_works_for_any_registered_env_with_an_expert():
  # The fault-injection wrapper is a different registered env with the same expert.
  inner = collect_demos("twx", {"game": "sorting"}, "dev", [3])
  wrapped = collect_demos("faulty", {"inner": "twx", "inner_kwargs": {"game": "sorting"}},
                          "dev", [3])
  assert [dict(r, env="twx") for r in wrapped] == inner and inner[0]["won"]


def test_two_processes_building_the_same_demos_at_once_both_get_one_dataset(tmp_path):
  # A sweep's first two jobs on a fresh machine start together and need the same demos.
  code = ("import sys, environments; from environments.demos import build_demos; "
          "b = build_demos(sys.argv[1], 'twx', {'game': 'mapreader', 'step_limit': 40}, "
          "{'train': 6}); print(b.info.splits['train'].num_examples)")
  procs = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
           for _ in range(2)]
  outs = [p.communicate(timeout=300) for p in procs]
  for p, (out, err) in zip(procs, outs):
    assert p.returncode == 0, err[-2000:]
    assert out.split()[-1] == "6"
  built = [d for d in os.listdir(tmp_path / "expert_demos") if not d.startswith(".")]
  assert len(built) == 1 and os.listdir(tmp_path / "expert_demos" / built[0]) == ["1.0.0"]
