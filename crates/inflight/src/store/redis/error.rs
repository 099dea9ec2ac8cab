//! Redis errors as [`StoreError`]s: transient when trying again later may work.

use redis::{ErrorKind, RedisError, ServerErrorKind};

use crate::error::StoreError;

impl From<RedisError> for StoreError {
    fn from(err: RedisError) -> Self {
        let transient = err.is_io_error()
            || err.is_timeout()
            || err.is_connection_dropped()
            || err.is_connection_refusal()
            || err.is_cluster_error()
            || matches!(
                err.kind(),
                ErrorKind::Server(ServerErrorKind::BusyLoading | ServerErrorKind::MasterDown)
            )
            || err.code() == Some("READONLY");
        if transient {
            StoreError::Unavailable(err.to_string())
        } else if matches!(
            err.kind(),
            ErrorKind::Parse | ErrorKind::UnexpectedReturnType
        ) {
            StoreError::Protocol(err.to_string())
        } else {
            StoreError::Rejected(err.to_string())
        }
    }
}
