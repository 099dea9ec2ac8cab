//! The last minute of a few counters, one slot a second: fed from running totals, read as sums.

/// How many seconds the figures "per minute" cover.
pub(super) const SECONDS: usize = 60;

/// What is counted: admitted, refused, reclaimed leases, admissions past shadow limits.
pub(super) type Counts = [u64; 4];

/// The counts of each of the last [`SECONDS`] seconds.
#[derive(Debug, Default)]
pub(super) struct Ring {
    slots: Vec<Counts>,
    next: usize,
    /// The totals at the last sample (zeros before the first: the totals start with the server).
    last: Counts,
}

impl Ring {
    /// Records the running `totals` of now: what they grew by since the last sample fills this second's
    /// slot (a total that went down, a counter reset, counts as no growth).
    pub(super) fn sample(&mut self, totals: Counts) {
        let last = std::mem::replace(&mut self.last, totals);
        let grown: Counts = std::array::from_fn(|i| totals[i].saturating_sub(last[i]));
        if self.slots.len() < SECONDS {
            self.slots.push(grown);
        } else {
            self.slots[self.next] = grown;
        }
        self.next = (self.next + 1) % SECONDS;
    }

    /// The sums over the last minute (or over the seconds sampled so far).
    pub(super) fn per_minute(&self) -> Counts {
        std::array::from_fn(|i| self.slots.iter().map(|counts| counts[i]).sum())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_the_growth_of_the_last_sixty_samples() {
        let mut ring = Ring::default();
        ring.sample([10, 5, 0, 0]);
        assert_eq!(ring.per_minute(), [10, 5, 0, 0], "counted from zero");
        ring.sample([12, 5, 1, 0]);
        ring.sample([15, 6, 1, 0]);
        assert_eq!(ring.per_minute(), [15, 6, 1, 0]);
        for n in 0..SECONDS as u64 {
            ring.sample([15 + n, 6, 1, 0]);
        }
        assert_eq!(
            ring.per_minute(),
            [SECONDS as u64 - 1, 0, 0, 0],
            "older seconds left"
        );
        ring.sample([0, 0, 0, 0]);
        assert_eq!(
            ring.per_minute(),
            [SECONDS as u64 - 1, 0, 0, 0],
            "a reset is no growth"
        );
    }
}
