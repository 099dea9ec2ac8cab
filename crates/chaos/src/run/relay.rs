//! A TCP relay between the holders and Redis that can add latency, stall the link as lost packets do
//! (TCP resends them late, in order), cut it a while, and reset every connection.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use crate::holder::Rng;

/// What the link does to each chunk it carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Passes it on at once.
    Clear,
    /// Delays it 20 to 200 ms.
    Latency,
    /// One chunk in ten is held back 300 to 1,500 ms (and everything behind it).
    Drops,
    /// Holds every chunk until the link is back (a cut: TCP resends what it could not deliver).
    Cut,
}

/// The relay's controls, shared with the tasks that carry the connections.
#[derive(Debug)]
pub(crate) struct Relay {
    /// Where it listens.
    pub(crate) port: u16,
    mode: Mutex<Mode>,
    resets: watch::Sender<u64>,
    seed: AtomicU64,
}

impl Relay {
    /// Listens on a free port of 127.0.0.1 and carries each connection to `127.0.0.1:target`.
    pub(crate) async fn start(target: u16) -> std::io::Result<Arc<Self>> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let (resets, _) = watch::channel(0);
        let relay = Arc::new(Self {
            port: listener.local_addr()?.port(),
            mode: Mutex::new(Mode::Clear),
            resets,
            seed: AtomicU64::new(1),
        });
        let carrier = relay.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let relay = carrier.clone();
                tokio::spawn(async move {
                    if let Ok(server) = TcpStream::connect(("127.0.0.1", target)).await {
                        relay.carry(client, server).await;
                    }
                });
            }
        });
        Ok(relay)
    }

    /// Sets what the link does from now on.
    pub(crate) fn set(&self, mode: Mode) {
        *self.mode.lock().expect("the mode") = mode;
    }

    /// Resets every connection open now (the clients see ECONNRESET).
    pub(crate) fn reset_all(&self) {
        self.resets.send_modify(|n| *n += 1);
    }

    fn mode(&self) -> Mode {
        *self.mode.lock().expect("the mode")
    }

    async fn carry(self: Arc<Self>, client: TcpStream, server: TcpStream) {
        for socket in [&client, &server] {
            let _ = socket.set_nodelay(true);
            // Closed with linger 0: a reset, which the other end sees at once (and the drop never blocks).
            #[allow(deprecated)]
            let _ = socket.set_linger(Some(Duration::ZERO));
        }
        let mut reset = self.resets.subscribe();
        let (client_read, client_write) = client.into_split();
        let (server_read, server_write) = server.into_split();
        let seed = self.seed.fetch_add(2, Ordering::Relaxed);
        let up = self.clone().pump(client_read, server_write, Rng::new(seed));
        let down = self
            .clone()
            .pump(server_read, client_write, Rng::new(seed + 1));
        // Either way ends the connection: the sockets go with the futures.
        tokio::select! {
            _ = up => {}
            _ = down => {}
            _ = reset.changed() => {}
        }
    }

    async fn pump(self: Arc<Self>, mut from: OwnedReadHalf, mut to: OwnedWriteHalf, mut rng: Rng) {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let n = match from.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            while self.mode() == Mode::Cut {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let delay = match self.mode() {
                Mode::Clear | Mode::Cut => 0,
                Mode::Latency => 20 + rng.below(180),
                Mode::Drops if rng.below(10) == 0 => 300 + rng.below(1200),
                Mode::Drops => 0,
            };
            if delay > 0 {
                tokio::time::sleep(Duration::from_millis(delay)).await;
            }
            if to.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
        let _ = to.shutdown().await;
    }
}
