"""Checks that a work directory can be written, before anything is written to it."""

from __future__ import annotations

import errno
import os
import tempfile


def unwritable(path: str, flag: str = "--workdir") -> str | None:
  """Why `path` cannot be (created and) written as a directory, or None.

  Looks at the path itself when it exists (it must be a directory), else at its nearest
  existing ancestor (a directory, on a writable file system, in which this user may create
  entries). A temporary entry is made and removed there, so a read-only mount, missing
  permissions or a full disk are found now rather than by the first checkpoint; nothing
  is left behind.
  """
  path = os.path.abspath(path)
  if os.path.exists(path) and not os.path.isdir(path):
    return f"{flag} {path} is a file, not a directory"
  probe = path
  while not os.path.exists(probe):
    parent = os.path.dirname(probe)
    if parent == probe:
      break
    probe = parent
  if not os.path.isdir(probe):
    return f"{flag} {path}: {probe} is a file, not a directory"
  try:
    os.rmdir(tempfile.mkdtemp(prefix=".csa_jax_write_check_", dir=probe))
  except OSError as e:
    why = ("a read-only file system" if e.errno == errno.EROFS
           else os.strerror(e.errno) if e.errno else str(e))
    where = "it" if probe == path else probe
    return f"{flag} {path}: cannot write in {where} ({why})"
  return None
