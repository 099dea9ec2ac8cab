//! Redis memory per held permit, measured on real permits: holds N permits on one key through a
//! [`Limiter`] on the Redis store, sums `MEMORY USAGE` over every Redis key the store keeps for it (not
//! the limit override, which is configuration), and prints one line, `N BYTES REDIS_KEYS`, for each N
//! given. The permits are released before the next N.
//!
//! `scripts/bench.sh` runs this; by hand:
//! `cargo run --release -p inflight --example redis_memory -- redis://127.0.0.1:6379 100 100000`

use futures_util::future::try_join_all;
use inflight::{Limiter, Policy, RedisStore};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let url = args.next().ok_or("usage: redis_memory URL N...")?;
    let client = redis::Client::open(url.as_str())?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    for n in args {
        let n: usize = n.parse()?;
        let prefix = format!("inflight-memory-{}-{n}:", std::process::id());
        let store = RedisStore::builder(url.as_str())
            .prefix(prefix.clone())
            .open()?;
        let limiter = Limiter::builder(store).policy(Policy::new(0, 0)).build();
        // Unlimited keys record nothing, so set a limit the permits fit under.
        limiter.set_limit("k", u32::try_from(n)?).await?;
        let mut permits = Vec::with_capacity(n);
        while permits.len() < n {
            let chunk = (n - permits.len()).min(256);
            permits.extend(try_join_all((0..chunk).map(|_| limiter.try_acquire("k"))).await?);
        }
        let names: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{prefix}*"))
            .query_async(&mut conn)
            .await?;
        let mut bytes = 0u64;
        let mut counted = 0;
        // The override and the index of overrides are configuration, not the permits' cost.
        let index = format!("{prefix}overrides");
        for name in names
            .iter()
            .filter(|name| !name.ends_with(":limit") && !name.starts_with(&index))
        {
            bytes += memory_usage(&mut conn, name).await?;
            counted += 1;
        }
        println!("{n} {bytes} {counted}");
        // Released and awaited: dropped permits would be released in the background, after this exits.
        try_join_all(permits.into_iter().map(|permit| permit.release())).await?;
        limiter.clear_limit("k").await?;
    }
    Ok(())
}

async fn memory_usage(
    conn: &mut redis::aio::MultiplexedConnection,
    name: &str,
) -> redis::RedisResult<u64> {
    redis::cmd("MEMORY")
        .arg("USAGE")
        .arg(name)
        .arg("SAMPLES")
        .arg(0)
        .query_async(conn)
        .await
}
