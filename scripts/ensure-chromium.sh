#!/usr/bin/env bash
# The web console's browser tests (tests/browser) drive Debian's Chromium through Playwright's
# `executable_path` (no `playwright install`: nothing is downloaded from outside Debian).
# Installs Debian's `chromium` package when no `chromium` is on PATH.
set -euo pipefail

if command -v chromium >/dev/null 2>&1; then
    exit 0
fi
echo "ensure-chromium: no chromium found; installing Debian's chromium package" >&2
SUDO=()
if [ "$(id -u)" -ne 0 ]; then
    SUDO=(sudo -n)
fi
"${SUDO[@]}" apt-get update -qq
"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null
if ! command -v chromium >/dev/null 2>&1; then
    echo "ensure-chromium: chromium is still not on PATH after installing the chromium package" >&2
    exit 1
fi
