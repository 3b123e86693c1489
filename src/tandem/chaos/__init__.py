"""A Jepsen-style chaos suite on one machine: `tandem chaos` and tests/chaos (docs/chaos.md).

topology (the pair and its proxies), workload (the clients), faults (the nemesis), history
(what happened), checker (what it means), plot (a picture), run (all of it, and the command).
"""
