"""N local processes of one JAX program, as the hosts of a pod slice would run it.

    python -m csa_jax.distributed.multiprocess_local --processes 2 [--devices 4] \\
        -- --exp quickstart --mesh 4x2

starts `python launch.py <args>` (or `--script FILE`) N times on this machine with the
standard variables of a multi-process launch (JAX_COORDINATOR_ADDRESS on a free local
port, JAX_NUM_PROCESSES, JAX_PROCESS_ID), `--devices` simulated CPU devices each
(XLA_FLAGS) and gloo collectives, so that launch.py takes its multi-process path unchanged
(csa_jax/distributed/mesh.py, maybe_initialize_distributed). Each output line is prefixed with its
rank ("[1] ..."). SIGTERM and SIGINT are passed on to every process once; when one process
fails the others get `--grace` seconds to finish before they are terminated (a process
waiting in a collective for a dead peer would otherwise wait forever). The exit code is
the worst of the processes' (a process killed by signal S counts as 128 + S).
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def with_device_count(xla_flags: str, devices: int) -> str:
  """An XLA_FLAGS value with its other flags kept and `devices` simulated CPU devices."""
  flags = [f for f in xla_flags.split()
           if not f.startswith("--xla_force_host_platform_device_count")]
  return " ".join(flags + [f"--xla_force_host_platform_device_count={devices}"])


def process_env(rank: int, processes: int, devices: int, port: int,
                base: dict[str, str] | None = None) -> dict[str, str]:
  env = dict(os.environ if base is None else base)
  env.update(JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}", JAX_NUM_PROCESSES=str(processes),
             JAX_PROCESS_ID=str(rank), JAX_PLATFORMS="cpu",
             JAX_CPU_COLLECTIVES_IMPLEMENTATION="gloo", PYTHONUNBUFFERED="1",
             XLA_FLAGS=with_device_count(env.get("XLA_FLAGS", ""), devices))
  return env


def _pump(stream, out, rank: int) -> None:
  for line in iter(stream.readline, ""):
    out.write(f"[{rank}] {line}")
    out.flush()
  stream.close()


def exit_code(returncode: int) -> int:
  return 128 - returncode if returncode < 0 else returncode


def run(processes: int, devices: int, args: list[str], script: str = "launch.py",
        grace: float = 60.0) -> int:
  port = free_port()
  procs = []
  for rank in range(processes):
    # A session of its own: a Ctrl-C at the terminal reaches this helper alone, which
    # passes it on once (two would make launch.py exit without saving).
    procs.append(subprocess.Popen(
        [sys.executable, script, *args], cwd=ROOT, env=process_env(rank, processes, devices, port),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True))
  pumps = [threading.Thread(target=_pump, args=(stream, out, rank), daemon=True)
           for rank, p in enumerate(procs)
           for stream, out in ((p.stdout, sys.stdout), (p.stderr, sys.stderr))]
  for t in pumps:
    t.start()

  def forward(signum, frame):
    del frame
    for p in procs:
      if p.poll() is None:
        p.send_signal(signum)

  previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
  try:
    failed_at = None
    while any(p.poll() is None for p in procs):
      if failed_at is None and any(p.poll() not in (None, 0) for p in procs):
        failed_at = time.monotonic()
      if failed_at is not None and time.monotonic() - failed_at > grace:
        for p in procs:
          if p.poll() is None:
            print(f"multiprocess_local: rank {procs.index(p)} still runs {grace:.0f} s after "
                  "another failed; killing it", file=sys.stderr, flush=True)
            p.kill()
      time.sleep(0.1)
  finally:
    for s, h in previous.items():
      signal.signal(s, h)
  for t in pumps:
    t.join(timeout=5)
  return max(exit_code(p.returncode) for p in procs)


def main(argv=None) -> int:
  argv = sys.argv[1:] if argv is None else argv
  if "--" in argv:
    i = argv.index("--")
    argv, rest = argv[:i], argv[i + 1:]
  else:
    rest = []
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--processes", type=int, default=2)
  p.add_argument("--devices", type=int, default=4, help="simulated CPU devices per process")
  p.add_argument("--script", default="launch.py", help="the program each process runs")
  p.add_argument("--grace", type=float, default=60.0,
                 help="seconds the others may run on after one process failed")
  a = p.parse_args(argv)
  if a.processes < 1 or a.devices < 1:
    p.error("--processes and --devices must be positive")
  return run(a.processes, a.devices, rest, script=a.script, grace=a.grace)


if __name__ == "__main__":
  sys.exit(main())
