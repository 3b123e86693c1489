"""A process that takes a node id's live lock and holds it, for kill and freeze tests.

    python tests/coordinator_holder.py HOSTS NODE_ID SESSION_MS

Prints `locked` once it holds the lock and `lost: <reason>` when its session is declared
lost. Reads commands from stdin: `claim N` tries claim_activation(N) and prints `claimed M`
or `refused <error>`; `sequence` prints the coordinated value. The test kills it (SIGKILL)
or freezes it (SIGSTOP/SIGCONT).
"""

from __future__ import annotations

import faulthandler
import logging
import signal
import sys
import threading

from tandem.errors import TandemError
from tandem.ha.coordinator import Coordinator

_out = threading.Lock()


def say(line: str) -> None:
    """One whole line at a time: the session-lost callback prints from a kazoo thread while the
    main thread answers a claim, and two print() calls can interleave (a line inside another)."""
    with _out:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def main() -> int:
    hosts, node_id, session_ms = sys.argv[1], sys.argv[2], int(sys.argv[3])
    # For a failing test's message: what happened (logs) and, on SIGUSR1, where every thread is.
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    coord = Coordinator(hosts, node_id, session_timeout=session_ms, connect_timeout=5000, holder="holder")
    coord.on_session_lost(lambda reason: say(f"lost: {reason}"))
    coord.start()
    if not coord.try_lock_live(timeout=10):
        say("not locked")
        return 1
    say("locked")
    for line in sys.stdin:
        words = line.split()
        try:
            if words[:1] == ["claim"]:
                say(f"claimed {coord.claim_activation(int(words[1]), lambda n: None)}")
            elif words[:1] == ["sequence"]:
                say(f"sequence {coord.activation_sequence()}")
        except TandemError as exc:
            say(f"refused {exc}")
        except Exception as exc:  # an untyped error is a bug: say so, so the test fails naming it
            say(f"untyped {type(exc).__name__}: {exc}")
    coord.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
