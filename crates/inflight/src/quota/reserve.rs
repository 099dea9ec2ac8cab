//! [`Quota::reserve`]: a reservation made, or the reason it was not.

use std::sync::Arc;
use std::time::Duration;

use super::handle::{Quota, QuotaError};
use super::reservation::Reservation;
use super::store::{QuotaStore, Reserve, MAX_BALANCE};
use crate::id::PermitId;
use crate::store::Store;

impl<S: Store + QuotaStore> Quota<S> {
    /// Reserves `amount` of `key`'s balance under a generated id for the handle's ttl.
    pub async fn reserve(&self, key: &str, amount: u64) -> Result<Reservation<S>, QuotaError> {
        self.reserve_with(key, amount, None, None).await
    }

    /// Reserves `amount` of `key`'s balance under `id` (default: generated) for `ttl` (default: the
    /// handle's; 1 ms to 24 h). Reserving an id already open answers that reservation (its deadline
    /// moved, nothing taken again), so a retried call cannot charge twice.
    ///
    /// # Cancel safety
    ///
    /// Cancelled while the store decides, a reservation under a generated id is refunded in the
    /// background; one under a given id ends with its ttl.
    pub async fn reserve_with(
        &self,
        key: &str,
        amount: u64,
        id: Option<PermitId>,
        ttl: Option<Duration>,
    ) -> Result<Reservation<S>, QuotaError> {
        if amount == 0 || amount > MAX_BALANCE {
            return Err(QuotaError::Invalid("amounts are between 1 and 10^15"));
        }
        let ttl_ms = self.ttl_ms(ttl)?;
        let generated = id.is_none();
        let id = id.unwrap_or_else(PermitId::generate);
        if id.is_empty() {
            return Err(QuotaError::Invalid("reservation ids may not be empty"));
        }
        let key: Arc<str> = Arc::from(key);
        // Until the store answers, a generated id's reservation can only be this call's: dropped
        // before the answer, it is refunded.
        let armed = generated.then(|| (self.clone(), ttl_ms));
        let mut unanswered = Reservation::pending(key.clone(), id.clone(), amount, armed);
        let decided = self.store().reserve(&key, &id, amount, ttl_ms).await;
        unanswered.disarm();
        match decided? {
            Reserve::Reserved {
                balance,
                expires_at_ms,
            } => {
                self.stats().saw(&key, Some(&balance));
                Ok(Reservation::open(
                    key,
                    id,
                    amount,
                    (balance, expires_at_ms),
                    ttl_ms,
                    self.clone(),
                ))
            }
            Reserve::Exhausted { balance } => {
                self.stats().saw(&key, Some(&balance));
                Err(QuotaError::Exhausted {
                    balance: balance.balance,
                    amount,
                })
            }
            Reserve::Settled { balance } => {
                self.stats().saw(&key, Some(&balance));
                Err(QuotaError::Settled)
            }
            Reserve::Unmetered => Ok(Reservation::unmetered(key, id, amount)),
        }
    }
}
