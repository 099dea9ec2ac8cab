//! The way to Redis (one server, a Redis Cluster or Sentinel's primary) behind one [`Conn`], opened from
//! [`ConnOptions`], which every store's builder fills in. Each connection checks the server's version
//! before its first command (`version.rs`: 6.2 or later).

mod cluster;
mod conn;
mod options;
mod sentinel;
mod version;

pub(super) use self::cluster::slot;
pub(super) use self::conn::Conn;
pub(super) use self::options::ConnOptions;
