"""Exact distance-to-goal for ALFWorld's six task types (Shridhar et al., ICLR 2021), fast.

The oracle step label of `environments.alfworld_env` is d(s) - d(s'), with d the number of
steps of a shortest plan to the goal. Fast Downward finds d by a blind search over the whole
PDDL state (0.1-25 s per state). Here d comes from a uniform-cost search over a small
abstract state, with "macro" moves whose cost is the exact number of engine steps they take:

  state: the agent's location, what it holds, where each goal-type object is (receptacle or
         hand) and its clean/hot/cool flags, which receptacles are open, which lamps were used.
  moves: pick up a goal-type object        go (0/1) + open (0/1) + take (1)
         put the held object in r          go (0/1) + open (0/1) + put (1)
         clean/heat/cool the held object   go (0/1) + use the appliance (1)
         switch a lamp on (look tasks)     go (0/1) + use (1)
         go back to a lamp switched on     go (1)

Why nothing else can shorten a plan (unit costs, `alfworld_gen.unit_cost_domain`): look,
examine, inventory and close change nothing a precondition or goal reads (closing only undoes
an open); a "go" is needed only before acting where the agent is not; opening matters only for
taking from or putting into that receptacle, so it is charged there, once (the open set is in
the state); picking up an object of another type only fills the hand. The one hand is modelled
exactly: what the agent holds at the start, of any type, may be put anywhere it fits. Lamps are
not pickupable, so they never move. Every goal template of the six types reads only the facts
above (`alfworld/gen/goal_library.py`). The test `tests/test_alfworld_distance.py` checks the
result against the planner on sampled random-walk states of all six types.

Exact only under unit action costs (generated games). Official games keep cost 5 for
heat/cool/clean/use, where the label is the official planner's plan length, which need not be
shortest: `alfworld_env` falls back to the planner there.
"""

from __future__ import annotations

import dataclasses
import heapq

# What each state-change task needs: (flag fact, the property an object needs, appliance type).
_TREAT = {
    "pick_clean_then_place_in_recep": ("isclean", "cleanable", "sinkbasintype"),
    "pick_heat_then_place_in_recep": ("ishot", "heatable", "microwavetype"),
    "pick_cool_then_place_in_recep": ("iscool", "coolable", "fridgetype"),
}
TASK_TYPES = ("pick_and_place_simple", "look_at_obj_in_light", "pick_two_obj_and_place",
              *_TREAT)
_HELD = "<held>"


@dataclasses.dataclass(frozen=True)
class Goal:
  task_type: str
  obj_type: str  # "apple" (lower case, as in the engine's facts, without "type")
  parent_type: str  # "" for look_at_obj_in_light
  toggle_type: str  # "" except look_at_obj_in_light

  @classmethod
  def from_pddl_params(cls, task_type: str, params: dict) -> "Goal":
    if task_type not in TASK_TYPES:
      raise ValueError(f"no exact distance for task type {task_type!r}")
    low = lambda k: (params.get(k) or "").lower()
    return cls(task_type, low("object_target"), low("parent_target"), low("toggle_target"))


@dataclasses.dataclass(frozen=True)
class Static:
  """The facts of a game that no action changes."""
  rec_loc: dict  # receptacle -> location
  rec_type: dict  # receptacle -> "cabinet"
  openable: frozenset
  can_contain: frozenset  # (rtype, otype)
  obj_type: dict  # object -> "apple"
  props: frozenset  # (property, object): cleanable/heatable/coolable/toggleable


def _facts_by_name(facts) -> dict[str, list[tuple[str, ...]]]:
  out: dict[str, list[tuple[str, ...]]] = {}
  for f in facts:
    out.setdefault(f.name, []).append(tuple(a.name for a in f.arguments))
  return out


def _strip(t: str) -> str:
  return t[:-4] if t.endswith("type") else t


def static_of(facts) -> Static:
  by = _facts_by_name(facts)
  return Static(
      rec_loc={r: l for r, l in by.get("receptacleatlocation", [])},
      rec_type={r: _strip(t) for r, t in by.get("receptacletype", [])},
      openable=frozenset(r for (r,) in by.get("openable", [])),
      can_contain=frozenset((_strip(a), _strip(b)) for a, b in by.get("cancontain", [])),
      obj_type={o: _strip(t) for o, t in by.get("objecttype", [])},
      props=frozenset((p, o) for p in ("cleanable", "heatable", "coolable", "toggleable")
                      for (o,) in by.get(p, [])),
  )


def distance(static: Static, goal: Goal, facts) -> int:
  """Steps of a shortest plan from the state `facts` (an iterable of textworld Propositions)."""
  by = _facts_by_name(facts)
  loc = by["atlocation"][0][1]
  held = next((o for _, o in by.get("holds", [])), None)
  where = {o: r for o, r in by.get("inreceptacle", [])}
  targets = tuple(sorted(o for o, t in static.obj_type.items() if t == goal.obj_type))
  flag = _TREAT.get(goal.task_type, (None,))[0]
  flagged = {o for (o,) in by.get(flag, [])} if flag else set()
  pos = tuple(_HELD if o == held else where.get(o) for o in targets)
  start = (loc, held, pos, tuple(o in flagged for o in targets),
           frozenset(r for (r,) in by.get("opened", [])),
           frozenset(o for (o,) in by.get("istoggled", [])))
  # Lamps are not pickupable: where they stand now is where they always stand.
  return _search(_Moves(static, goal, targets, where), start)


def _search(search: "_Moves", start) -> int:
  """Uniform-cost search over the abstract state; moves cost 1-3 engine steps."""
  frontier = [(0, 0, start)]
  best = {start: 0}
  tie = 0
  while frontier:
    cost, _, state = heapq.heappop(frontier)
    if cost > best.get(state, cost):
      continue
    if search.is_goal(state):
      return cost
    for step, nxt in search.moves(state):
      c = cost + step
      if c < best.get(nxt, c + 1):
        best[nxt] = c
        tie += 1
        heapq.heappush(frontier, (c, tie, nxt))
  raise ValueError("goal unreachable in the abstract search")


class _Moves:
  """The macro moves and the goal test of one task (see the module docstring)."""

  def __init__(self, static: Static, goal: Goal, targets: tuple, where: dict):
    self.s, self.g, self.targets = static, goal, targets
    self.index = {o: i for i, o in enumerate(targets)}
    treat = _TREAT.get(goal.task_type)
    self.appliances = () if treat is None else tuple(
        r for r, t in static.rec_type.items() if t == _strip(treat[2]))
    self.treat_prop = None if treat is None else treat[1]
    lamps = [o for o, t in static.obj_type.items()
             if t == goal.toggle_type and ("toggleable", o) in static.props] if goal.toggle_type else []
    self.lamps = tuple(sorted(lamps))
    self.lamp_hosts = {l: where.get(l) for l in self.lamps}
    self.parents = frozenset(r for r, t in static.rec_type.items() if t == goal.parent_type)
    self.look = goal.task_type == "look_at_obj_in_light"
    self.two = goal.task_type == "pick_two_obj_and_place"

  def _reach(self, loc, opened, r) -> int:
    """Steps to stand at receptacle r with it open (if it opens)."""
    return (loc != self.s.rec_loc[r]) + (r in self.s.openable and r not in opened)

  def is_goal(self, state) -> bool:
    loc, held, pos, flags, opened, toggled = state
    if self.look:
      return held in self.index and any(
          self.s.rec_loc.get(self.lamp_hosts[l]) == loc for l in toggled if l in self.lamp_hosts)
    inside = [r for r, ok in zip(pos, flags) if r in self.parents
              and (self.treat_prop is None or ok)]
    if self.two:
      return any(inside.count(r) >= 2 for r in set(inside))
    return bool(inside)

  def moves(self, state):
    loc, held, pos, flags, opened, toggled = state
    s = self.s
    if held is None:
      for i, r in enumerate(pos):
        if r is None or r == _HELD:
          continue
        new_pos = pos[:i] + (_HELD,) + pos[i + 1:]
        yield (self._reach(loc, opened, r) + 1,
               (s.rec_loc[r], self.targets[i], new_pos, flags, self._open(opened, r), toggled))
    else:
      i = self.index.get(held)
      # Put the held object down (it may be of any type; a goal-type one only if that can help:
      # a look task needs it in hand).
      if i is None or not self.look:
        htype = s.obj_type[held]
        for r, rt in s.rec_type.items():
          if (rt, htype) not in s.can_contain:
            continue
          new_pos = pos if i is None else pos[:i] + (r,) + pos[i + 1:]
          yield (self._reach(loc, opened, r) + 1,
                 (s.rec_loc[r], None, new_pos, flags, self._open(opened, r), toggled))
      if i is not None and self.treat_prop and not flags[i] and (self.treat_prop, held) in s.props:
        new_flags = flags[:i] + (True,) + flags[i + 1:]
        for a in self.appliances:
          yield ((loc != s.rec_loc[a]) + 1, (s.rec_loc[a], held, pos, new_flags, opened, toggled))
    for lamp in self.lamps:
      host = self.lamp_hosts[lamp]
      if host is None:
        continue
      if lamp not in toggled:
        yield ((loc != s.rec_loc[host]) + 1,
               (s.rec_loc[host], held, pos, flags, opened, toggled | {lamp}))
      elif loc != s.rec_loc[host]:  # a lamp switched on earlier: the goal needs the agent there
        yield (1, (s.rec_loc[host], held, pos, flags, opened, toggled))

  def _open(self, opened, r):
    return opened | {r} if r in self.s.openable and r not in opened else opened
