//! The way to Redis (one server, a Redis Cluster or Sentinel's primary) behind one [`Conn`], opened from
//! [`ConnOptions`], which every store's builder fills in.

mod cluster;
mod conn;
mod options;
mod sentinel;

pub(super) use self::cluster::slot;
pub(super) use self::conn::Conn;
pub(super) use self::options::ConnOptions;
