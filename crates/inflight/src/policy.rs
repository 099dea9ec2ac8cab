//! The effective limit of a key: the limits of its class (the most specific rule whose pattern matches
//! it, else the defaults), its override in place of the class's default, capped by the class's ceiling;
//! 0 means unlimited.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use crate::floors::Floors;
pub use crate::limit::{ClassLimits, Limit, PolicyError};

/// The most rules one policy may have: every key of every admission is matched against them.
pub const MAX_RULES: usize = 1024;

/// A rule: the limits of the keys that match a glob pattern, where `*` matches any run of characters
/// (none included) and every other character itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    pattern: Box<str>,
    /// The pattern's parts between the stars.
    parts: Box<[Box<str>]>,
    limits: ClassLimits,
    floors: Floors,
    /// Its limits are watched, not enforced ([`Policy::shadow`]).
    shadow: bool,
}

impl Rule {
    /// A rule for the keys matching `pattern` (non-empty, at most 256 bytes).
    pub fn new(pattern: &str, limits: ClassLimits) -> Result<Self, PolicyError> {
        if pattern.is_empty() || pattern.len() > 256 {
            return Err(PolicyError::new(format!(
                "a rule's pattern must be 1 to 256 bytes, not {pattern:?}"
            )));
        }
        Ok(Self {
            pattern: pattern.into(),
            parts: pattern.split('*').map(Box::from).collect(),
            limits,
            floors: Floors::default(),
            shadow: false,
        })
    }

    /// The pattern.
    pub fn pattern(&self) -> &str {
        &self.pattern
    }

    /// The limits of the keys it matches.
    pub fn limits(&self) -> ClassLimits {
        self.limits
    }

    /// The floors of its priority levels.
    pub fn floors(&self) -> Floors {
        self.floors
    }

    /// True when its limits are watched, not enforced ([`Policy::shadow`]).
    pub fn is_shadow(&self) -> bool {
        self.shadow
    }

    /// True when `key` matches the pattern.
    pub fn matches(&self, key: &str) -> bool {
        let [first, middle @ .., last] = &self.parts[..] else {
            return key == &*self.pattern;
        };
        let Some(mut left) = key.strip_prefix(&**first) else {
            return false;
        };
        for part in middle {
            match left.find(&**part) {
                Some(at) => left = &left[at + part.len()..],
                None => return false,
            }
        }
        left.ends_with(&**last)
    }

    /// How specific the rule is: the length of its literal prefix, then of all its literal text, then
    /// whether it is exact (no `*`).
    fn specificity(&self) -> (usize, usize, bool) {
        let literal = self.parts.iter().map(|part| part.len()).sum();
        (self.parts[0].len(), literal, self.parts.len() == 1)
    }
}

/// The limit settings of a limiter: rules for classes of keys, and the limits of the keys no rule
/// matches.
///
/// A key's class is the most specific rule that matches it: the one with the longest literal prefix
/// (the text before its first `*`), then the one with the most literal text, then an exact one (no `*`),
/// then the one added first.
/// The key's limit is then resolved by [`ClassLimits::resolve`] from the class's limits and the key's
/// override, so an override is capped by its class's ceiling.
///
/// ```
/// use inflight::{ClassLimits, Limit, Policy};
///
/// let policy = Policy::new(0, 0) // keys matching no rule: unlimited
///     .rule("tenant:*", ClassLimits::new(50, 200))?
///     .rule("app:*", ClassLimits::new(5, 0))?
///     .rule("app:premium-*", ClassLimits::new(20, 0))?
///     .rule("global", ClassLimits::new(1000, 0))?;
/// assert_eq!(policy.resolve("app:chat", None), Limit::Limited(5));
/// assert_eq!(policy.resolve("app:premium-chat", None), Limit::Limited(20));
/// assert_eq!(policy.resolve("tenant:t1", Some(500)), Limit::Limited(200), "capped by its class");
/// assert_eq!(policy.resolve("global", None), Limit::Limited(1000));
/// assert_eq!(policy.resolve("user:7", None), Limit::Unlimited);
/// assert_eq!(policy.rule_for("app:premium-chat").map(|rule| rule.pattern()), Some("app:premium-*"));
/// assert!(policy.rule_for("user:7").is_none(), "no class: the defaults");
/// # Ok::<(), inflight::PolicyError>(())
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Policy {
    default: ClassLimits,
    default_floors: Floors,
    /// Most specific first.
    rules: Vec<Rule>,
}

impl Policy {
    /// A policy with no rules: every key has this default and ceiling (0 = none).
    pub const fn new(default_limit: u32, max_limit: u32) -> Self {
        Self {
            default: ClassLimits::new(default_limit, max_limit),
            default_floors: Floors::NONE,
            rules: Vec::new(),
        }
    }

    /// The policy with `floors` for the keys of the rule whose pattern is `pattern` (`None`: the keys no
    /// rule matches): see [`Floors`].
    ///
    /// ```
    /// use inflight::{ClassLimits, Floors, Policy};
    ///
    /// let policy = Policy::new(0, 0)
    ///     .rule("model:*", ClassLimits::new(10, 0))?
    ///     .floors(Some("model:*"), Floors::new(&[(9, 4)])?)?;
    /// assert_eq!(policy.floors_of("model:llama").of(9), 4);
    /// # Ok::<(), inflight::PolicyError>(())
    /// ```
    pub fn floors(mut self, pattern: Option<&str>, floors: Floors) -> Result<Self, PolicyError> {
        let Some(pattern) = pattern else {
            self.default_floors = floors;
            return Ok(self);
        };
        let rule = self.rules.iter_mut().find(|rule| &*rule.pattern == pattern);
        let no_rule = || PolicyError::new(format!("no rule for the keys {pattern:?}"));
        rule.ok_or_else(no_rule)?.floors = floors;
        Ok(self)
    }

    /// The policy with the rule whose pattern is `pattern` in shadow mode (`shadow`) or enforcing: a
    /// shadow rule's limits are watched, not enforced. An admission past one is admitted, and the limiter
    /// tells of it ([`crate::LimiterBuilder::on_shadow_refusal`]), so that a new limit can be watched
    /// before it is enforced. A key's override is then watched too; a permit on several keys is refused
    /// only by the keys whose rules enforce. (The Dify layout has no shadow mode: it refuses such
    /// admissions as unsupported.)
    ///
    /// ```
    /// use inflight::{ClassLimits, Limiter, MemoryStore, Policy};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), inflight::PolicyError> {
    /// let policy = Policy::new(0, 0).rule("app:*", ClassLimits::new(1, 0))?.shadow("app:*", true)?;
    /// let limiter = Limiter::builder(MemoryStore::new()).policy(policy).build();
    /// let first = limiter.try_acquire("app:a1").await.unwrap();
    /// let second = limiter.try_acquire("app:a1").await.expect("admitted past a shadow limit");
    /// assert_eq!(limiter.stats().shadow_refusals.load(std::sync::atomic::Ordering::Relaxed), 1);
    /// # drop((first, second));
    /// # Ok(())
    /// # }
    /// ```
    pub fn shadow(mut self, pattern: &str, shadow: bool) -> Result<Self, PolicyError> {
        let rule = self.rules.iter_mut().find(|rule| &*rule.pattern == pattern);
        let no_rule = || PolicyError::new(format!("no rule for the keys {pattern:?}"));
        rule.ok_or_else(no_rule)?.shadow = shadow;
        Ok(self)
    }

    /// True when some rule is in shadow mode.
    pub fn has_shadow(&self) -> bool {
        self.rules.iter().any(|rule| rule.shadow)
    }

    /// The floors of `key`'s class.
    pub fn floors_of(&self, key: &str) -> Floors {
        self.rule_for(key)
            .map_or(self.default_floors, |rule| rule.floors)
    }

    /// True when some class has floors.
    pub fn has_floors(&self) -> bool {
        !self.default_floors.is_empty() || self.rules.iter().any(|rule| !rule.floors.is_empty())
    }

    /// The policy with one more rule: the keys matching `pattern` have `limits`.
    pub fn rule(mut self, pattern: &str, limits: ClassLimits) -> Result<Self, PolicyError> {
        if self.rules.len() >= MAX_RULES {
            return Err(PolicyError::new(format!("at most {MAX_RULES} rules")));
        }
        if self.rules.iter().any(|rule| &*rule.pattern == pattern) {
            return Err(PolicyError::new(format!(
                "two rules for the keys {pattern:?}"
            )));
        }
        let rule = Rule::new(pattern, limits)?;
        // After every rule at least as specific: the most specific first, ties in the order given.
        let at = self
            .rules
            .partition_point(|other| other.specificity() >= rule.specificity());
        self.rules.insert(at, rule);
        Ok(self)
    }

    /// The limits of keys that match no rule.
    pub fn default_limits(&self) -> ClassLimits {
        self.default
    }

    /// The rules, the most specific first.
    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }

    /// The limits of `key`'s class.
    #[inline]
    pub fn limits(&self, key: &str) -> ClassLimits {
        self.rule_for(key).map_or(self.default, |rule| rule.limits)
    }

    /// The rule of `key`'s class; `None` when no rule matches it (it has the defaults).
    #[inline]
    pub fn rule_for(&self, key: &str) -> Option<&Rule> {
        self.rules.iter().find(|rule| rule.matches(key))
    }

    /// The name of `key`'s class, as metrics and refusals name it: its rule's pattern (`app:*`), or
    /// `default` when no rule matches it.
    ///
    /// ```
    /// use inflight::{ClassLimits, Policy};
    ///
    /// let policy = Policy::new(10, 0).rule("app:*", ClassLimits::new(5, 0)).unwrap();
    /// assert_eq!(policy.class_of("app:a1"), "app:*");
    /// assert_eq!(policy.class_of("tenant:t1"), "default");
    /// ```
    pub fn class_of(&self, key: &str) -> &str {
        self.rule_for(key).map_or("default", Rule::pattern)
    }

    /// The effective limit of `key` with the override `override_limit`.
    pub fn resolve(&self, key: &str, override_limit: Option<u32>) -> Limit {
        self.limits(key).resolve(override_limit)
    }

    /// True when no key is limited unless it has an override.
    pub fn is_unlimited_by_default(&self) -> bool {
        self.default.is_unlimited() && self.rules.iter().all(|rule| rule.limits.is_unlimited())
    }
}

/// A [`Policy`] that can be replaced while limiters use it (a reload), shared by its clones. A permit
/// already held stays held; the new policy applies from the next admission on.
#[derive(Clone, Debug, Default)]
pub struct SharedPolicy(Arc<Shared>);

/// The policy, and what an admission needs of a policy without rules, read without its lock.
#[derive(Debug, Default)]
struct Shared {
    policy: RwLock<Arc<Policy>>,
    /// True while the policy has rules: a key's limits are then looked up under the lock.
    ruled: AtomicBool,
    /// True while some class has floors.
    floored: AtomicBool,
    /// True while some rule is in shadow mode.
    shadowed: AtomicBool,
    /// The limits of every key while the policy has no rules ([`pack`]).
    plain: AtomicU64,
    /// Told of every replacement: waiters ask again at once, since a new limit may admit them.
    replaced: tokio::sync::Notify,
}

/// A class's limits in one word, so that a reader sees both of the same policy.
fn pack(limits: ClassLimits) -> u64 {
    u64::from(limits.default_limit) | u64::from(limits.max_limit) << 32
}

fn unpack(packed: u64) -> ClassLimits {
    ClassLimits::new(packed as u32, (packed >> 32) as u32)
}

impl SharedPolicy {
    /// A shared policy, `policy` for now.
    pub fn new(policy: Policy) -> Self {
        let shared = Self::default();
        shared.set(policy);
        shared
    }

    /// The policy now.
    pub fn get(&self) -> Arc<Policy> {
        self.read().clone()
    }

    /// Replaces the policy for every limiter that shares it.
    pub fn set(&self, policy: Policy) {
        let shared = &self.0;
        let mut current = shared.policy.write().unwrap_or_else(|e| e.into_inner());
        // Under the lock, so that concurrent replacements leave these as the last one's. A reader that
        // finds no rules sees the defaults stored before `ruled` was cleared.
        shared.floored.store(policy.has_floors(), Ordering::Release);
        shared
            .shadowed
            .store(policy.has_shadow(), Ordering::Release);
        if policy.rules.is_empty() {
            shared.plain.store(pack(policy.default), Ordering::Relaxed);
            shared.ruled.store(false, Ordering::Release);
        } else {
            shared.ruled.store(true, Ordering::Release);
        }
        *current = Arc::new(policy);
        drop(current);
        shared.replaced.notify_waiters();
    }

    /// Completes at the next replacement of the policy after it is enabled or first polled.
    pub(crate) fn replaced(&self) -> tokio::sync::futures::Notified<'_> {
        self.0.replaced.notified()
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Arc<Policy>> {
        self.0.policy.read().unwrap_or_else(|e| e.into_inner())
    }

    /// The limits of each key of `keys` under the policy now, in order, into `out`: a policy without
    /// rules (every key has its defaults) is read without taking its lock.
    #[inline]
    pub(crate) fn limits_into<K: AsRef<str>>(&self, keys: &[K], out: &mut [ClassLimits]) {
        let policy = self.0.ruled.load(Ordering::Acquire).then(|| self.read());
        let plain = unpack(self.0.plain.load(Ordering::Relaxed));
        for (limits, key) in out.iter_mut().zip(keys) {
            *limits = policy
                .as_ref()
                .map_or(plain, |policy| policy.limits(key.as_ref()));
        }
    }

    /// The floors of each key of `keys` under the policy now, in order; `None` (one load, nothing made)
    /// when no class has floors, or none of these keys' classes.
    #[inline]
    pub(crate) fn floors_of<K: AsRef<str>>(&self, keys: &[K]) -> Option<Arc<[Floors]>> {
        if !self.0.floored.load(Ordering::Acquire) {
            return None;
        }
        let policy = self.read();
        let floors: Arc<[Floors]> = keys
            .iter()
            .map(|key| policy.floors_of(key.as_ref()))
            .collect();
        floors.iter().any(|f| !f.is_empty()).then_some(floors)
    }

    /// Which of `keys` (bit i: key i) have classes in shadow mode under the policy now; 0 (one load)
    /// when no rule is.
    #[inline]
    pub(crate) fn shadow_of<K: AsRef<str>>(&self, keys: &[K]) -> u32 {
        if !self.0.shadowed.load(Ordering::Acquire) {
            return 0;
        }
        let policy = self.read();
        keys.iter()
            .enumerate()
            .filter(|(_, key)| policy.rule_for(key.as_ref()).is_some_and(Rule::is_shadow))
            .fold(0, |mask, (i, _)| mask | 1 << i)
    }

    /// The limits of `key`'s class under the policy now.
    #[inline]
    pub(crate) fn limits(&self, key: &str) -> ClassLimits {
        let mut limits = [ClassLimits::default()];
        self.limits_into(&[key], &mut limits);
        limits[0]
    }
}

impl From<Policy> for SharedPolicy {
    fn from(policy: Policy) -> Self {
        Self::new(policy)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replaced_policy_gives_its_own_limits_with_rules_or_without() {
        let shared = SharedPolicy::default();
        assert_eq!(shared.limits("a:1"), ClassLimits::new(0, 0));
        shared.set(Policy::new(u32::MAX, 7));
        assert_eq!(shared.limits("a:1"), ClassLimits::new(u32::MAX, 7));
        let ruled = Policy::new(3, 0)
            .rule("a:*", ClassLimits::new(5, 9))
            .expect("a rule");
        shared.set(ruled);
        let mut limits = [ClassLimits::default(); 2];
        shared.limits_into(&["a:1", "b:1"], &mut limits);
        assert_eq!(limits, [ClassLimits::new(5, 9), ClassLimits::new(3, 0)]);
        shared.set(Policy::new(4, 0));
        shared.limits_into(&["a:1", "b:1"], &mut limits);
        assert_eq!(
            limits,
            [ClassLimits::new(4, 0); 2],
            "the rules went with their policy"
        );
        assert_eq!(
            SharedPolicy::new(Policy::new(2, 6)).limits("x"),
            ClassLimits::new(2, 6)
        );
    }
}
