"""The entrypoint of a Ray job Corral submitted: the job's environment from a private file.

    python -m corral.workers.rayentry --env-file <attempt dir>/ray-env.json --cwd DIR -- cmd …

Ray returns a job's `runtime_env` variables in clear from its job API, so Corral never puts the
job's environment there. The file (mode 0600, written by the attempt's local watcher) is read
and deleted here before the command starts; the command then replaces this process, so its exit
code is the driver's.
"""

from __future__ import annotations

import argparse
import json
import os
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="corral-rayentry")
    parser.add_argument("--env-file", required=True)
    parser.add_argument("--cwd")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command to run")
    env = dict(os.environ)
    try:
        with open(args.env_file, encoding="utf-8") as f:
            env.update({str(k): str(v) for k, v in json.load(f).items()})
        os.unlink(args.env_file)
    except FileNotFoundError:
        pass  # started again for the same attempt: the first start used it
    if args.cwd and os.path.isdir(args.cwd):
        os.chdir(args.cwd)
    sys.stdout.flush()
    try:
        os.execvpe(command[0], command, env)
    except OSError as err:
        print(f"corral-rayentry: cannot start {command[0]}: {err.strerror}", file=sys.stderr)
        return 127


if __name__ == "__main__":
    sys.exit(main())
