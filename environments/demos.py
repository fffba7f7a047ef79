"""Expert demonstrations for SFT as a TensorFlow Datasets builder (array_record, no TF).

Rolls out a registered environment's expert (`TextEnv.expert_action()`) on indexed tasks
and stores one record per episode, in the style of the ALFWorld / ScienceWorld expert
trajectories used for behaviour cloning before RL (e.g. verl-agent, arXiv 2505.10978).
Read back with `demo_data_source(...)` (a `tfds` data source, random access) and feed it to
`grain.MapDataset.source(...)`; `decode_record` turns its bytes back into str.

Record schema (one per episode; text comes back from tfds as bytes):
  env:          str   registered env name (e.g. "twx")
  split:        str   the env split the task came from ("train", "dev", ...)
  index:        int32 the task index within that split (`env.reset(split, index)`)
  task:         str   StepInfo.task (the task description)
  observations: [str] the observation before each action (observations[0] is reset's)
  actions:      [str] the expert's actions; len(actions) == len(observations)
  admissible:   [str] per step, the admissible actions before that action, "\\n"-joined
  rewards:      [float32] the reward of each action
  won:          bool  whether the episode ended in success
An episode stops when the env says done, or when the expert has no action (then won is
False); episodes the expert did not win are kept, so filter on `won` for SFT.

Build: `build_demos(data_dir, "twx", {"game": "coin"}, num_tasks={"train": 100})`,
or `python -m environments.demos --data_dir DIR --env twx --kwargs '{"game": "coin"}'`.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fcntl
import hashlib
import json
import logging
import os
import sys
from typing import Any, Iterable, Mapping

from etils import epath
import numpy as np
import tensorflow_datasets as tfds

from environments.registry import env_version, make_env

# The launcher's refusals are one line on stderr: tfds's own progress bars and its warning
# for every custom builder config would surround them. Progress goes to stdout instead.
tfds.disable_progress_bar()


class _QuietCustomConfig(logging.Filter):
  def filter(self, record: logging.LogRecord) -> bool:
    return "Using custom data configuration" not in record.getMessage()


logging.getLogger("absl").addFilter(_QuietCustomConfig())

SEP = "\n"
VERSION_FILE = "ENV_VERSION"  # beside the dataset's files: the env_version it was built with


class DemosError(ValueError):
  """A demonstrations cache that does not belong to this environment version."""
_DEFAULT_NUM_TASKS = (("train", 100),)


def collect_demos(env_name: str, env_kwargs: Mapping[str, Any] | None, split: str,
                  indices: Iterable[int]) -> list[dict]:
  """Plays the env's expert on tasks `indices` of `split`; one record per episode."""
  env = make_env(env_name, **dict(env_kwargs or {}))
  try:
    return [_play_expert(env, env_name, split, int(i)) for i in indices]
  finally:
    env.close()


def _play_expert(env, env_name: str, split: str, index: int) -> dict:
  r = env.reset(split, index)
  record = {"env": env_name, "split": split, "index": index, "task": r.info.task,
            "observations": [], "actions": [], "admissible": [], "rewards": [],
            "won": False}
  while not r.done:
    action = env.expert_action()
    if action is None:
      break
    record["observations"].append(r.observation)
    record["admissible"].append(SEP.join(r.info.admissible_actions))
    record["actions"].append(action)
    r = env.step(action)
    record["rewards"].append(float(r.reward))
  record["won"] = bool(r.info.won)
  return record


def config_name(env_name: str, env_kwargs: Mapping[str, Any] | None) -> str:
  """A stable config name per (env, kwargs), e.g. "twx-coin-3f2a9c01d4"."""
  kwargs_json = json.dumps(dict(env_kwargs or {}), sort_keys=True)
  digest = hashlib.sha1(f"{env_name}:{kwargs_json}".encode()).hexdigest()[:10]
  game = (env_kwargs or {}).get("game") or (env_kwargs or {}).get("task")
  return f"{env_name}-{game}-{digest}" if isinstance(game, str) and game.isidentifier() \
      else f"{env_name}-{digest}"


@dataclasses.dataclass(eq=False)
class DemoConfig(tfds.core.BuilderConfig):
  """Which env (registered name + kwargs) and how many tasks of each split to roll out."""

  env_name: str = "twx"
  env_kwargs_json: str = "{}"
  num_tasks: tuple[tuple[str, int], ...] = _DEFAULT_NUM_TASKS

  @classmethod
  def make(cls, env_name: str, env_kwargs: Mapping[str, Any] | None = None,
           num_tasks: Mapping[str, int] | None = None) -> DemoConfig:
    counts = tuple(sorted((num_tasks or dict(_DEFAULT_NUM_TASKS)).items()))
    for split, n in counts:
      if n < 1:
        raise ValueError(f"num_tasks[{split!r}] must be >= 1, got {n}")
    # The split sizes are part of the dataset, so they are part of the config name.
    sizes = "-".join(f"{s}{n}" for s, n in counts)
    return cls(name=f"{config_name(env_name, env_kwargs)}-{sizes}", env_name=env_name,
               env_kwargs_json=json.dumps(dict(env_kwargs or {}), sort_keys=True),
               num_tasks=counts, description=f"expert demos of {env_name} {env_kwargs}")


class ExpertDemos(tfds.core.GeneratorBasedBuilder):
  """Expert episodes of one registered env; configs are made with `DemoConfig.make`."""

  VERSION = tfds.core.Version("1.0.0")
  BUILDER_CONFIGS = [DemoConfig.make("twx", {"game": "coin"})]

  # tfds would find this file through `importlib_resources`, which is not installed here.
  @tfds.core.utils.classproperty
  @classmethod
  def code_path(cls):
    return epath.Path(__file__)

  def __init__(self, **kwargs):
    kwargs.setdefault("file_format", "array_record")
    super().__init__(**kwargs)

  def _info(self) -> tfds.core.DatasetInfo:
    text_seq = tfds.features.Sequence(tfds.features.Text())
    features = tfds.features.FeaturesDict({
        "env": tfds.features.Text(),
        "split": tfds.features.Text(),
        "index": np.int32,
        "task": tfds.features.Text(),
        "observations": text_seq,
        "actions": text_seq,
        "admissible": text_seq,
        "rewards": tfds.features.Sequence(np.float32),
        "won": np.bool_,
    })
    return tfds.core.DatasetInfo(builder=self, description=__doc__, features=features)

  def _split_generators(self, dl_manager):
    del dl_manager  # Nothing to download: the env generates its tasks.
    return {split: self._generate_examples(split, n) for split, n in self.builder_config.num_tasks}

  def _generate_examples(self, split: str, n: int):
    from tqdm.auto import tqdm  # pylint: disable=import-outside-toplevel
    cfg = self.builder_config
    # All episodes first, the environment closed, then the records: a generator holding
    # the environment open until tfds drops it can keep an engine's threads (the JVM) alive.
    indices = tqdm(range(n), desc=f"expert demonstrations ({split})", unit="ep",
                   file=sys.stdout, leave=False)
    for record in collect_demos(cfg.env_name, json.loads(cfg.env_kwargs_json), split, indices):
      yield f"{split}-{record['index']}", record


def build_demos(data_dir: str, env_name: str, env_kwargs: Mapping[str, Any] | None = None,
                num_tasks: Mapping[str, int] | None = None) -> ExpertDemos:
  """Builds (once; later calls reuse the files) and returns the builder.

  The files record the environment version they were made with; reusing them under
  another version (an engine upgrade, an adapter change) is a `DemosError`: they would
  no longer be the episodes this environment plays.
  """
  config = DemoConfig.make(env_name, env_kwargs, num_tasks)
  # Two runs starting at once on a fresh machine (a sweep's jobs, parallel tests) would
  # both generate into the same directory; the second waits and then reuses the first's.
  with _build_lock(data_dir, config.name):
    builder = ExpertDemos(data_dir=data_dir, config=config)
    stamp = os.path.join(str(builder.data_dir), VERSION_FILE)
    version = env_version(env_name)
    if os.path.exists(os.path.join(str(builder.data_dir), "dataset_info.json")):
      built = open(stamp).read().strip() if os.path.exists(stamp) else "an unrecorded version"
      if built != version:
        raise DemosError(f"the demonstrations in {builder.data_dir} were made with {built}, "
                         f"this is {version}: delete that directory to rebuild them")
      return builder
    builder.download_and_prepare()
    with open(stamp, "w") as f:
      f.write(version + "\n")
    return builder


@contextlib.contextmanager
def _build_lock(data_dir: str, config_name: str):
  """An exclusive lock per dataset config, across processes (released if one dies)."""
  lock_dir = os.path.join(data_dir, "expert_demos")
  os.makedirs(lock_dir, exist_ok=True)
  with open(os.path.join(lock_dir, f".{config_name}.lock"), "w") as f:
    fcntl.flock(f, fcntl.LOCK_EX)
    try:
      yield
    finally:
      fcntl.flock(f, fcntl.LOCK_UN)


def demo_data_source(data_dir: str, env_name: str,
                     env_kwargs: Mapping[str, Any] | None = None, *, split: str = "train",
                     num_tasks: Mapping[str, int] | None = None, build: bool = True):
  """A random-access source of `split`'s records, for `grain.MapDataset.source(...)`.

  Builds the dataset first if it is missing and `build` is True.
  """
  config = DemoConfig.make(env_name, env_kwargs, num_tasks)
  if build:
    build_demos(data_dir, env_name, env_kwargs, num_tasks)
  return tfds.data_source("expert_demos", split=split, data_dir=data_dir, download=False,
                          builder_kwargs={"config": config, "file_format": "array_record"})


def decode_record(record: Mapping[str, Any]) -> dict:
  """bytes -> str, arrays -> lists: a record as `collect_demos` made it."""
  def text(x):
    return x.decode("utf-8") if isinstance(x, bytes) else str(x)
  return {
      "env": text(record["env"]),
      "split": text(record["split"]),
      "index": int(record["index"]),
      "task": text(record["task"]),
      "observations": [text(x) for x in record["observations"]],
      "actions": [text(x) for x in record["actions"]],
      "admissible": [text(x) for x in record["admissible"]],
      "rewards": [float(x) for x in record["rewards"]],
      "won": bool(record["won"]),
  }


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description="Build an expert-demonstration dataset.")
  parser.add_argument("--data_dir", required=True)
  parser.add_argument("--env", default="twx")
  parser.add_argument("--kwargs", default="{}", help="env kwargs as JSON")
  parser.add_argument("--num_tasks", default='{"train": 100}', help="JSON {split: count}")
  args = parser.parse_args(argv)
  import environments  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
  builder = build_demos(args.data_dir, args.env, json.loads(args.kwargs), json.loads(args.num_tasks))
  for split, info in builder.info.splits.items():
    print(f"{builder.builder_config.name} {split}: {info.num_examples} episodes in {builder.data_dir}")


if __name__ == "__main__":
  main()
