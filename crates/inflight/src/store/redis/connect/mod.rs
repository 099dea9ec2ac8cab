//! The way to Redis, whatever the deployment: one server, a Redis Cluster (`cluster.rs`) or the primary
//! Sentinel names (`sentinel.rs`), behind one connection type, [`Conn`] (`conn.rs`), opened from
//! [`ConnOptions`] (`options.rs`), which every store's builder fills in.

mod cluster;
mod conn;
mod options;
mod sentinel;

pub(super) use self::cluster::slot;
pub(super) use self::conn::Conn;
pub(super) use self::options::ConnOptions;
