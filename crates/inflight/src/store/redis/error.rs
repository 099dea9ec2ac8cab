//! Redis errors as [`StoreError`]s: transient when trying again later may work.

use redis::{ErrorKind, FromRedisValue, RedisError, ScriptInvocation, ServerErrorKind};

use super::connect::Conn;
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
        } else if let (ErrorKind::InvalidClientConfig, Some(why)) = (err.kind(), err.detail()) {
            // Such as a server older than the oldest supported (`connect/version.rs`): the reason alone.
            StoreError::Rejected(why.to_owned())
        } else {
            StoreError::Rejected(err.to_string())
        }
    }
}

/// Runs a script on `conn` (EVALSHA; loaded on NOSCRIPT), [`retried`].
pub(super) async fn invoke<T: FromRedisValue>(
    conn: &Conn,
    invocation: &ScriptInvocation<'_>,
) -> Result<T, StoreError> {
    retried(|| {
        let mut conn = conn.clone();
        async move { invocation.invoke_async(&mut conn).await }
    })
    .await
}

/// Runs `attempt` once more when the connection turned out to be dead (Redis restarted, say): the
/// connection manager reconnects, and every script is idempotent by permit id, so trying again is safe.
pub(super) async fn retried<T, F>(mut attempt: impl FnMut() -> F) -> Result<T, StoreError>
where
    F: std::future::Future<Output = redis::RedisResult<T>>,
{
    match attempt().await {
        Err(error) if error.is_connection_dropped() => {
            tracing::debug!(%error, "the Redis connection was lost; trying once more");
            Ok(attempt().await?)
        }
        result => Ok(result?),
    }
}
