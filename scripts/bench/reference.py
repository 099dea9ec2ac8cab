"""The reference system's Redis traffic: each request HLEN (the count), HSET (enter), HDEL (exit), one
command at a time, from PROCS processes at once (Dify's synchronous workers). Prints one JSON line as
`inflight bench` does: pairs/s and Redis's own CPU per pair (INFO cpu, user + system, around the run).
With `ping`, each "pair" is one PING instead: what one round trip costs Redis at that concurrency.

    python3 scripts/bench/reference.py PORT SECONDS PROCS [ping]

Standard library only (RESP over a socket), against 127.0.0.1.
"""

import json
import multiprocessing
import socket
import sys
import time
import uuid


def command(sock: socket.socket, reader, *args: str) -> bytes:
    out = [f"*{len(args)}\r\n".encode()]
    for arg in args:
        data = arg.encode()
        out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    sock.sendall(b"".join(out))
    line = reader.readline()
    if line[:1] == b"$":
        size = int(line[1:])
        return reader.read(size + 2)[:-2] if size >= 0 else b""
    return line


def worker(port: int, seconds: float, ping: bool, counts) -> None:
    sock = socket.create_connection(("127.0.0.1", port))
    reader = sock.makefile("rb")
    key = "reference:{app}:active_requests"
    pairs, deadline = 0, time.monotonic() + seconds
    while time.monotonic() < deadline:
        if ping:
            command(sock, reader, "PING")
            pairs += 1
            continue
        request = str(uuid.uuid4())
        command(sock, reader, "HLEN", key)
        command(sock, reader, "HSET", key, request, str(time.time()))
        command(sock, reader, "HDEL", key, request)
        pairs += 1
    counts.put(pairs)


def redis_cpu(port: int) -> float:
    sock = socket.create_connection(("127.0.0.1", port))
    text = command(sock, sock.makefile("rb"), "INFO", "cpu").decode()
    sock.close()
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    return float(fields["used_cpu_sys"]) + float(fields["used_cpu_user"])


def main() -> None:
    port, seconds, procs = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
    ping = sys.argv[4:] == ["ping"]
    counts: multiprocessing.Queue = multiprocessing.Queue()
    workers = [multiprocessing.Process(target=worker, args=(port, seconds, ping, counts)) for _ in range(procs)]
    before, started = redis_cpu(port), time.monotonic()
    for w in workers:
        w.start()
    pairs = sum(counts.get(timeout=seconds + 30) for _ in workers)
    for w in workers:
        w.join(timeout=30)
    elapsed, after = time.monotonic() - started, redis_cpu(port)
    print(
        json.dumps(
            {
                "store": "ping" if ping else "reference",
                "tasks": procs,
                "keys": 1,
                "pairs_per_sec": pairs / elapsed,
                "redis_cpu_us_per_pair": (after - before) * 1e6 / pairs,
            }
        )
    )


if __name__ == "__main__":
    main()
