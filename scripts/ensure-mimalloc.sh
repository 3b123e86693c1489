#!/usr/bin/env bash
# `memory-allocator = "mimalloc"` (decision 0083) preloads Debian's `libmimalloc2.0`; the leak test
# and the allocator's tests run brokers with it. Installs the package when the library is missing.
set -euo pipefail

have_mimalloc() {
    ldconfig -p 2>/dev/null | grep -q 'libmimalloc\.so'
}

if have_mimalloc; then
    exit 0
fi
echo "ensure-mimalloc: no libmimalloc in the loader's cache; installing Debian's libmimalloc2.0 package" >&2
"$(dirname "$0")/apt-install.sh" libmimalloc2.0
if ! have_mimalloc; then
    echo "ensure-mimalloc: still no libmimalloc after installing libmimalloc2.0" >&2
    exit 1
fi
