"""Instructions Redis executes per acquire+release pair, counted by valgrind's callgrind inside a
redis-server it starts (on a free 127.0.0.1 port, stopped at the end). Unlike CPU time on a shared machine,
the count moves by well under 1 % between runs, so a change to the scripts of a few percent shows.

    python3 scripts/bench/redis_instructions.py [BATCHES [SCRIPTS_DIR [OP]]]   # default 100, this tree's, g
    python3 scripts/bench/redis_instructions.py parts   # where a busy key's pair goes (below)
    python3 scripts/bench/redis_instructions.py costs   # what a lone admission's call pays for (below)

SCRIPTS_DIR and OP compare another version's scripts (`git worktree add /tmp/old COMMIT`, then
`.../redis_instructions.py 100 /tmp/old/crates/inflight/src/store/redis/scripts g`). Scripts with a
`manifest` are composed as it says and sent records (kind, flags, keys: `batch.lua`); older ones
(before the manifest) are composed as scripts.rs then did and sent OP letters ('g', or 'a' before 'g'
existed).

Each shape sends BATCHES pairs of calls of `batch.lua` (as the library sends them: generated ids, weight 1,
the default lease): one call of N admissions, then one of their N releases. Shapes: one key with a standing
lease (a busy key), a key per operation emptied between batches (many quiet keys), one pair per call (one
task); beside them the same calls to a script that only returns (what any script call costs Redis), and
the reference system's HLEN, HSET, HDEL (three commands per pair). Counts user space only (the kernel's
share is not counted). Standard library only; needs valgrind and redis-server.

`parts` counts the busy key again with one part left out at a time (the scripts edited for the count only:
without the admission's ZADD, without the release's HGET and ZREM), with the server's sorted sets kept as
skiplists (`zset-max-listpack-entries 0`) instead of listpacks, and one pair per call to the scripts' top
level alone (every function defined, nothing run), beside a script that only returns.

`costs` counts, per call of a script, what Lua itself costs Redis (making 30 functions with no upvalue, 30
that capture five of forty locals, 30 stored in a table; `string.format` of a microsecond count with
`%.0f` and with `%d`, ten each; each less a script that only returns), then one admission per call into an
emptied key (the one-pair shape's admission) with `batch.lua` cut short after each of its steps: its top
level, the clock, reading the key, recording the lease (the admission returns there; the script still
writes the key's token at its end), all of it but the token's write, all of it; then one pair per call
to the lone entry point (`lone.lua`), to its Redis commands alone, and to a script that only returns.
"""

import glob
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import uuid

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPTS = os.path.join(ROOT, "crates/inflight/src/store/redis/scripts")


class Redis:
    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.reader = self.sock.makefile("rb")

    def call(self, *args) -> object:
        out = [b"*%d\r\n" % len(args)]
        for arg in args:
            data = arg if isinstance(arg, bytes) else str(arg).encode()
            out.append(b"$%d\r\n%s\r\n" % (len(data), data))
        self.sock.sendall(b"".join(out))
        return self.read()

    def read(self) -> object:
        line = self.reader.readline()
        kind, rest = line[:1], line[1:-2]
        if kind == b"$":
            size = int(rest)
            return None if size < 0 else self.reader.read(size + 2)[:-2]
        if kind == b"*":
            return [self.read() for _ in range(int(rest))]
        if kind == b":":
            return int(rest)
        if kind == b"-":
            raise RuntimeError(rest.decode())
        return rest


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def main() -> None:
    parts = sys.argv[1:2] == ["parts"]
    costs = sys.argv[1:2] == ["costs"]
    batches = 100 if parts or costs or len(sys.argv) < 2 else int(sys.argv[1])
    scripts = sys.argv[2] if len(sys.argv) > 2 else SCRIPTS
    op = sys.argv[3] if len(sys.argv) > 3 else "g"
    out = tempfile.mkdtemp()
    port = free_port()
    server = subprocess.Popen(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}/cg.%p", "redis-server",
         "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(300):
            try:
                r = Redis(port)
                r.call("PING")
                break
            except OSError:
                time.sleep(0.1)
        else:
            raise SystemExit("redis-server under valgrind did not start")
        records = os.path.exists(f"{scripts}/manifest")
        entries = {}
        if records:
            for line in open(f"{scripts}/manifest").read().splitlines():
                if " = " in line:
                    name, files = line.split(" = ")
                    entries[name] = [open(f"{scripts}/{f}").read() for f in files.split(" ")]
            # The batch entry point's files (the manifest's), batch.lua last.
            common, batch_lua = "".join(entries["batch"][:-1]), entries["batch"][-1]
        else:
            common, batch_lua = open(f"{scripts}/common.lua").read(), open(f"{scripts}/batch.lua").read()
            # batch.lua follows queue.lua where the scripts have it (scripts.rs then), as the library loaded it.
            if os.path.exists(f"{scripts}/queue.lua"):
                common += open(f"{scripts}/queue.lua").read()
        batch = r.call("SCRIPT", "LOAD", common + batch_lua).decode()
        # A call of one record goes to the lone entry point first where the scripts have one (as the library
        # sends it), and to batch.lua when it answers nothing.
        lone = r.call("SCRIPT", "LOAD", "".join(entries["lone"])).decode() if "lone" in entries else None
        nothing = r.call("SCRIPT", "LOAD", "return 1").decode()

        def counted(work) -> int:
            """Instructions redis-server ran for work()."""
            subprocess.run(["callgrind_control", "-z", str(server.pid)], capture_output=True, check=True)
            work()
            subprocess.run(["callgrind_control", "-d", str(server.pid)], capture_output=True, check=True)
            newest = max(glob.glob(f"{out}/cg.*"), key=os.path.getmtime)
            return int(re.search(r"^summary: (\d+)", open(newest).read(), re.M).group(1))

        def shape(label: str, n: int, spread: bool, standing: bool, sha: str) -> None:
            r.call("FLUSHALL")
            keys = []
            for i in range(n if spread else 1):
                keys += [f"inflight:{{k{i}}}:leases", f"inflight:{{k{i}}}:permits", f"inflight:{{k{i}}}:limit"]

            def calls():
                ids = [b"\xff" + uuid.uuid4().bytes for _ in range(n)]
                admit, release = [0], [0]
                for i, id in enumerate(ids):
                    place = i + 1 if spread else 1
                    if records:
                        admit += ["a1", place, id, "1 30000 0 1000000 0"]
                        release += ["r0", place, id, 0]
                    else:
                        admit += [op, place, id, "1 30000 1000000 0", 0]
                        release += ["r", place, id, 0]
                return admit, release

            if standing:
                r.call("EVALSHA", batch, len(keys), *keys, *calls()[0])
            work = [calls() for _ in range(batches)]

            first = lone if n == 1 and sha == batch else None

            def call(args: list[object]) -> None:
                if first is None or r.call("EVALSHA", first, len(keys), *keys, *args) == []:
                    r.call("EVALSHA", sha, len(keys), *keys, *args)

            def run():
                for admit, release in work:
                    call(admit)
                    call(release)

            print(f"| {label} | {counted(run) / (batches * n):,.0f} |")

        def reference() -> None:
            r.call("FLUSHALL")

            def run():
                for _ in range(batches * 16):
                    request = str(uuid.uuid4())
                    r.call("HLEN", "active_requests")
                    r.call("HSET", "active_requests", request, "1")
                    r.call("HDEL", "active_requests", request)

            print(f"| the reference's HLEN, HSET, HDEL | {counted(run) / (batches * 16):,.0f} |")

        def edited(text: str, old: str, new: str) -> str:
            assert old in text, old
            return text.replace(old, new)

        if costs:
            def per_call(text: str, keys: list[str], args: list[object], n: int = 200) -> float:
                sha = r.call("SCRIPT", "LOAD", text).decode()
                r.call("FLUSHALL")
                calls = [[f(i) if callable(f) else f for f in args] for i in range(n)]
                return counted(lambda: [r.call("EVALSHA", sha, len(keys), *keys, *a) for a in calls]) / n

            bare = per_call("return 1", [], [])
            locals40 = "\n".join(f"local v{i} = {i}" for i in range(40))
            lua = [
                ("30 functions with no upvalue", "\n".join(f"local function f{i}(a, b) return a + b end" for i in range(30))),
                ("30 functions capturing five of forty locals", locals40 + "\n" + "\n".join(
                    f"local function f{i}(a) return a + v{i % 40} + v{(i + 7) % 40} + v{(i + 13) % 40}"
                    f" + v{(i + 21) % 40} + v{(i + 33) % 40} end" for i in range(30))),
                ("30 functions stored in a table", "local t = {}\n" + "\n".join(
                    f"t.f{i} = function(a, b) return a + b end" for i in range(30))),
                ("10 string.format('%.0f', us)", "local x = 1733570000123456 for i = 1, 10 do local s = string.format('%.0f', x + i) end"),
                ("10 string.format('%d', us)", "local x = 1733570000123456 for i = 1, 10 do local s = string.format('%d', x + i) end"),
            ]
            print("| in a script call | instructions in redis-server |")
            print("|---|---|")
            for label, body in lua:
                print(f"| {label} | {per_call(body + ' return 1', [], []) - bare:,.0f} |")
            keys = ["inflight:{k0}:leases", "inflight:{k0}:permits", "inflight:{k0}:limit"]
            admit = [0, "a1", 1, lambda i: b"\xff" + uuid.uuid4().bytes, "1 30000 0 1000000 0"]
            full = common + batch_lua
            cut = "do return {1} end\n"
            clock = "clock_ms, now, now_us = clock(ARGV[1])\n"
            steps = [
                ("its top level (and the call)", full.replace(clock, cut)),
                ("and the clock", edited(full, clock, clock + cut)),
                ("and reading the key", edited(full, "    local key = load(keys[i])\n",
                                               "    local key = load(keys[i])\n    " + cut)),
                ("and recording the lease (and, at the end, the token's write)", edited(full, "plain)\n  for i = 2, m do",
                                                   "plain)\n  " + cut + "  for i = 2, m do")),
                ("all but the token's write", edited(full, "write_tokens()\nreturn replies", "return replies")),
                ("all of it", full),
            ]
            print()
            print("| one admission per call into an emptied key, batch.lua through | instructions in redis-server |")
            print("|---|---|")
            for label, text in steps:
                print(f"| {label} | {per_call(text, keys, admit, 100):,.0f} |")
            if "lone" not in entries:
                return
            # What a lone pair's commands cost alone: the lone entry point's, with literal arguments.
            commands = """if ARGV[2] == 'a1' then
  redis.call('TIME') redis.call('HMGET', KEYS[2], '', '#', '\\254q') redis.call('ZCARD', KEYS[1])
  redis.call('GET', KEYS[3]) redis.call('ZADD', KEYS[1], 'NX', '1900000000000', ARGV[4])
  redis.call('PEXPIREAT', KEYS[1], '1900000000000') redis.call('HSET', KEYS[2], '#', '1765000000000000', '', '0')
  redis.call('PEXPIREAT', KEYS[2], '1900000000000')
  return {1, -1, 1000000, 1, 1, 0, 1, 0, 30000, 0, 1, 0}
end
redis.call('TIME') redis.call('ZSCORE', KEYS[1], ARGV[4]) redis.call('HMGET', KEYS[2], ARGV[4], '\\254q')
redis.call('ZREM', KEYS[1], ARGV[4])
return {1}"""

            def per_pair(text: str, n: int = 100) -> float:
                sha = r.call("SCRIPT", "LOAD", text).decode()
                r.call("FLUSHALL")
                ids = [b"\xff" + uuid.uuid4().bytes for _ in range(n)]

                def run():
                    for id in ids:
                        r.call("EVALSHA", sha, 3, *keys, 0, "a1", 1, id, "1 30000 0 1000000 0")
                        r.call("EVALSHA", sha, 3, *keys, 0, "r0", 1, id, 0)

                return counted(run) / n

            print()
            print("| one pair per call into an emptied key, the lone entry point | instructions in redis-server |")
            print("|---|---|")
            print(f"| lone.lua (the manifest's `lone`) | {per_pair(''.join(entries['lone'])):,.0f} |")
            print(f"| its Redis commands alone, literal arguments, no Lua around them | {per_pair(commands):,.0f} |")
            print(f"| a script that only returns | {per_pair('return {1}'):,.0f} |")
            return
        print("| per acquire+release pair | instructions in redis-server |")
        print("|---|---|")
        if parts:
            zadd = "redis.call('ZADD', key.leases, deadline, id) == 1"
            no_zadd = edited(common, zadd, "true") + batch_lua
            no_release = common + edited(
                edited(batch_lua, "local weight, _, own, found = meta(key, id, key.queued == nil)", "local weight, own, found = 1, 0, false"),
                "and redis.call('ZREM', key.leases, id) == 1 then", "then")
            top = batch_lua[: batch_lua.index("clock_ms, now, now_us = clock(ARGV[1])")] + "return 1"
            shape("one key, 16 pairs per call (a busy key)", 16, False, True, batch)
            shape("the same without the admission's ZADD", 16, False, True, r.call("SCRIPT", "LOAD", no_zadd).decode())
            shape("the same without the release's HGET and ZREM", 16, False, True,
                  r.call("SCRIPT", "LOAD", no_release).decode())
            r.call("CONFIG", "SET", "zset-max-listpack-entries", 0)
            shape("the busy key, its sorted set a skiplist", 16, False, True, batch)
            r.call("CONFIG", "SET", "zset-max-listpack-entries", 128)
            shape("one pair per call to the scripts' top level alone", 1, False, False,
                  r.call("SCRIPT", "LOAD", common + top).decode())
            shape("one pair per call to a script that only returns", 1, False, False, nothing)
            return
        shape("one key, 16 pairs per call (a busy key)", 16, False, True, batch)
        shape("a key per operation, 16 pairs per call (many quiet keys)", 16, True, False, batch)
        shape("one pair per call (one task)", 1, False, False, batch)
        shape("16 pairs per call to a script that only returns", 16, False, False, nothing)
        shape("one pair per call to a script that only returns", 1, False, False, nothing)
        reference()
    finally:
        server.terminate()
        server.wait(timeout=30)
        for f in glob.glob(f"{out}/cg.*"):
            os.remove(f)
        os.rmdir(out)


if __name__ == "__main__":
    main()
