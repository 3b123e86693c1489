"""The total-queue check of a chaos history: what went in must come out, once.

After the faults are healed and the queue drained, every value is classified (Jepsen's
`total-queue` idea, with acknowledgements added so that exactly-once can be judged too):

- lost: confirmed (``ok``) and never consumed: never delivered, or delivered only to consumers
  whose acknowledgement was refused (a rolled-back consumer transaction, a stale ack) and never
  delivered again;
- duplicated: acknowledged more than once with a confirmed acknowledgement (a commit that
  went through, an awaited ack). With duplicate detection and transactions this never happens;
- unexpected: delivered but never attempted, or delivered although its send definitely failed
  (a rolled-back transaction: an aborted read);
- recovered: outcome unknown (``info``, never ``ok``) and delivered: it was applied after all.

Informational: ``retried`` (values sent more than once: after an unknown outcome, under the
same id in exactly-once mode, without one in at-least-once mode), ``redelivered`` (delivered
more than once: an auto-acknowledged message handed out just before a failover comes again, as
does one of a transaction rolled back), and ``unknown_not_delivered`` (outcome unknown, never
delivered: it was not applied).

In ``exactly-once`` mode a run is valid when lost, duplicated and unexpected are all 0; in
``at-least-once`` mode (no duplicate detection, no transactions) duplicates are expected and
reported, and only lost and unexpected count.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

MODES = ("exactly-once", "at-least-once")
SAMPLE = 20  # values listed per category in the verdict


def check(events: Iterable[dict[str, Any]], mode: str = "exactly-once") -> dict[str, Any]:
    """The verdict of a history (see the module's docstring) as a JSON-ready dict."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
    attempted: set[str] = set()
    attempts: Counter[str] = Counter()
    confirmed: set[str] = set()
    unknown: set[str] = set()
    failed: set[str] = set()
    deliveries: Counter[str] = Counter()
    auto: set[str] = set()  # delivered to an auto-acknowledging consumer: consumed as it was handed over
    ack_unknown: set[str] = set()
    acks: Counter[str] = Counter()
    faults: Counter[str] = Counter()
    fault_log: list[dict[str, Any]] = []
    healed = 0
    latencies: list[float] = []
    for e in events:
        ev = e["ev"]
        vs = e.get("vs", ())
        if ev == "attempt":
            attempted.update(vs)
            attempts.update(vs)
        elif ev == "ok":
            confirmed.update(vs)
            if "lat" in e:
                latencies.append(float(e["lat"]))
        elif ev == "info":
            unknown.update(vs)
        elif ev == "fail":
            failed.update(vs)
        elif ev == "deliver":
            deliveries.update(vs)
            if e.get("ack") == "auto":
                auto.update(vs)
        elif ev == "ack-info":
            ack_unknown.update(vs)
        elif ev == "ack":
            acks.update(vs)
        elif ev == "fault":
            faults[e.get("kind", "?")] += 1
            fault_log.append({"t": e["t"], "kind": e.get("kind", "?"), "target": e.get("target")})
        elif ev == "healed":
            healed += 1
            if fault_log:
                fault_log[-1].update(lasted=e.get("lasted"), heal_s=e.get("took"), active=e.get("active"))
    unknown -= confirmed
    failed -= confirmed | unknown  # a later attempt of the same value may have gone through
    delivered = set(deliveries)
    # Consumed: acknowledged (confirmed or maybe), or handed to an auto-acknowledging consumer. A
    # delivery whose acknowledgement was refused (rolled back, stale) must come again: if it
    # never does, the message is lost all the same.
    consumed = set(acks) | auto | ack_unknown
    lost = confirmed - consumed
    duplicated = {v for v, n in acks.items() if n > 1}
    # A copy explains a duplicate only if the value was sent twice; otherwise the broker delivered
    # again a message whose acknowledgement it had confirmed.
    unexplained = {v for v in duplicated if attempts[v] < 2}
    never_sent = delivered - attempted
    aborted = delivered & failed
    recovered = unknown & delivered
    latencies.sort()

    def pct(q: float) -> float | None:
        return round(latencies[min(len(latencies) - 1, int(q * len(latencies)))], 4) if latencies else None

    counted = [lost, never_sent, aborted] + ([duplicated] if mode == "exactly-once" else [])
    verdict: dict[str, Any] = {
        "valid": not any(counted),
        "mode": mode,
        "attempted": len(attempted),
        "confirmed": len(confirmed),
        "unknown": len(unknown),
        "failed": len(failed),
        "retried": sum(1 for n in attempts.values() if n > 1),
        "delivered": len(delivered),
        "never_delivered": len(confirmed - delivered),
        "deliveries": sum(deliveries.values()),
        "acknowledged": len(acks),
        "lost": len(lost),
        "duplicated": len(duplicated),
        "duplicated_not_sent_twice": len(unexplained),
        "unexpected": len(never_sent) + len(aborted),
        "recovered": len(recovered),
        "redelivered": sum(1 for n in deliveries.values() if n > 1),
        "unknown_not_delivered": len(unknown - delivered),
        "aborted_reads": len(aborted),
        "faults": sum(faults.values()),
        "healed": healed,
        "fault_kinds": dict(sorted(faults.items())),
        "fault_log": fault_log,
        "send_latency_s": {"p50": pct(0.5), "p99": pct(0.99), "max": latencies[-1] if latencies else None},
        "samples": {
            "lost": sorted(lost)[:SAMPLE],
            "duplicated": sorted(duplicated)[:SAMPLE],
            "unexpected": sorted(never_sent | aborted)[:SAMPLE],
            "recovered": sorted(recovered)[:SAMPLE],
        },
    }
    return verdict


def summary(verdict: dict[str, Any]) -> str:
    """One screen for a person: the counts, the faults, and what failed."""
    v = verdict
    ok = "PASS" if v["valid"] else "FAIL"
    dup_note = "" if v["mode"] == "exactly-once" else " (expected in at-least-once mode)"
    lines = [
        f"chaos verdict: {ok} ({v['mode']}"
        + (f", {v['pair']} pair" if "pair" in v else "")
        + (f", {v['store']} store" if v.get("store", "plain") != "plain" else "")
        + ")",
        f"  sends      attempted {v['attempted']}, confirmed {v['confirmed']}, unknown {v['unknown']}, "
        f"failed {v['failed']}, sent again {v['retried']}",
        f"  consumed   delivered {v['delivered']} ({v['deliveries']} deliveries), acknowledged {v['acknowledged']}",
        f"  lost       {v['lost']}",
        f"  duplicated {v['duplicated']}{dup_note}"
        + (f", {v['duplicated_not_sent_twice']} of them sent once" if v["duplicated"] else ""),
        f"  unexpected {v['unexpected']} (aborted reads {v['aborted_reads']})",
        f"  recovered  {v['recovered']}  (unknown and not delivered: {v['unknown_not_delivered']})",
        f"  redelivered {v['redelivered']} (delivered more than once, acknowledged once at most)",
        f"  faults     {v['faults']} ({', '.join(f'{k} {n}' for k, n in v['fault_kinds'].items()) or 'none'}), "
        f"healed {v['healed']}",
    ]
    lat = v.get("send_latency_s") or {}
    if lat.get("p50") is not None:
        lines.append(f"  send latency p50 {lat['p50']} s, p99 {lat['p99']} s, max {lat['max']} s")
    if v.get("unhealed") or v.get("interventions"):
        lines.append(
            f"  heals: {v.get('unhealed', 0)} failed, {v.get('interventions', 0)} needed the primary restarted "
            "(no server would serve by itself)"
        )
    if v.get("late_disk_stops"):
        lines.append(f"  late stops {v['late_disk_stops']} (disk faults the struck server outlived by 15 s)")
    st = v.get("store_pressure")
    if st:
        lines.append("  store      " + ", ".join(f"{k} {n}" for k, n in st.items()))
    if "left_in_queue" in v:
        lines.append(f"  left in the queue after the drain: {v['left_in_queue']}")
    for k in ("lost", "duplicated", "unexpected"):
        if v["samples"][k]:
            lines.append(f"  {k}: {', '.join(v['samples'][k][:8])}")
    return "\n".join(lines)
