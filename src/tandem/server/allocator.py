"""Which memory allocator the broker runs with (`memory-allocator`, decision 0083).

Python's own allocator (pymalloc, the default) never hands back a 1 MiB arena while one object
in it lives, so a storm of a thousand connections that come and go leaves a tenth to a sixth of
the broker's idle memory resident (decision 0057); it does not grow from one storm to the next.
mimalloc, which takes Python's allocations too when `PYTHONMALLOC=malloc`, works in 64 KiB
pages and gives a storm's pages back once the broker asks it to (server/memory.py), for some
more CPU per message and about 12 % more memory per queued 1 KiB message (its size classes);
glibc's malloc gives them back too, for about 12 % more CPU. Hence the choice, made per broker.

An allocator is chosen before the interpreter starts (`PYTHONMALLOC`, `LD_PRELOAD`), so
`tandem run` replaces itself, once, with the same command in the environment the choice needs,
before it starts anything. A `PYTHONMALLOC` set by whoever started the broker wins over the
configuration (a debugging allocator, say) and is left alone.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
from typing import Literal

Allocator = Literal["python", "mimalloc", "malloc"]

MARKER = "TANDEM_ALLOCATOR"  # set for the replacement process: what it was started with
_ADDED = "TANDEM_ALLOCATOR_ADDED"  # and which of its variables were not there before


def find_mimalloc() -> str | None:
    """The mimalloc library's name for the dynamic loader (Linux only), else None."""
    if not sys.platform.startswith("linux"):
        return None
    return ctypes.util.find_library("mimalloc")


def check(wanted: Allocator) -> str:
    """`wanted`, if this machine has it. Raises ValueError for a mimalloc that is not installed."""
    if wanted == "mimalloc" and find_mimalloc() is None:
        raise ValueError(
            "memory-allocator: mimalloc is not installed (Debian: apt-get install libmimalloc2.0), or this is not Linux"
        )
    return wanted


def environment(allocator: str) -> dict[str, str]:
    """The variables a process needs to start with `allocator`."""
    if allocator == "python":
        return {}
    if allocator == "malloc":
        return {"PYTHONMALLOC": "malloc"}
    lib = find_mimalloc()
    assert lib is not None, "check() saw it"
    preload = os.environ.get("LD_PRELOAD", "")
    return {
        "PYTHONMALLOC": "malloc",  # Python's small objects too, not only the C extensions'
        "LD_PRELOAD": f"{lib} {preload}".strip(),
    }


_chosen: str | None = None  # what `start_with` found or chose in this process


def running() -> str:
    """The allocator this process runs with: what `tandem run` chose, or what the environment
    said ("python" when nothing did)."""
    if _chosen is not None:
        return _chosen
    mode = os.environ.get("PYTHONMALLOC", "")
    if mode.startswith("malloc"):
        return "mimalloc" if mimalloc_version() else "malloc"
    return "python" if not mode else f"python ({mode})"


def mimalloc_version() -> int:
    """The version of the mimalloc this process runs with (209: 2.0.9), 0 if it runs with another."""
    try:
        return int(ctypes.CDLL(None).mi_version())
    except (OSError, AttributeError):
        return 0


def start_with(wanted: Allocator) -> str:
    """Make this process run with `wanted`: replace it with the same command started
    in the environment the allocator needs (this call then does not return), unless it already
    runs with it or its starter set PYTHONMALLOC. Returns the allocator it runs with.

    The replacement takes the variables it was given for this out of its environment again at
    once: they did their work when it started, and children of the broker, if any, start with
    the environment the broker was given."""
    global _chosen
    chosen = os.environ.pop(MARKER, None)
    if chosen is not None:  # the replacement
        for key in os.environ.pop(_ADDED, "").split(","):
            if key:
                os.environ.pop(key, None)
        _chosen = chosen
        return chosen
    if "PYTHONMALLOC" in os.environ:
        _chosen = running()
        return _chosen
    allocator = check(wanted)
    if allocator == "python":
        _chosen = allocator
        return allocator
    extra = environment(allocator)
    added = [k for k in extra if k not in os.environ]
    env = {**os.environ, **extra, MARKER: allocator, _ADDED: ",".join(added)}
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, list(sys.orig_argv), env)
