//! A fake old Redis, for the check of the oldest Redis supported.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};

/// A fake Redis of `version` on loopback, on threads of its own, for the tests of the oldest Redis
/// supported: INFO answers `redis_version:<version>`, anything else `+OK`; the commands it was sent, in
/// order.
pub fn old_redis(version: &str) -> (u16, Arc<Mutex<Vec<String>>>) {
    let info = format!("# Server\r\nredis_version:{version}\r\nredis_mode:standalone\r\n");
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = Arc::clone(&seen);
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut write) = stream else { return };
            let (log, info) = (Arc::clone(&log), info.clone());
            std::thread::spawn(move || {
                let mut read = BufReader::new(write.try_clone().unwrap());
                while let Some(args) = command(&mut read) {
                    let name = args.first().cloned().unwrap_or_default().to_uppercase();
                    log.lock().unwrap().push(args.join(" "));
                    let reply = if name == "INFO" {
                        format!("${}\r\n{info}\r\n", info.len())
                    } else {
                        "+OK\r\n".to_owned()
                    };
                    if write.write_all(reply.as_bytes()).is_err() {
                        return;
                    }
                }
            });
        }
    });
    (port, seen)
}

/// One command: `*N`, then N bulk strings (`$len`, the bytes).
fn command(read: &mut impl BufRead) -> Option<Vec<String>> {
    let mut line = String::new();
    read.read_line(&mut line).ok().filter(|n| *n > 0)?;
    let count: usize = line.trim().strip_prefix('*')?.parse().ok()?;
    let mut args = Vec::with_capacity(count);
    for _ in 0..count {
        line.clear();
        read.read_line(&mut line).ok()?;
        let len: usize = line.trim().strip_prefix('$')?.parse().ok()?;
        let mut bytes = vec![0; len + 2];
        read.read_exact(&mut bytes).ok()?;
        bytes.truncate(len);
        args.push(String::from_utf8_lossy(&bytes).into_owned());
    }
    Some(args)
}
