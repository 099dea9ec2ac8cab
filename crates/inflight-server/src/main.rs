//! `inflight`: the command-line entry point. The server issue fills this in.

fn main() {
    println!("inflight {}", env!("CARGO_PKG_VERSION"));
}
