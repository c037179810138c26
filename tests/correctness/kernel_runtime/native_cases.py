"""Helpers of the native-build tests: children that import this checkout, and folders a
child sees read-only."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import systems


def child(*args: str, prefix: tuple[str, ...] = (), env: dict | None = None,
          unset: tuple[str, ...] = (), **popen) -> subprocess.Popen:
    """`python *args` (after `prefix`, a command that execs the rest) importing this
    checkout, with pipes for its output; this process's environment with `env` added and
    the variables in `unset` removed."""
    src = str(Path(systems.__file__).parents[1])
    path = os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")]))
    environment = {key: value for key, value in {**os.environ, **(env or {})}.items()
                   if key not in unset}
    return subprocess.Popen([*prefix, sys.executable, *args], text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**environment, "PYTHONPATH": path}, **popen)


def output_of(*args: str, prefix: tuple[str, ...] = (), env: dict | None = None,
              unset: tuple[str, ...] = ()) -> list[str]:
    """The lines a child prints; the test fails when it does not end with status 0."""
    process = child(*args, prefix=prefix, env=env, unset=unset)
    out, err = process.communicate(timeout=600)
    assert process.returncode == 0, f"child ended with {process.returncode}: {err[-3000:]}"
    return out.splitlines()


def read_only_prefix(folder: Path) -> tuple[str, ...]:
    """How to run a child that sees `folder` read-only: permissions for a normal user, a
    read-only bind mount in a mount namespace for root (whom permissions do not stop)."""
    if os.geteuid() != 0:
        for path in (folder, *folder.rglob("*")):
            if path.is_dir():
                path.chmod(0o555)
        return ()
    prefix = ("unshare", "--mount", "sh", "-c",
              'mount --bind -o ro "$0" "$0" && exec "$@"', str(folder))
    probe = subprocess.run([*prefix, "sh", "-c", f'! touch "{folder}/probe"'],
                           capture_output=True, check=False)
    if probe.returncode != 0:
        pytest.skip("cannot make a folder read-only for root here (no mount namespace)")
    return prefix
