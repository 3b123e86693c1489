#!/usr/bin/env bash
# The web console's browser tests (tests/browser) drive Debian's Chromium through Playwright's
# `executable_path` (no `playwright install`: nothing is downloaded from outside Debian).
# Installs Debian's `chromium` package when no `chromium` is on PATH.
set -euo pipefail

if command -v chromium >/dev/null 2>&1; then
    exit 0
fi
echo "ensure-chromium: no chromium found; installing Debian's chromium package" >&2
"$(dirname "$0")/apt-install.sh" chromium
if ! command -v chromium >/dev/null 2>&1; then
    echo "ensure-chromium: chromium is still not on PATH after installing the chromium package" >&2
    exit 1
fi
