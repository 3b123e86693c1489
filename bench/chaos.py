"""Acceptance runs of the chaos suite: `tandem chaos` on both kinds of pair, one after the other.

    python bench/chaos.py --faults 50 --seconds 150 --seed 1

Each run's verdict (JSON), summary and plot are copied to bench/results/chaos/ as
`<pair>-<mode>-seed<K>.{json,txt,png}`, and `summary.json` there totals the runs made: faults,
confirmed values, lost, duplicated, unexpected. The full histories and server logs stay in
`--work` (a temp dir by default). Exit status 0 only when every run passed.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results" / "chaos"
KEPT = ("command", "valid", "faults", "confirmed", "lost", "duplicated", "unexpected", "recovered", "redelivered")
KEPT += ("interventions", "unhealed", "elapsed_s", "fault_kinds", "unknown", "store", "store_pressure")


def name_of(pair: str, mode: str, store: str, seed: object) -> str:
    """A run's file name: `<pair>-<mode>[-<store>]-seed<K>` (a plain run's name as before --store)."""
    return f"{pair}-{mode}{'' if store in ('plain', None) else '-' + str(store)}-seed{seed}"


def run(pair: str, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    out = work / name_of(pair, args.mode, args.store, args.seed)
    cmd = [sys.executable, "-m", "tandem", "chaos", "--pair", pair, "--faults", str(args.faults)]
    cmd += ["--seconds", str(args.seconds), "--seed", str(args.seed), "--mode", args.mode]
    if args.store != "plain":
        cmd += ["--store", args.store]
    cmd += ["--out", str(out)]
    print("$", " ".join(["tandem", *cmd[3:]]), flush=True)
    t0 = time.monotonic()
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, timeout=args.timeout)
    lines = proc.stdout.strip().splitlines()
    verdict: dict[str, Any] = json.loads(lines[-1]) if lines else {"valid": False}
    verdict["exit_status"] = proc.returncode
    verdict["command"] = " ".join(["tandem", *cmd[3:-2]])
    verdict["wall_s"] = round(time.monotonic() - t0, 1)
    name = out.name
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(verdict, indent=2) + "\n")
    if (out / "summary.txt").exists():
        shutil.copy(out / "summary.txt", RESULTS / f"{name}.txt")
    if (out / "chaos.png").exists():
        shutil.copy(out / "chaos.png", RESULTS / f"{name}.png")
    print("\n".join(lines[:-1]), flush=True)
    return verdict


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", default="replication,shared-store")
    ap.add_argument("--faults", type=int, default=50)
    ap.add_argument("--seconds", type=float, default=150.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--mode", default="exactly-once", choices=("exactly-once", "at-least-once"))
    ap.add_argument("--store", default="plain", choices=("plain", "paging", "large", "paging-large"))
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per run")
    ap.add_argument("--work", type=Path, default=None, help="histories and logs (default: a temp dir)")
    args = ap.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="tandem-chaos-bench-"))
    verdicts = [run(pair, args, work) for pair in args.pairs.split(",")]
    index = RESULTS / "summary.json"
    runs: dict[str, Any] = json.loads(index.read_text())["runs"] if index.exists() else {}
    for v in verdicts:
        runs[name_of(str(v.get("pair")), str(v.get("mode")), str(v.get("store", "plain")), v.get("seed"))] = {
            k: v.get(k) for k in KEPT
        }
    totals = {
        k: sum(int(r.get(k) or 0) for r in runs.values())
        for k in ("faults", "confirmed", "lost", "duplicated", "unexpected", "recovered", "interventions")
    }
    index.write_text(json.dumps({"totals": totals, "runs": runs}, indent=2) + "\n")
    print(f"histories and logs in {work}; totals over {len(runs)} runs in {index}: {totals}")
    return 0 if all(v.get("valid") for v in verdicts) else 1


if __name__ == "__main__":
    raise SystemExit(main())
