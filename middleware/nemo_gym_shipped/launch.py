"""`gym-concurrency-nemo-gym COMMAND...`: run COMMAND (`gym env start ...`, `gym eval run ...`)
with NeMo Gym instrumented in it and in every Python process it starts, like
`opentelemetry-instrument`: it sets `GYM_CONCURRENCY_NEMO_GYM=1`, puts the `bootstrap` folder
(a `sitecustomize.py`, which chains to any other) first on `PYTHONPATH`, and execs COMMAND.

`gym-concurrency-nemo-gym --env` prints the two `export` lines instead, for a shell (or a job
script) that starts NeMo Gym itself: `eval "$(gym-concurrency-nemo-gym --env)"`.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from pathlib import Path

__all__ = ["BOOTSTRAP", "environment", "main"]

BOOTSTRAP = Path(__file__).resolve().parent / "bootstrap"
_USAGE = "usage: gym-concurrency-nemo-gym COMMAND [ARGS...] | --env"


def environment(base: dict[str, str] | None = None) -> dict[str, str]:
    """`base` (default: this process's environment) with the opt-in added."""
    env = dict(os.environ if base is None else base)
    path = [str(BOOTSTRAP), *(p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p)]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(path))
    env["GYM_CONCURRENCY_NEMO_GYM"] = "1"
    return env


def main(argv: list[str] | None = None) -> int:
    """The console script: exec the command under the opt-in (or print `--env`)."""
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        print(_USAGE, file=sys.stderr if not args else sys.stdout)
        return 2 if not args else 0
    env = environment()
    if args == ["--env"]:
        for name in ("PYTHONPATH", "GYM_CONCURRENCY_NEMO_GYM"):
            print(f"export {name}={shlex.quote(env[name])}")
        return 0
    program = shutil.which(args[0], path=env.get("PATH"))
    if program is None:
        print(f"gym-concurrency-nemo-gym: {args[0]}: command not found", file=sys.stderr)
        return 127
    os.execve(program, args, env)
