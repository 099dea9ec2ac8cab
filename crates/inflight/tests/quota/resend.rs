//! A funding re-sent applies once, by its idempotency key: on every store, the same funding under one
//! key twice (what a re-send is), and on a real Redis Cluster reached through a TCP relay that drops the
//! connection after Redis ran the top-up and before its answer reaches the client, whose re-send must not
//! credit it again (issue 28, item 4).
//!
//! The cluster is one primary serving every slot that announces the relay's port as its own, so the
//! cluster client (and its reconnection) goes through the relay.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use inflight::quota::{
    Balance, Fund, Funding, IdempotencyKey, Quota, QuotaError, FUNDING_MEMORY,
    GENERATED_FUNDING_MEMORY, MAX_BALANCE, MAX_REMEMBERED_FUNDINGS,
};
use inflight::{QuotaStore, RedisStore};
use test_support::procs::{self, Nodes};

use crate::Fixture;

fn applied(balance: u64, reserved: u64) -> Funding {
    Funding::Applied(Balance {
        balance,
        reserved,
        expired: 0,
    })
}

fn repeated(balance: u64, reserved: u64) -> Funding {
    Funding::Repeated(Balance {
        balance,
        reserved,
        expired: 0,
    })
}

/// A funding under one idempotency key applies once, answered as the first time; another funding under
/// it changes nothing; a key is forgotten once its memory passes (a given one's, a generated one's).
pub async fn a_funding_applies_once_per_idempotency_key<F: Fixture>(f: F) {
    let quota = f.quota();
    let key = "tenant:t1";
    let payment = IdempotencyKey::from("payment-1");
    quota.fund(key, Fund::Set(100)).await.unwrap();
    let held = quota.reserve(key, 10).await.unwrap();
    let first = quota.fund_with(key, Fund::Add(50), &payment).await;
    assert_eq!(first.unwrap(), applied(140, 10));
    let again = quota.fund_with(key, Fund::Add(50), &payment).await;
    assert_eq!(again.unwrap(), repeated(140, 10), "the re-send: once");
    let other = IdempotencyKey::from("payment-2");
    let second = quota.fund_with(key, Fund::Add(50), &other).await;
    assert_eq!(second.unwrap(), applied(190, 10), "another key: again");
    held.commit().await.unwrap();
    let again = quota.fund_with(key, Fund::Add(50), &payment).await;
    assert_eq!(
        again.unwrap(),
        repeated(140, 10),
        "answered as the first time, not as now"
    );
    for reused in [Fund::Add(51), Fund::Set(50)] {
        let answer = quota.fund_with(key, reused, &payment).await;
        assert_eq!(answer.unwrap(), Funding::KeyReused, "{reused:?}");
    }
    assert_eq!(quota.balance(key).await.unwrap().unwrap().balance, 190);

    // A set re-sent after a top-up made meanwhile does not undo the top-up.
    let set = IdempotencyKey::from("set-1");
    assert_eq!(
        quota.fund_with(key, Fund::Set(5), &set).await.unwrap(),
        applied(5, 0)
    );
    quota.fund(key, Fund::Add(1)).await.unwrap();
    assert_eq!(
        quota.fund_with(key, Fund::Set(5), &set).await.unwrap(),
        repeated(5, 0)
    );
    assert_eq!(quota.balance(key).await.unwrap().unwrap().balance, 6);

    // A refused funding is not remembered: the same key may apply once it fits.
    let big = IdempotencyKey::from("big");
    let refused = quota.fund_with(key, Fund::Add(MAX_BALANCE), &big).await;
    assert!(matches!(refused, Err(QuotaError::Store(_))), "{refused:?}");
    quota.fund(key, Fund::Set(0)).await.unwrap();
    let fits = quota.fund_with(key, Fund::Add(MAX_BALANCE), &big).await;
    assert_eq!(fits.unwrap(), applied(MAX_BALANCE, 0));
    quota.fund(key, Fund::Set(0)).await.unwrap();

    let empty = quota
        .fund_with(key, Fund::Add(1), &IdempotencyKey::from(""))
        .await;
    assert!(matches!(empty, Err(QuotaError::Invalid(_))), "{empty:?}");

    // Forgotten once their memory passes: a generated key after minutes, a given one after a day.
    let generated = IdempotencyKey::generate();
    let funded = quota.fund_with(key, Fund::Add(1), &generated).await;
    assert_eq!(funded.unwrap(), applied(1, 0));
    f.advance(GENERATED_FUNDING_MEMORY);
    let funded = quota.fund_with(key, Fund::Add(1), &generated).await;
    assert_eq!(funded.unwrap(), applied(2, 0), "forgotten");
    let funded = quota.fund_with(key, Fund::Add(1), &big).await;
    assert_eq!(funded.unwrap(), Funding::KeyReused, "still remembered");
    f.advance(FUNDING_MEMORY);
    let funded = quota.fund_with(key, Fund::Add(1), &big).await;
    assert_eq!(funded.unwrap(), applied(3, 0), "forgotten");
}

/// Forwards 127.0.0.1:`port` to a Redis; armed with a pattern, it cuts the connection that carries a
/// command containing it as soon as Redis answers that command, without passing the answer on.
struct Relay {
    port: u16,
    armed: Arc<Mutex<Option<Vec<u8>>>>,
    cut: Arc<AtomicUsize>,
}

impl Relay {
    fn start(listener: TcpListener, target: u16) -> Self {
        let port = listener.local_addr().unwrap().port();
        let armed = Arc::new(Mutex::new(None::<Vec<u8>>));
        let cut = Arc::new(AtomicUsize::new(0));
        let (arm, cuts) = (armed.clone(), cut.clone());
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                let Ok(server) = TcpStream::connect(("127.0.0.1", target)) else {
                    continue;
                };
                let _ = (client.set_nodelay(true), server.set_nodelay(true));
                pipe(client, server, arm.clone(), cuts.clone());
            }
        });
        Self { port, armed, cut }
    }

    /// Cuts the next connection whose command contains `pattern`, once, after Redis answered it.
    fn arm(&self, pattern: &[u8]) {
        *self.armed.lock().unwrap() = Some(pattern.to_vec());
    }

    /// How many connections were cut.
    fn cuts(&self) -> usize {
        self.cut.load(Ordering::SeqCst)
    }
}

/// The two directions of one relayed connection.
fn pipe(
    client: TcpStream,
    server: TcpStream,
    armed: Arc<Mutex<Option<Vec<u8>>>>,
    cuts: Arc<AtomicUsize>,
) {
    let doomed = Arc::new(AtomicBool::new(false));
    let (mut from_client, mut to_server) =
        (client.try_clone().unwrap(), server.try_clone().unwrap());
    let marked = doomed.clone();
    std::thread::spawn(move || {
        let mut buf = [0u8; 16 * 1024];
        while let Ok(n @ 1..) = from_client.read(&mut buf) {
            let mut armed = armed.lock().unwrap();
            let hit = armed
                .as_ref()
                .is_some_and(|p| buf[..n].windows(p.len()).any(|w| w == p.as_slice()));
            if hit {
                // Marked before the command goes on: the next bytes Redis sends here answer it.
                *armed = None;
                marked.store(true, Ordering::SeqCst);
            }
            drop(armed);
            if to_server.write_all(&buf[..n]).is_err() {
                break;
            }
        }
        let _ = to_server.shutdown(Shutdown::Both);
    });
    let (mut from_server, mut to_client) = (server, client);
    std::thread::spawn(move || {
        let mut buf = [0u8; 16 * 1024];
        while let Ok(n @ 1..) = from_server.read(&mut buf) {
            if doomed.load(Ordering::SeqCst) {
                cuts.fetch_add(1, Ordering::SeqCst);
                break;
            }
            if to_client.write_all(&buf[..n]).is_err() {
                break;
            }
        }
        let _ = to_client.shutdown(Shutdown::Both);
        let _ = from_server.shutdown(Shutdown::Both);
    });
}

/// A Redis Cluster of one primary with every slot, announced at a relay's port.
struct RelayedCluster {
    relay: Relay,
    port: u16,
    _nodes: Nodes,
}

impl RelayedCluster {
    fn start() -> Self {
        let port = procs::free_ports(1)[0];
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let relay = Relay::start(listener, port);
        let nodes = Nodes::new("relayed-cluster");
        let announced = relay.port.to_string();
        let args = [
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            &format!("nodes-{port}.conf"),
            "--cluster-announce-ip",
            "127.0.0.1",
            "--cluster-announce-port",
            &announced,
        ];
        nodes.spawn(port, None, &args);
        procs::wait_ping(port);
        let _: () = redis::cmd("CLUSTER")
            .arg("ADDSLOTS")
            .arg((0..16384).collect::<Vec<u16>>())
            .query(&mut procs::connect(port).unwrap())
            .unwrap();
        procs::wait_until(Duration::from_secs(10), "cluster_state:ok", || {
            procs::info_field(port, "cluster", "cluster_state").as_deref() == Some("ok")
        });
        Self {
            relay,
            port,
            _nodes: nodes,
        }
    }

    fn url(&self) -> String {
        format!("redis+cluster://127.0.0.1:{}", self.relay.port)
    }

    /// A key's balance as Redis holds it, read past the relay.
    fn balance(&self, prefix: &str, key: &str) -> u64 {
        redis::cmd("HGET")
            .arg(format!("{prefix}{{{key}}}:quota"))
            .arg("balance")
            .query(&mut procs::connect(self.port).unwrap())
            .unwrap()
    }
}

/// The reproduction: 100, then a top-up of 50 whose connection drops after Redis ran it; the
/// cluster client re-sends it on a new connection. Credited once: 150, answered 150.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_top_up_whose_answer_is_lost_is_credited_once_on_a_cluster() {
    let cluster = RelayedCluster::start();
    let prefix = "resend:";
    let store = test_support::store_builder(cluster.url())
        .prefix(prefix)
        .open()
        .unwrap();
    let quota = Quota::new(store);
    quota.fund("tenant:t1", Fund::Set(100)).await.unwrap();
    cluster.relay.arm(b"{tenant:t1}:quota\r\n");
    let topped = quota.fund("tenant:t1", Fund::Add(50)).await;
    assert_eq!(cluster.relay.cuts(), 1, "the top-up's connection was cut");
    assert_eq!(cluster.balance(prefix, "tenant:t1"), 150, "credited once");
    assert_eq!(topped.unwrap().balance, 150, "answered as credited");

    // The same with the caller's key: this call's own re-send answers it.
    cluster.relay.arm(b"{tenant:t1}:quota\r\n");
    let payment = IdempotencyKey::from("payment-1");
    let topped = quota.fund_with("tenant:t1", Fund::Add(50), &payment).await;
    assert_eq!(cluster.relay.cuts(), 2, "the top-up's connection was cut");
    assert_eq!(topped.unwrap(), repeated(200, 0));
    assert_eq!(cluster.balance(prefix, "tenant:t1"), 200, "credited once");
}

/// On a cluster, the store's own calls: the same funding under one key twice applies once, and what it
/// remembers lives in the key's slot and expires.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_funding_sent_twice_applies_once_on_a_cluster() {
    let cluster = RelayedCluster::start();
    let prefix = "twice:";
    let store: RedisStore = test_support::store_builder(cluster.url())
        .prefix(prefix)
        .open()
        .unwrap();
    let payment = IdempotencyKey::from("payment-1");
    store
        .fund("tenant:t1", Fund::Set(100), &IdempotencyKey::generate())
        .await
        .unwrap();
    for answer in [applied(150, 0), repeated(150, 0)] {
        let funded = store.fund("tenant:t1", Fund::Add(50), &payment).await;
        assert_eq!(funded.unwrap(), answer);
    }
    assert_eq!(cluster.balance(prefix, "tenant:t1"), 150, "credited once");
    let mut node = procs::connect(cluster.port).unwrap();
    for role in ["funded", "fundings"] {
        let name = format!("{prefix}{{tenant:t1}}:{role}");
        let entries: u64 = redis::cmd(if role == "funded" { "HLEN" } else { "ZCARD" })
            .arg(&name)
            .query(&mut node)
            .unwrap();
        assert_eq!(entries, 2, "{name}: the set's and the top-up's keys");
        let ttl: i64 = redis::cmd("PTTL").arg(&name).query(&mut node).unwrap();
        let day = i64::try_from(FUNDING_MEMORY.as_millis()).unwrap();
        assert!(
            ttl > 0 && ttl <= day,
            "{name} expires within a day: {ttl} ms"
        );
    }

    // At the bound, the key forgotten soonest (the set's, generated) makes room for a new one.
    let (funded, fundings) = (
        format!("{prefix}{{tenant:t1}}:funded"),
        format!("{prefix}{{tenant:t1}}:fundings"),
    );
    let (seconds, _): (u64, u64) = redis::cmd("TIME").query(&mut node).unwrap();
    let later = (seconds + 2 * 86_400) * 1000;
    let fill: Vec<String> = (2..MAX_REMEMBERED_FUNDINGS)
        .map(|i| format!("fill-{i}"))
        .collect();
    let mut zadd = redis::cmd("ZADD");
    zadd.arg(&fundings);
    let mut hset = redis::cmd("HSET");
    hset.arg(&funded);
    for member in &fill {
        zadd.arg(later).arg(member);
        hset.arg(member).arg("a:1:1:0");
    }
    let _: () = redis::pipe()
        .add_command(zadd)
        .ignore()
        .add_command(hset)
        .ignore()
        .query(&mut node)
        .unwrap();
    let newest = IdempotencyKey::generate();
    for answer in [applied(151, 0), repeated(151, 0)] {
        let funded = store.fund("tenant:t1", Fund::Add(1), &newest).await;
        assert_eq!(funded.unwrap(), answer, "the newest is kept");
    }
    let counts: (u32, u32) = redis::pipe()
        .cmd("HLEN")
        .arg(&funded)
        .cmd("ZCARD")
        .arg(&fundings)
        .query(&mut node)
        .unwrap();
    let bound = MAX_REMEMBERED_FUNDINGS;
    assert_eq!(counts, (bound, bound), "bounded");
    let again = store.fund("tenant:t1", Fund::Add(50), &payment).await;
    assert_eq!(again.unwrap(), repeated(150, 0), "a given key outlives it");
}
