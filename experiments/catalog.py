"""`launch.py --list`: the registered experiments grouped by family, quickstart first.

A family is what `experiments.variants.register_family` registers: `{prefix}_{method}`
for every method of `VARIANTS`, one task and budget. Each family line says whether it runs
on a CPU or is sized for an accelerator, and whether it needs `model_path` (the presets
sized for a pretrained checkpoint that is not packaged with the project). The catalog reads
the experiments' registry, so it lives beside it: the library (csa_jax) knows no experiment.
"""

from __future__ import annotations

import dataclasses

from csa_jax import pretrained
import experiments
from experiments.variants import VARIANTS

# A policy with more parameters than this is not one to train on a CPU (SmolLM2-135M, the
# packaged pretrained model, trains on one, slowly).
CPU_PARAMS = 200_000_000


@dataclasses.dataclass
class Family:
  prefix: str
  doc: str
  names: list[str]
  methods: list[str]
  hardware: str  # "CPU" or "accelerator"
  needs_model_path: bool

  @property
  def label(self) -> str:
    return f"{self.prefix}_*" if self.methods else self.prefix


def _params(model) -> int:
  d, h, i, n = model.vocab_size, model.hidden_size, model.intermediate_size, model.num_layers
  attn = h * model.head_dim * (model.num_heads * 2 + model.num_kv_heads * 2)
  return d * h * (1 if model.tie_embeddings else 2) + n * (attn + 3 * h * i)


def families() -> list[Family]:
  docs = experiments.list_experiments()
  methods = sorted(VARIANTS, key=len, reverse=True)  # "csa_dapo" before "dapo"
  groups: dict[str, list[tuple[str, str | None]]] = {}
  for name in docs:
    method = next((m for m in methods if name.endswith("_" + m)), None)
    prefix = name[: -len(method) - 1] if method else name
    groups.setdefault(prefix, []).append((name, method))
  out = []
  for prefix, members in groups.items():
    if len(members) == 1 and members[0][0] == prefix:
      members = [(prefix, None)]  # a lone experiment, not a family
    elif len(members) == 1:  # one name that only looks like a family member
      prefix = members[0][0]
      members = [(prefix, None)]
    cfg = experiments.get_experiment(members[0][0])
    need = bool(cfg.pretrained) and not pretrained.is_packaged(cfg.pretrained)
    big = need or (not cfg.model_path and _params(cfg.model) > CPU_PARAMS)
    doc = docs[members[0][0]]
    if members[0][1] is not None and doc.endswith(f": {members[0][1]}"):
      doc = doc[: -len(members[0][1]) - 2]
    out.append(Family(prefix, doc, [n for n, _ in members],
                      [m for _, m in members if m is not None],
                      "accelerator" if big else "CPU", need))

  def order(f: Family):
    return (f.prefix != "quickstart", f.hardware != "CPU", f.prefix)

  return sorted(out, key=order)


def listing(family: str = "") -> str:
  """The family table, or with `family` (a prefix, or a name) every experiment in it."""
  fams = families()
  if family:
    chosen = [f for f in fams if family in (f.prefix, f.label) or family in f.names]
    if not chosen:
      raise KeyError(f"no experiment family {family!r}; families: "
                     f"{', '.join(f.prefix for f in fams)}")
    f = chosen[0]
    docs = experiments.list_experiments()
    return "\n".join(f"{n:32s} {docs[n]}" for n in f.names)
  width = max(len(f.label) for f in fams)
  lines = []
  for f in fams:
    where = f.hardware + (", needs model_path" if f.needs_model_path else "")
    lines.append(f"{f.label:{width}}  [{where}]  {f.doc}")
  lines += ["", f"A family NAME_* holds NAME_{{{','.join(VARIANTS)}}} (experiments/variants.py);",
            "`--list NAME` lists one family's experiments, `--exp EXP --show-config` shows "
            "every config key of one."]
  return "\n".join(lines)
