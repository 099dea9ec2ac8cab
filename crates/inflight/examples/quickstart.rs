//! inflight on the embedded store: an app limited to 2 streamed answers at once, 5 requests arriving
//! together. Run it with `cargo run -p inflight --example quickstart`.

use std::time::Duration;

use futures_util::StreamExt;
use inflight::{AcquireError, Limiter, MemoryStore, Policy};

#[tokio::main]
async fn main() {
    let limiter = Limiter::builder(MemoryStore::new())
        .policy(Policy::new(2, 0)) // every app: 2 in flight at once
        .build();

    let mut requests = Vec::new();
    for n in 1..=5 {
        let limiter = limiter.clone();
        requests.push(tokio::spawn(async move {
            match limiter.try_acquire("app-42").await {
                Ok(permit) => {
                    println!(
                        "request {n}: admitted ({} of {} in flight)",
                        permit.in_flight(),
                        permit.limit()
                    );
                    // The streamed answer holds the slot until its last chunk.
                    let chunks =
                        futures_util::stream::iter(["Hello", ", ", "world"]).then(|c| async move {
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            c
                        });
                    let answer: String = permit
                        .guard_stream(chunks)
                        .collect::<Vec<_>>()
                        .await
                        .concat();
                    println!("request {n}: streamed {answer:?}, slot released");
                }
                Err(AcquireError::Full { limit, in_flight }) => {
                    println!(
                        "request {n}: 429 too many requests ({in_flight} of {limit} in flight)"
                    );
                }
                Err(other) => println!("request {n}: {other}"),
            }
        }));
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    for request in requests {
        request.await.expect("request task");
    }
    let status = limiter.status("app-42").await.expect("memory store");
    println!(
        "afterwards: {} in flight, limit {}",
        status.in_flight, status.limit
    );
}
