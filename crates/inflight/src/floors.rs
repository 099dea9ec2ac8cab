//! Reserved floors: slots of a key that lower priority levels do not take while a level has demand.
//!
//! The rule lives in three places, which must agree: [`Floors::reserved`] here (the memory store's),
//! `reserved` in `store/redis/scripts/queue.lua`, and the tests in `tests/waiting/queue.rs`.

use crate::limit::PolicyError;

/// The most priority levels of one class that may have a floor.
pub const MAX_FLOORS: usize = 4;

/// The floors of a class of keys: for up to [`MAX_FLOORS`] priority levels, how many slots of each key
/// are kept for that level. While a level has holders or waiters on a key and holds fewer than its
/// floor there, admissions of lower levels leave the difference free (they borrow it while the level
/// is idle, and give it back by not being admitted again, never by preemption).
///
/// ```
/// use inflight::Floors;
///
/// let floors = Floors::new(&[(9, 4)]).unwrap();
/// // Limit 10: with the high level busy (1 held), a low admission leaves 3 more for it.
/// assert_eq!(floors.reserved(0, |_| 1, |_| false), 3);
/// // The high level idle: nothing is kept from the low one.
/// assert_eq!(floors.reserved(0, |_| 0, |_| false), 0);
/// // Waiting at the level is demand too; a level never reserves from itself or higher ones.
/// assert_eq!(floors.reserved(0, |_| 0, |_| true), 4);
/// assert_eq!(floors.reserved(9, |_| 0, |_| true), 0);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Floors {
    levels: [(u8, u32); MAX_FLOORS],
    len: u8,
}

impl Floors {
    /// No floors.
    pub const NONE: Self = Self {
        levels: [(0, 0); MAX_FLOORS],
        len: 0,
    };

    /// Floors of `(priority, slots)`: each level once, at most [`MAX_FLOORS`], slots at least 1.
    pub fn new(levels: &[(u8, u32)]) -> Result<Self, PolicyError> {
        let mut floors = Self::default();
        if levels.len() > MAX_FLOORS {
            return Err(PolicyError::new(format!(
                "at most {MAX_FLOORS} floors per class of keys"
            )));
        }
        for (i, &(priority, slots)) in levels.iter().enumerate() {
            if slots == 0 {
                return Err(PolicyError::new(format!(
                    "the floor of priority {priority} must be at least 1 slot"
                )));
            }
            if levels[..i].iter().any(|(other, _)| *other == priority) {
                return Err(PolicyError::new(format!(
                    "two floors for priority {priority}"
                )));
            }
            floors.levels[i] = (priority, slots);
        }
        floors.len = levels.len() as u8;
        Ok(floors)
    }

    /// The levels and their floors.
    pub fn levels(&self) -> &[(u8, u32)] {
        &self.levels[..usize::from(self.len)]
    }

    /// True when no level has a floor.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The floor of `priority` (0: none).
    pub fn of(&self, priority: u8) -> u32 {
        self.levels()
            .iter()
            .find(|(level, _)| *level == priority)
            .map_or(0, |(_, slots)| *slots)
    }

    /// The slots an admission at `priority` must leave free on a key: for each higher level with a
    /// floor that has demand there (`held(level)` > 0, or `waiting(level)`), what it holds below its
    /// floor.
    pub fn reserved(
        &self,
        priority: u8,
        held: impl Fn(u8) -> u32,
        waiting: impl Fn(u8) -> bool,
    ) -> u32 {
        let mut reserved = 0u32;
        for &(level, floor) in self.levels() {
            if level <= priority {
                continue;
            }
            let held = held(level);
            if held < floor && (held > 0 || waiting(level)) {
                reserved = reserved.saturating_add(floor - held);
            }
        }
        reserved
    }
}
