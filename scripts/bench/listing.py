"""Admission latency over HTTP while clients list the busy keys (issue 32), or one busy key's holders
(issue 41), against a running `inflight serve`.

    python3 scripts/bench/listing.py URL [--busy 5000] [--admitters 8] [--listers 64] [--duration 5]
                                         [--no-backoff] [--list keys|holders] [--holders 1000] [--same-key]

Holds one permit on each of --busy keys (a lease of ten minutes), then runs --admitters connections that
acquire and release a permit on keys of their own as fast as they can, timing each acquire: once alone
(idle), once beside --listers connections that ask `GET /v1/keys?limit=1000` as fast as they can, each
answer read whole; a lister refused (`429 too_many_listings`) waits the answer's `Retry-After`, as a client
should, or with --no-backoff asks again at once (then 64 clients asking in a loop load the server whatever
they ask, and that is measured too). The listers run in a process of their own, so that reading their
answers does not delay this one's timing. One JSON line per phase on stdout (the idle one also has the
median time of a listing alone). Plain HTTP/1.1 over kept-alive connections, standard library only.

With --list holders, the load is one key's holders instead: --holders permits (ten-minute leases, each
with a label) on the key `hot`, and each lister walks its listing, `GET /v1/keys/hot/permits` then
`?cursor=` until the cursor is null (about 100 holders a page); a listing is one whole walk, and a refused
page is asked again after its `Retry-After`. --busy keys are not filled then. With --same-key the
admitters acquire and release on `hot` itself (its limit raised to make room), beside its holders.
"""

import argparse
import asyncio
import json
import multiprocessing
import sys
import time
import urllib.parse

HOT = "hot"  # the key whose holders --list holders lists


async def connect(url):
    u = urllib.parse.urlsplit(url)
    return await asyncio.open_connection(u.hostname, u.port)


async def call(conn, method, path, body=b"", headers=None):
    """One request on a kept-alive connection: (status, body); the answer's headers go in `headers`."""
    reader, writer = conn
    head = f"{method} {path} HTTP/1.1\r\nHost: bench\r\nContent-Length: {len(body)}\r\n"
    if body:
        head += "Content-Type: application/json\r\n"
    writer.write(head.encode() + b"\r\n" + body)
    status_line = await reader.readline()
    length = 0
    while True:
        line = await reader.readline()
        if line in (b"\r\n", b""):
            break
        name, _, value = line.decode("latin-1").partition(":")
        name, value = name.strip().lower(), value.strip()
        if name == "content-length":
            length = int(value)
        if headers is not None:
            headers[name] = value
    data = await reader.readexactly(length) if length else b""
    return int(status_line.split()[1]), data


async def fill(url, busy, connections=32):
    """A permit held on each of `busy` keys."""
    body = json.dumps({"lease_ms": 600_000}).encode()

    async def one(first):
        conn = await connect(url)
        for n in range(first, busy, connections):
            status, data = await call(conn, "POST", f"/v1/keys/busy-{n}/permits", body)
            if status != 201:
                raise SystemExit(f"filling: {status} {data[:200]!r}")
        conn[1].close()

    await asyncio.gather(*(one(i) for i in range(connections)))


async def fill_holders(url, holders, room, connections=32):
    """`holders` permits on HOT, each labelled, under a limit with `room` to spare."""
    conn = await connect(url)
    limit = json.dumps({"limit": holders + room}).encode()
    status, data = await call(conn, "PUT", f"/v1/keys/{HOT}/limit", limit)
    if status != 200:
        raise SystemExit(f"limit: {status} {data[:200]!r}")
    conn[1].close()

    async def one(first):
        conn = await connect(url)
        for n in range(first, holders, connections):
            body = json.dumps({"lease_ms": 600_000, "holder": f"client-{n}"}).encode()
            status, data = await call(conn, "POST", f"/v1/keys/{HOT}/permits", body)
            if status != 201:
                raise SystemExit(f"filling: {status} {data[:200]!r}")
        conn[1].close()

    await asyncio.gather(*(one(i) for i in range(connections)))


async def walk(conn, backoff=True):
    """One listing of HOT's holders, page after page: (holders listed, pages, refusals)."""
    cursor, listed, pages, refused = None, 0, 0, 0
    while True:
        path = f"/v1/keys/{HOT}/permits"
        if cursor is not None:
            path += "?cursor=" + urllib.parse.quote(cursor, safe="")
        headers = {}
        status, data = await call(conn, "GET", path, headers=headers)
        if status == 429:
            refused += 1
            if backoff:
                await asyncio.sleep(float(headers.get("retry-after", 1)))
            continue
        if status != 200:
            raise SystemExit(f"listing holders: {status} {data[:200]!r}")
        page = json.loads(data)
        listed, pages = listed + len(page["holders"]), pages + 1
        cursor = page["cursor"]
        if cursor is None:
            return listed, pages, refused


async def admit(url, admitters, duration, key=None):
    """Closed-loop acquire + release on one key per admitter (or all on `key`); the acquires' latencies
    in ms."""
    latencies, deadline = [], time.monotonic() + duration

    async def one(i):
        conn = await connect(url)
        permits = f"/v1/keys/{key or f'probe-{i}'}/permits"
        while time.monotonic() < deadline:
            started = time.perf_counter()
            status, data = await call(conn, "POST", permits)
            latencies.append((time.perf_counter() - started) * 1000)
            if status != 201:
                raise SystemExit(f"admission: {status} {data[:200]!r}")
            permit = json.loads(data)
            status, _ = await call(conn, "DELETE", f"{permits}/{permit['id']}")
            if status != 204:
                raise SystemExit(f"release: {status}")
        conn[1].close()

    await asyncio.gather(*(one(i) for i in range(admitters)))
    return latencies


def list_forever(url, listers, counts, backoff, holders=False):
    """The listers' process: `listers` connections listing until killed; counts[0] answers 200,
    counts[1] answers 429, counts[2] the listings' summed ms (200 only). Of holders: counts[0] whole
    walks, counts[1] refused pages, counts[2] the walks' summed ms (refusals' waits included), counts[3]
    pages answered."""

    async def one_walking():
        conn = await connect(url)
        while True:
            started = time.perf_counter()
            _, pages, refused = await walk(conn, backoff)
            with counts.get_lock():
                counts[0] += 1
                counts[1] += refused
                counts[2] += (time.perf_counter() - started) * 1000
                counts[3] += pages

    async def one():
        if holders:
            return await one_walking()
        conn = await connect(url)
        while True:
            started, headers = time.perf_counter(), {}
            status, _ = await call(conn, "GET", "/v1/keys?limit=1000", headers=headers)
            if status == 429 and backoff:
                await asyncio.sleep(float(headers.get("retry-after", 1)))
            with counts.get_lock():
                if status == 200:
                    counts[0] += 1
                    counts[2] += (time.perf_counter() - started) * 1000
                elif status == 429:
                    counts[1] += 1
                else:
                    raise SystemExit(f"listing: {status}")

    async def all_of_them():
        await asyncio.gather(*(one() for _ in range(listers)))

    asyncio.run(all_of_them())


async def list_alone(url, times=5, holders=None):
    """The median time of one listing with no other running, in ms (of holders: a whole walk, which
    must list at least `holders`)."""
    conn, took = await connect(url), []
    for _ in range(times):
        started = time.perf_counter()
        if holders is not None:
            listed, _, _ = await walk(conn)
            if listed < holders:
                raise SystemExit(f"listed {listed} of {holders} holders")
        else:
            status, _ = await call(conn, "GET", "/v1/keys?limit=1000")
            if status != 200:
                raise SystemExit(f"listing: {status}")
        took.append((time.perf_counter() - started) * 1000)
    conn[1].close()
    return round(sorted(took)[len(took) // 2], 2)


def pct(values, p):
    values = sorted(values)
    return round(values[min(int(len(values) * p), len(values) - 1)], 3) if values else None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("url")
    ap.add_argument("--busy", type=int, default=5000)
    ap.add_argument("--admitters", type=int, default=8)
    ap.add_argument("--listers", type=int, default=64)
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument("--label", default="")
    ap.add_argument("--no-backoff", action="store_true", help="listers refused ask again at once")
    ap.add_argument("--list", choices=["keys", "holders"], default="keys",
                    help="what the listers list: the busy keys, or the holders of one key")
    ap.add_argument("--holders", type=int, default=1000, help="with --list holders: the key's holders")
    ap.add_argument("--same-key", action="store_true", help="with --list holders: admit on the listed key")
    args = ap.parse_args()
    holders = args.list == "holders"
    if holders:
        asyncio.run(fill_holders(args.url, args.holders, args.admitters))
        load = {"holders": args.holders, "admitted_on": HOT if args.same_key else "own keys"}
    else:
        asyncio.run(fill(args.url, args.busy))
        load = {"busy_keys": args.busy}
    key = HOT if holders and args.same_key else None

    def report(phase, latencies, **extra):
        line = {"label": args.label, "phase": phase, **load, "admitters": args.admitters,
                "admissions": len(latencies), "p50_ms": pct(latencies, 0.5), "p99_ms": pct(latencies, 0.99)}
        line.update(extra)
        print(json.dumps(line), flush=True)

    alone = asyncio.run(list_alone(args.url, holders=args.holders if holders else None))
    report("idle", asyncio.run(admit(args.url, args.admitters, args.duration, key)), listing_alone_ms=alone)
    counts = multiprocessing.Array("d", 4)
    listers = multiprocessing.Process(target=list_forever, daemon=True,
                                      args=(args.url, args.listers, counts, not args.no_backoff, holders))
    listers.start()
    time.sleep(1.0)  # every lister connected and asking
    with counts.get_lock():
        before = list(counts)
    latencies = asyncio.run(admit(args.url, args.admitters, args.duration, key))
    with counts.get_lock():
        after = list(counts)
    listers.terminate()
    listers.join()
    ok, refused = after[0] - before[0], after[1] - before[1]
    extra = {}
    if holders:
        extra["pages_per_s"] = round((after[3] - before[3]) / args.duration, 1)
    report("listers", latencies, listers=args.listers, backoff=not args.no_backoff,
           listings_per_s=round(ok / args.duration, 1), refused_per_s=round(refused / args.duration, 1),
           listing_mean_ms=round((after[2] - before[2]) / ok, 2) if ok else None, **extra)


if __name__ == "__main__":
    sys.exit(main())
