#!/usr/bin/env bash
# Interleaved A/B throughput runs: two brokers side by side, runs alternating A, B, A, B...
#
# On a small, noisy machine the same code measures a quarter apart from one run to the next;
# alternating two brokers in the same minutes is the fair way to tell two versions apart.
#
#   bench/ab.sh stomp|native ROUNDS COUNT
#
# Environment:
#   SRC_A, SRC_B    source trees (their src/ directories) for the two brokers; default: this
#                   checkout for both. E.g. `git archive HEAD~3 src | tar -x -C /tmp/old`
#                   then SRC_A=/tmp/old/src.
#   TOML_A, TOML_B  extra broker.toml lines for each (e.g. 'journal-buffer-timeout = 0')
#   ENV_A, ENV_B    environment assignments for each broker process (e.g. 'PYTHONMALLOC=malloc')
#   PAIR_ARGS       extra `tandem perf pair` options for native runs (e.g. '--producers 4 --consumers 4')
#
# Prints one line per run: broker, msgs/s, p99 ms. The clients are this checkout's
# (`tandem perf pair` over the native protocol, bench/drivers/stomp.py over STOMP).
set -euo pipefail
MODE=${1:-stomp}
ROUNDS=${2:-5}
COUNT=${3:-60000}
HERE=$(cd "$(dirname "$0")/.." && pwd)
PY=$HERE/.venv/bin/python
WORK=$(mktemp -d)
PIDS=()
trap 'kill "${PIDS[@]}" 2>/dev/null || true; rm -rf "$WORK"' EXIT

start() { # name src native-port stomp-port extra-toml env
  mkdir -p "$WORK/$1"
  printf 'data-directory = "%s/%s/data"\n%b\n[[acceptors]]\nname = "native"\nbind = "127.0.0.1:%s"\n[[acceptors]]\nname = "stomp"\nprotocol = "stomp"\nbind = "127.0.0.1:%s"\n' \
    "$WORK" "$1" "$5" "$3" "$4" > "$WORK/$1/broker.toml"
  env ${6:-} PYTHONPATH=$2 "$PY" -m tandem run --quiet --config "$WORK/$1/broker.toml" > "$WORK/$1/log" 2>&1 &
  PIDS+=($!)
}

report() { # name
  "$PY" -c "import json, sys; d = json.loads(sys.stdin.read().strip().splitlines()[-1]); print('$1', d['msgs_per_s'], d['latency_ms']['p99'])"
}

run() { # name native-port stomp-port
  if [ "$MODE" = stomp ]; then
    "$PY" "$HERE/bench/drivers/stomp.py" --host 127.0.0.1 --port "$3" --producers 1 --consumers 1 \
      --count "$COUNT" --size 1024 --window 256 --json 2>/dev/null | report "$1"
  else
    # shellcheck disable=SC2086
    "$PY" -m tandem perf pair --url "tcp://127.0.0.1:$2" --count "$COUNT" --no-progress --json ${PAIR_ARGS:-} | report "$1"
  fi
}

start A "${SRC_A:-$HERE/src}" 61901 61911 "${TOML_A:-}" "${ENV_A:-}"
start B "${SRC_B:-$HERE/src}" 61902 61912 "${TOML_B:-}" "${ENV_B:-}"
sleep 3
for _ in $(seq "$ROUNDS"); do
  run A 61901 61911
  run B 61902 61912
done
