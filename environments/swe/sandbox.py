"""Runs one shell command of a software-engineering agent in a sandbox, with limits.

The role of SWE-bench's per-instance container and of mini-swe-agent's `LocalEnvironment`
`subprocess.run(..., timeout=...)`, without a container engine. Two mechanisms:

  "bwrap" (bubblewrap, Debian package `bubblewrap`; preferred, used when `bwrap` is on
  PATH): the whole file system read-only (`--ro-bind / /`), the working copy the only
  writable bind, a private /tmp (tmpfs), new user, PID, network, IPC and UTS namespaces
  (`--unshare-all`: no network interface but loopback), a new session, and the sandbox
  dies with its parent. Contained: writes outside the working copy (EROFS), network
  (ENETUNREACH), processes (all die with the namespace's PID 1 on timeout).

  "rlimit" (the documented weaker fallback when bwrap is missing): a new session (process
  group) that is killed as a whole on timeout, the working copy as cwd, and, where
  `unshare -rn` works, a new network namespace; where it does not, a `sitecustomize` on
  PYTHONPATH that makes Python's `socket.socket.connect` raise, which stops Python code
  only (a compiled program or `curl` still reaches the network). Writes outside the
  working copy are NOT refused in this mode (only ordinary file permissions apply, and
  commands run as the calling user). Without a pids cgroup, a process that calls setsid()
  itself leaves the process group and survives the timeout kill (its CPU limit still ends it).

Both mechanisms set the same resource limits on the command (rlimits inherited by its
children, set by util-linux `prlimit`): CPU seconds, address space, file size. The number
of processes: Linux does not enforce RLIMIT_NPROC for root, so when this process is root
and a pids cgroup (v1 /sys/fs/cgroup/pids or a v2 hierarchy with the pids controller) is
writable, each Sandbox gets its own cgroup with `pids.max = nproc`, the command is put in
it before exec, and before the next command and at close every process left in it is
killed (escapees from the session included). As a non-root user RLIMIT_NPROC is set to
`nproc` above the processes that user already has (it counts all of them). As root
without a writable pids cgroup nothing bounds the process count but the timeout
(`Sandbox.nproc_mechanism` says which applies).

Output: stdout and stderr, interleaved, go to one pipe that is read up to
`output_bytes`; what follows is discarded (the command keeps running until it ends or the
timeout) and the result says how many bytes were dropped. A runaway command (wall time
over `time_s`, CPU over `cpu_s`) is killed and reported in `Result.killed`; it never hangs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time

_CGROUP_ROOTS = ("/sys/fs/cgroup/pids", "/sys/fs/cgroup/unified", "/sys/fs/cgroup")
_SITE_BLOCK = """\
import socket as _s
def _blocked(*a, **k):
  raise OSError(101, "network is disabled in this sandbox")
_s.socket.connect = _blocked
_s.socket.connect_ex = _blocked
_s.create_connection = _blocked
"""


_COUNTER = itertools.count()


def make_temp_dir(prefix: str) -> str:
  return tempfile.mkdtemp(prefix=prefix)


@dataclasses.dataclass(frozen=True)
class Limits:
  """Per-command limits (defaults: mini-swe-agent's 60 s timeout is cut to 20 s)."""

  time_s: float = 20.0  # wall clock
  cpu_s: int = 20  # RLIMIT_CPU (SIGXCPU, then SIGKILL)
  memory_mb: int = 4096  # RLIMIT_AS
  file_mb: int = 64  # RLIMIT_FSIZE: the largest file a command may write
  nproc: int = 512  # RLIMIT_NPROC (see the module docstring: shared by the uid)
  output_bytes: int = 200_000  # bytes of output read; the rest is dropped


@dataclasses.dataclass(frozen=True)
class Result:
  output: str
  returncode: int | None  # None when killed
  killed: str | None  # None, "timeout" or "cpu" (RLIMIT_CPU's signal)
  dropped_bytes: int  # output past Limits.output_bytes
  seconds: float
  # A fork was refused for the process limit (known only with a pids cgroup, else False).
  hit_nproc: bool = False


@functools.lru_cache(maxsize=None)
def _unshare_net_works() -> bool:
  if not shutil.which("unshare"):
    return False
  try:
    return subprocess.run(["unshare", "-rn", "true"], capture_output=True,
                          timeout=10).returncode == 0
  except (OSError, subprocess.SubprocessError):
    return False


def default_mechanism() -> str:
  return "bwrap" if shutil.which("bwrap") else "rlimit"


def _remove_stale_cgroups(root: str) -> None:
  """Empty cgroups of ours whose process died without closing them (a killed pool worker)."""
  for name in os.listdir(root):
    m = re.fullmatch(r"csa_swe_(\d+)_\d+", name)
    if m and not os.path.exists(f"/proc/{m.group(1)}"):
      with contextlib.suppress(OSError):
        os.rmdir(os.path.join(root, name))  # fails, harmlessly, while a process is inside


def _make_pids_cgroup(nproc: int) -> str | None:
  """A fresh pids cgroup with pids.max = nproc, or None where none can be made."""
  if os.getuid() != 0:
    return None
  for root in _CGROUP_ROOTS:
    if not os.path.exists(os.path.join(root, "cgroup.procs")):
      continue
    if root != "/sys/fs/cgroup/pids":  # cgroup v2: the pids controller must be enabled
      try:
        with open(os.path.join(root, "cgroup.subtree_control")) as f:
          if "pids" not in f.read().split():
            continue
      except OSError:
        continue
    _remove_stale_cgroups(root)
    path = os.path.join(root, f"csa_swe_{os.getpid()}_{next(_COUNTER)}")
    try:
      os.mkdir(path)
      with open(os.path.join(path, "pids.max"), "w") as f:
        f.write(str(nproc))
      return path
    except OSError:
      with contextlib.suppress(OSError):
        os.rmdir(path)
  return None


def _count_user_tasks(uid: int) -> int:
  """Threads of `uid` now: what RLIMIT_NPROC counts (only needed when not root)."""
  n = 0
  for pid in os.listdir("/proc"):
    if pid.isdigit():
      try:
        st = os.stat(f"/proc/{pid}")
        if st.st_uid == uid:
          n += len(os.listdir(f"/proc/{pid}/task"))
      except OSError:
        pass
  return n


def _limit_prefix(limits: Limits, nproc: int | None, cgroup: str | None) -> list[str]:
  """Commands that join the cgroup and set the rlimits, then exec the sandbox.

  Done by exec'd programs (sh, prlimit) rather than a Python preexec_fn: the trainer is
  multithreaded (JAX), and running Python between fork and exec there can deadlock.
  """
  prefix = []
  if cgroup is not None:
    prefix = ["sh", "-c", 'echo $$ > "$0" && exec "$@"', os.path.join(cgroup, "cgroup.procs")]
  cpu = max(1, int(limits.cpu_s))
  prefix += ["prlimit", f"--cpu={cpu}:{cpu + 1}", f"--as={limits.memory_mb * 2**20}",
             f"--fsize={limits.file_mb * 2**20}", "--core=0"]
  if nproc is not None:
    prefix.append(f"--nproc={nproc}")
  return prefix + ["--"]


_PROJECT_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _needed_under_tmp() -> list[str]:
  """Host paths under /tmp that sandboxed commands need: this checkout and its Python
  (a clone in /tmp, as CI makes). The sandbox's private /tmp would hide them, so they
  are bound back, read-only, over it."""
  roots = {os.path.realpath(sys.prefix), os.path.realpath(_PROJECT_ROOT)}
  return sorted(p for p in roots if p.startswith("/tmp/"))


class Sandbox:
  """Runs commands in `workdir` (the working copy) under `limits`."""

  def __init__(self, workdir: str, limits: Limits = Limits(), mechanism: str | None = None,
               env: dict[str, str] | None = None):
    self.workdir = os.path.realpath(workdir)
    self.limits = limits
    self.mechanism = mechanism or default_mechanism()
    if self.mechanism not in ("bwrap", "rlimit"):
      raise ValueError(f"mechanism={self.mechanism!r}; valid: bwrap, rlimit")
    if self.mechanism == "bwrap" and not shutil.which("bwrap"):
      raise RuntimeError("bwrap is not installed (Debian: apt-get install bubblewrap)")
    self._site_dir: str | None = None
    self._cgroup = _make_pids_cgroup(limits.nproc)
    self.nproc_mechanism = ("cgroup" if self._cgroup else
                            "rlimit" if os.getuid() != 0 else "none (root, no pids cgroup)")
    self._env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": self.workdir,
                 "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1", "TERM": "dumb",
                 "GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "safe.directory",
                 "GIT_CONFIG_VALUE_0": "*"}
    self._env.update(env or {})

  def _argv(self, command: str) -> list[str]:
    shell = ["bash", "-c", command]
    if self.mechanism == "bwrap":
      under_tmp = [a for p in _needed_under_tmp() for a in ("--ro-bind", p, p)]
      return ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
              "--tmpfs", "/tmp", *under_tmp, "--bind", self.workdir, self.workdir,
              "--unshare-all", "--die-with-parent", "--new-session",
              "--chdir", self.workdir] + shell
    if _unshare_net_works():
      return ["unshare", "-rn"] + shell
    return shell

  def _run_env(self) -> dict[str, str]:
    env = dict(self._env)
    if self.mechanism == "rlimit" and not _unshare_net_works():
      if self._site_dir is None:
        self._site_dir = tempfile.mkdtemp(prefix="swe_site_")
        with open(os.path.join(self._site_dir, "sitecustomize.py"), "w") as f:
          f.write(_SITE_BLOCK)
        os.chmod(self._site_dir, 0o755)
      env["PYTHONPATH"] = self._site_dir + os.pathsep + env.get("PYTHONPATH", "")
    return env

  def run(self, command: str) -> Result:
    lim = self.limits
    nproc = None if os.getuid() == 0 or self._cgroup else (
        _count_user_tasks(os.getuid()) + lim.nproc)
    self._wait_cgroup_empty()
    refused_before = self._forks_refused()
    os.makedirs(self.workdir, exist_ok=True)  # in "rlimit" mode a command may delete it
    start = time.monotonic()
    argv = _limit_prefix(lim, nproc, self._cgroup) + self._argv(command)
    proc = subprocess.Popen(argv, cwd=self.workdir, env=self._run_env(),
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)
    chunks, kept, dropped, timed_out = [], 0, 0, False
    fd = proc.stdout.fileno()
    deadline = start + lim.time_s
    while True:
      left = deadline - time.monotonic()
      if left <= 0:
        timed_out = True
        break
      ready, _, _ = select.select([fd], [], [], min(left, 0.2))
      if not ready:
        if proc.poll() is not None:
          break  # the command ended; background children holding the pipe are killed below
        continue
      data = os.read(fd, 65536)
      if not data:
        break  # every writer closed the pipe
      take = max(0, min(len(data), lim.output_bytes - kept))
      chunks.append(data[:take])
      kept += take
      dropped += len(data) - take
    if timed_out or proc.poll() is not None:
      self._kill(proc)
    try:
      rc = proc.wait(timeout=max(0.1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:  # the pipe closed but the process lingers
      timed_out = True
      self._kill(proc)
      rc = proc.wait()
    proc.stdout.close()
    killed = "timeout" if timed_out else (
        "cpu" if rc in (-signal.SIGXCPU, -signal.SIGKILL, 128 + signal.SIGXCPU) else None)
    output = b"".join(chunks).decode("utf-8", errors="replace")
    return Result(output=output, returncode=None if timed_out else rc, killed=killed,
                  dropped_bytes=dropped, seconds=time.monotonic() - start,
                  hit_nproc=self._forks_refused() > refused_before)

  def _forks_refused(self) -> int:
    """pids.events' "max": how many forks the cgroup's pids.max has refused so far."""
    if self._cgroup is None:
      return 0
    with open(os.path.join(self._cgroup, "pids.events")) as f:
      return int(dict(line.split() for line in f if line.strip()).get("max", 0))

  def _kill(self, proc: subprocess.Popen) -> None:
    # The whole session: bwrap's namespace dies with it; in "rlimit" mode every child
    # that stayed in the group goes too, and with a cgroup every process in it.
    with contextlib.suppress(ProcessLookupError, PermissionError):
      os.killpg(proc.pid, signal.SIGKILL)
    self._kill_cgroup()

  def _wait_cgroup_empty(self) -> None:
    # Whatever a previous command left alive goes before the next starts. (Dead processes
    # stay charged to pids.current until init reaps them, which can take a while.)
    self._kill_cgroup()

  def _kill_cgroup(self) -> None:
    if self._cgroup is not None:
      for _ in range(1000):  # a fork bomb may still be forking: repeat until none is left
        with open(os.path.join(self._cgroup, "cgroup.procs")) as f:
          pids = [int(p) for p in f.read().split()]
        if not pids:
          break
        for pid in pids:
          with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        time.sleep(0.002)

  def __enter__(self) -> Sandbox:
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  def __del__(self):
    self.close()

  def close(self) -> None:
    if getattr(self, "_cgroup", None) is not None:
      self._kill_cgroup()
      with contextlib.suppress(OSError):
        os.rmdir(self._cgroup)
      self._cgroup = None
    if getattr(self, "_site_dir", None) is not None:
      shutil.rmtree(self._site_dir, ignore_errors=True)
      self._site_dir = None
