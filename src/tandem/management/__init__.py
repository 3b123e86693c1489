"""The HTTP management listener: JSON API, /metrics, console (docs/management.md, docs/metrics.md)."""
