//! Redis's own CPU time, for benchmarks: what one admission costs the server every process shares.

use std::time::Duration;

use super::{DifyStore, RedisStore};
use crate::error::StoreError;

impl RedisStore {
    /// The CPU time Redis has used since it started (`INFO cpu`: `used_cpu_sys` + `used_cpu_user`), summed
    /// over every primary of a Cluster. Read it before and after a load: the difference over the load's
    /// operations is what each cost Redis.
    pub async fn redis_cpu_time(&self) -> Result<Duration, StoreError> {
        let infos = self.conn.info_of_primaries("cpu").await?;
        let seconds: f64 = infos.iter().map(|info| cpu_seconds(info)).sum();
        Ok(Duration::from_secs_f64(seconds.max(0.0)))
    }
}

impl DifyStore {
    /// As [`RedisStore::redis_cpu_time`].
    pub async fn redis_cpu_time(&self) -> Result<Duration, StoreError> {
        self.plain.redis_cpu_time().await
    }
}

/// `used_cpu_sys` + `used_cpu_user` of one `INFO cpu` answer, in seconds.
fn cpu_seconds(info: &str) -> f64 {
    info.lines()
        .filter_map(|line| {
            let (name, value) = line.trim().split_once(':')?;
            matches!(name, "used_cpu_sys" | "used_cpu_user").then(|| value.parse::<f64>().ok())?
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::cpu_seconds;

    #[test]
    fn the_servers_own_time_is_system_and_user_time() {
        let info = "# CPU\r\nused_cpu_sys:1.500000\r\nused_cpu_user:2.250000\r\n\
                    used_cpu_sys_children:9.0\r\nused_cpu_user_main_thread:2.0\r\n";
        assert!((cpu_seconds(info) - 3.75).abs() < 1e-9);
    }
}
