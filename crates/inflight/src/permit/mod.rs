//! The permit and what carries it: a stream guard and a scope helper.

#[allow(clippy::module_inception)]
mod permit;
mod scope;
mod stream;

pub(crate) use permit::{BoxFuture, Hold, Owner, PermitState};
pub use permit::{Lease, Permit};
pub use scope::Scoped;
pub use stream::PermitStream;
