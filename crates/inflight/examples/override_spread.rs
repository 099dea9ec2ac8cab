//! How soon an override set by one process applies in another: two stores on one Redis (two
//! connections, two views of the overrides, as two processes have). One sets a limit on a key that no
//! rule limits; the time until the other's next admission of that key counts against it is measured,
//! `TRIALS` times. Then the same with the announcement lost (the override written straight into Redis,
//! as a message missed while a subscription is remade would leave it), which only the version poll
//! catches. Prints one JSON line.
//!
//! `scripts/bench.sh` runs this; by hand:
//! `cargo run --release -p inflight --example override_spread -- redis://127.0.0.1:6379`

use std::time::{Duration, Instant};

use inflight::{Limiter, Policy, RedisStore};

const TRIALS: usize = 200;
const SILENT_TRIALS: usize = 20;

/// How long until `key` is admitted with a count by `limiter`.
async fn until_counted(
    limiter: &Limiter<RedisStore>,
    key: &str,
) -> Result<Duration, Box<dyn std::error::Error>> {
    let started = Instant::now();
    loop {
        if limiter.try_acquire(key).await?.is_counted() {
            return Ok(started.elapsed());
        }
        if started.elapsed() > Duration::from_secs(10) {
            return Err(format!("{key} was never limited").into());
        }
        tokio::task::yield_now().await;
    }
}

/// `{"p50_ms", "p99_ms", "max_ms", "trials"}` of `took`.
fn summary(mut took: Vec<Duration>) -> String {
    took.sort();
    let at = |q: f64| {
        let i = ((took.len() - 1) as f64 * q).round() as usize;
        took[i].as_secs_f64() * 1e3
    };
    format!(
        "{{\"p50_ms\": {:.3}, \"p99_ms\": {:.3}, \"max_ms\": {:.3}, \"trials\": {}}}",
        at(0.5),
        at(0.99),
        at(1.0),
        took.len()
    )
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::args()
        .nth(1)
        .ok_or("usage: override_spread URL")?;
    let prefix = format!("inflight-spread-{}:", std::process::id());
    let open = || {
        RedisStore::builder(url.as_str())
            .prefix(prefix.clone())
            .open()
    };
    let (one, two) = (open()?, open()?);
    let one = Limiter::builder(one).policy(Policy::new(0, 0)).build();
    let two = Limiter::builder(two).policy(Policy::new(0, 0)).build();
    // The second process's view has been read once it admits without a script; a moment is plenty.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut announced = Vec::with_capacity(TRIALS);
    for n in 0..TRIALS {
        let key = format!("app:{n}");
        one.set_limit(&key, 1_000).await?;
        announced.push(until_counted(&two, &key).await?);
        one.clear_limit(&key).await?;
    }
    let mut conn = redis::Client::open(url.as_str())?
        .get_multiplexed_async_connection()
        .await?;
    let mut silent = Vec::with_capacity(SILENT_TRIALS);
    for n in 0..SILENT_TRIALS {
        let key = format!("quiet:{n}");
        redis::pipe()
            .cmd("SET")
            .arg(format!("{prefix}{{{key}}}:limit"))
            .arg(1_000)
            .cmd("HSET")
            .arg(format!("{prefix}overrides"))
            .arg(&key)
            .arg(1_000)
            .cmd("INCR")
            .arg(format!("{prefix}overrides:version"))
            .query_async::<()>(&mut conn)
            .await?;
        silent.push(until_counted(&two, &key).await?);
    }
    println!(
        "{{\"announced\": {}, \"unannounced\": {}}}",
        summary(announced),
        summary(silent)
    );
    Ok(())
}
