//! A relay in front of a Redis that can hold back what Redis answers on the command connections (those
//! that never sent SUBSCRIBE) while the subscriptions go on: a process whose answers are late while its
//! announcements arrive, for the tests of the override view.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

pub struct Gate {
    port: u16,
    held: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Gate {
    /// Relays to the Redis on `target` (a port on 127.0.0.1), holding nothing.
    pub async fn start(target: u16) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (held, watching) = watch::channel(false);
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(("127.0.0.1", target)).await else {
                    continue;
                };
                tokio::spawn(relay(client, server, watching.clone()));
            }
        });
        Self { port, held, task }
    }

    /// `redis://` through the relay.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Holds back the answers on command connections from now on, until [`Gate::open`].
    pub fn hold(&self) {
        self.held.send_replace(true);
    }

    /// Lets the answers held back through, and every later one.
    pub fn open(&self) {
        self.held.send_replace(false);
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn relay(client: TcpStream, server: TcpStream, mut held: watch::Receiver<bool>) {
    let subscriber = Arc::new(AtomicBool::new(false));
    let (from_client, to_client) = client.into_split();
    let (from_server, to_server) = server.into_split();
    let sent = subscriber.clone();
    let up = async move {
        let mut buf = vec![0u8; 64 * 1024];
        while let Ok(n @ 1..) = read(&from_client, &mut buf).await {
            if buf[..n]
                .windows(9)
                .any(|w| w.eq_ignore_ascii_case(b"SUBSCRIBE"))
            {
                sent.store(true, Ordering::SeqCst);
            }
            if write_all(&to_server, &buf[..n]).await.is_err() {
                break;
            }
        }
    };
    let down = async move {
        let mut buf = vec![0u8; 64 * 1024];
        while let Ok(n @ 1..) = read(&from_server, &mut buf).await {
            while *held.borrow_and_update() && !subscriber.load(Ordering::SeqCst) {
                if held.changed().await.is_err() {
                    return;
                }
            }
            if write_all(&to_client, &buf[..n]).await.is_err() {
                break;
            }
        }
    };
    tokio::select! {
        () = up => {}
        () = down => {}
    }
}

async fn read(from: &OwnedReadHalf, buf: &mut [u8]) -> std::io::Result<usize> {
    loop {
        from.readable().await?;
        match from.try_read(buf) {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            read => return read,
        }
    }
}

async fn write_all(to: &OwnedWriteHalf, mut bytes: &[u8]) -> std::io::Result<()> {
    while !bytes.is_empty() {
        to.writable().await?;
        match to.try_write(bytes) {
            Ok(n) => bytes = &bytes[n..],
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
