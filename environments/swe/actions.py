"""The agent's command set: parsing the action text, and the observation truncation rule.

A small command set in the manner of SWE-agent's tools (Yang et al., 2024) and
mini-swe-agent's single bash action; every action is plain text whose first word names it:

  run <command>                 bash -c <command> in the working copy, in the sandbox
  view <path> [<first> <last>]  lines first..last (1-based, inclusive) of a file, numbered;
                                default the first VIEW_LINES lines; a directory is listed
  search <regex> [<path>]       grep -rnIE over the working copy (or <path>), at most
                                SEARCH_HITS lines
  replace <path>                exact text replacement, aider's SEARCH/REPLACE block:
  <<<<<<< SEARCH                the old text must occur exactly once in the file (as
  <old text>                    SWE-agent's str_replace requires); an empty old text
  =======                       creates <path> when it does not exist
  <new text>
  >>>>>>> REPLACE
  submit                        ends the episode; the working copy's diff is graded

Observation truncation (`truncate`): an observation longer than `max_chars` keeps its first
and last `max_chars // 2` characters with "[... N characters elided ...]" between them
(mini-swe-agent's head-and-tail rule for long outputs, at a size set by the env).
"""

from __future__ import annotations

import dataclasses
import re

TEMPLATES = (
    "run <command>",
    "view <path> <first line> <last line>",
    "search <regex> <path>",
    "replace <path>\n<<<<<<< SEARCH\n<old text>\n=======\n<new text>\n>>>>>>> REPLACE",
    "submit",
)
VIEW_LINES = 100
SEARCH_HITS = 50
_REPLACE_RE = re.compile(
    r"\Areplace[ \t]+(?P<path>[^\n]+?)[ \t]*\n<<<<<<< SEARCH\n(?P<old>.*?)^=======\n"
    r"(?P<new>.*?)^>>>>>>> REPLACE[ \t]*\Z", re.DOTALL | re.MULTILINE)


@dataclasses.dataclass(frozen=True)
class Action:
  kind: str  # run, view, search, replace, submit
  args: tuple = ()


class ParseError(ValueError):
  pass


def parse(text: str) -> Action:
  text = text.strip("\n\r ")
  verb = text.split(None, 1)[0] if text.split() else ""
  rest = text[len(verb):].strip()
  if verb == "submit":
    if rest:
      raise ParseError("submit takes no arguments")
    return Action("submit")
  if verb == "run":
    if not rest:
      raise ParseError("usage: run <command>")
    return Action("run", (rest,))
  if verb == "view":
    parts = rest.split()
    if len(parts) == 1:
      return Action("view", (parts[0], 1, VIEW_LINES))
    if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit():
      first, last = int(parts[1]), int(parts[2])
      if 1 <= first <= last:
        return Action("view", (parts[0], first, last))
    raise ParseError("usage: view <path> [<first line> <last line>] with 1 <= first <= last")
  if verb == "search":
    parts = rest.rsplit(None, 1) if rest else []
    if not parts:
      raise ParseError("usage: search <regex> [<path>]")
    # A last word that names a path is the path; otherwise the whole rest is the regex.
    return Action("search", (rest, None) if len(parts) == 1 else (parts[0], parts[1]))
  if verb == "replace":
    m = _REPLACE_RE.match(text + ("\n" if not text.endswith("\n") else ""))
    m = m or _REPLACE_RE.match(text)
    if not m:
      raise ParseError("usage: replace <path>, then lines '<<<<<<< SEARCH', the old text, "
                       "'=======', the new text, '>>>>>>> REPLACE'")
    return Action("replace", (m.group("path"), m.group("old"), m.group("new")))
  raise ParseError(f"unknown command {verb[:40]!r}; commands: run, view, search, replace, submit")


def replace_action(path: str, old: str, new: str) -> str:
  """The action text of a replacement (what the expert writes)."""
  return f"replace {path}\n<<<<<<< SEARCH\n{old}=======\n{new}>>>>>>> REPLACE"


def truncate(text: str, max_chars: int) -> str:
  if len(text) <= max_chars:
    return text
  half = max_chars // 2
  return f"{text[:half]}\n[... {len(text) - 2 * half} characters elided ...]\n{text[-half:]}"
