"""The HTTP management API (docs/management.md): a listener served from the broker's own event
loop; every request runs a management operation of server/admin.py, as the CLI's do."""
