//! Reading a key, and setting or clearing its override: `status.lua` (on a cluster the index of
//! overrides apart, `index.lua`: `across.rs`).

use super::error::invoke;
use super::naming::KeyNames;
use super::scripts;
use super::store::{fields, number, RedisStore};
use crate::error::StoreError;
use crate::policy::{ClassLimits, Limit};
use crate::store::{KeyStatus, OverrideChange};

impl RedisStore {
    /// `status.lua`, with the index of overrides on one server, without it on a cluster; and the index's
    /// version after a change (0: on a cluster, or no change).
    pub(super) async fn status_in_slot(
        &self,
        key: &str,
        limits: ClassLimits,
        change: OverrideChange,
    ) -> Result<(KeyStatus, u64), StoreError> {
        let mut invocation = scripts::STATUS.prepare_invoke();
        KeyNames::new(&self.prefix, key, self.conn.is_cluster()).declare(&mut invocation);
        if !self.conn.is_cluster() {
            invocation
                .key(&self.overrides.index)
                .key(&self.overrides.version);
        }
        invocation
            .arg(limits.default_limit)
            .arg(limits.max_limit)
            .arg(change_arg(change))
            .arg(self.offset())
            .arg(key)
            .arg(&self.overrides.channel)
            .arg(self.max_overrides);
        let out = invoke::<Vec<i64>>(&self.conn, &invocation).await?;
        let [limit, override_limit, in_flight, version] = fields(&out)?;
        let status = status_of(&[limit, override_limit, in_flight])?;
        Ok((status, number(version)?))
    }
}

/// An override change as the scripts take it: '' leave, '0' clear, 'n' set.
pub(super) fn change_arg(change: OverrideChange) -> String {
    match change {
        OverrideChange::Keep => String::new(),
        OverrideChange::Set(n) => n.to_string(),
        OverrideChange::Clear => "0".to_owned(),
    }
}

/// `status.lua`'s first three numbers, or `dify.lua`'s answer.
pub(super) fn status_of(out: &[i64]) -> Result<KeyStatus, StoreError> {
    let [limit, override_limit, in_flight] = fields(out)?;
    if limit == -1 {
        let max = number(override_limit)?;
        return Err(StoreError::TooManyOverrides { max });
    }
    let override_limit: u32 = number(override_limit)?;
    Ok(KeyStatus {
        limit: Limit::from_u32(number(limit)?),
        override_limit: (override_limit > 0).then_some(override_limit),
        in_flight: number(in_flight)?,
    })
}
