#!/usr/bin/env bash
# Corral and the peer harness's systems (asyncio, Celery + Redis, Ray core, DBOS) on W1 and W2
# in one pass, rounds interleaved so the machine's drift hits all alike (bench/README.md,
# "Corral in the peer benchmark").
#
#   bench/peers_one_pass.sh PEER_HARNESS_DIR [ROUNDS]
#
# The harness is copied to a temporary directory and set up there (its setup.sh: a venv with
# the peers, Debian's redis-server), so nothing is written where it lies. Its Redis runs on
# 127.0.0.1:6399 and is stopped by PID at the end; Ray and DBOS start and stop their own.
# Prints the harness's table of every run; the JSON lines stay in the copy (printed path).
set -euo pipefail
src="$(cd "${1:?usage: bench/peers_one_pass.sh PEER_HARNESS_DIR [ROUNDS]}" && pwd)"
rounds="${2:-3}"
main="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d "${TMPDIR:-/tmp}/corral-peers-XXXXXX")"
cp -r "$src"/. "$work"
cd "$work"
bash setup.sh >setup.log 2>&1 || { tail -5 setup.log >&2; exit 1; }
mkdir -p results logs data/redis
out="$work/results/one-pass.jsonl"
: >"$out"
redis-server --port 6399 --bind 127.0.0.1 --protected-mode yes --dir "$work/data/redis" \
  --appendonly yes --appendfsync everysec --save '' --logfile "$work/logs/redis.log" &
redis_pid=$!
trap 'kill "$redis_pid" 2>/dev/null; wait "$redis_pid" 2>/dev/null || true' EXIT
for _ in $(seq 50); do redis-cli -p 6399 ping >/dev/null 2>&1 && break; sleep 0.1; done
export BENCH_REDIS_URL=redis://127.0.0.1:6399
py="$work/.venv/bin/python"
for wl in w1 w2; do
  for round in $(seq "$rounds"); do
    echo "== $wl, round $round of $rounds" >&2
    "$py" peers/asyncio_bench.py --variant nostore --workload "$wl" --out "$out" </dev/null >>logs/asyncio.log 2>&1
    "$py" peers/celery_bench.py --workload "$wl" --out "$out" </dev/null >>logs/celery.log 2>&1 || echo "celery failed: logs/celery.log" >&2
    "$py" peers/ray_bench.py --workload "$wl" --out "$out" </dev/null >>logs/ray.log 2>&1 || echo "ray failed: logs/ray.log" >&2
    "$py" peers/dbos_bench.py --workload "$wl" --poll 0.01 --out "$out" </dev/null >>logs/dbos.log 2>&1 || echo "dbos failed: logs/dbos.log" >&2
    "$main/.venv/bin/python" "$main/bench/peer_corral.py" --peers "$work" --workload "$wl" \
      --repeat 1 --out "$work/results/corral.jsonl" </dev/null >>logs/corral.log 2>&1
    cat "$work/results/corral.jsonl" >>"$out"
  done
done
"$py" peers/table.py "$out"
echo "JSON lines: $out" >&2
