//! A batch's operations as the scripts take them: one record each (`batch.lua` says how), which
//! `lone.lua` takes too when it is alone and simple (`Op::lone`).

use std::collections::HashMap;
use std::fmt::Write;

use super::answer::Answer;
use super::naming::{KeyNames, Member};
use crate::id::PermitId;
use crate::policy::ClassLimits;

/// One operation for `batch.lua`.
pub(super) enum Op {
    Acquire {
        names: Vec<KeyNames>,
        id: PermitId,
        /// `weight lease_ms` and the limits of each key's class, as `batch.lua` reads them.
        terms: (u32, u64, Vec<ClassLimits>),
        /// The token the lease keeps: 0, the one the admission gets (across Cluster slots, the first
        /// slot's, so that one token names the permit's lease on every slot).
        keep: u64,
        /// The id was generated for this admission (`AcquireRequest::generated`).
        generated: bool,
        /// A waiter's ticket (`AcquireRequest::ticket`): kept in the refusing key's queue.
        wait: Option<WaitArgs>,
        /// The label of the lease and ticket (`AcquireRequest::holder`; flags 16).
        holder: Option<Box<str>>,
        /// Which keys' limits are watched, not enforced (`AcquireRequest::shadow`; flags 32).
        shadow: u32,
    },
    /// A waiter gives up its ticket on these keys; with its id (`handed`), a lease a release handed it
    /// is released when the ticket is no longer queued.
    Leave {
        names: Vec<KeyNames>,
        ticket: String,
        handed: Option<PermitId>,
    },
    /// A release of the lease the admission that got `token` (0: any) holds.
    Release {
        names: Vec<KeyNames>,
        id: PermitId,
        token: u64,
    },
    /// Undoes on these keys the admission that got `token`: puts back what the id held before it
    /// (`weight lease_ms token`; weight 0: nothing, the lease is removed).
    Undo {
        names: Vec<KeyNames>,
        id: PermitId,
        token: u64,
        before: [u64; 3],
    },
}

/// An admission's standing, as `batch.lua` takes it (flags 2 and 4): a waiter's ticket (`""`: none), its
/// priority and flow, and its keys' floors: `"p:slots p:slots;..."`, one group per key in order (`""`:
/// none).
pub(super) struct WaitArgs {
    pub(super) ticket: String,
    /// A release may hand the waiter the slot (`Ticket::handoff`; flags 8).
    pub(super) handoff: bool,
    pub(super) priority: u8,
    pub(super) flow: String,
    pub(super) flow_weight: u32,
    pub(super) lease_ms: u64,
    pub(super) floors: String,
}

impl Op {
    pub(super) fn names(&self) -> &[KeyNames] {
        match self {
            Op::Acquire { names, .. }
            | Op::Release { names, .. }
            | Op::Undo { names, .. }
            | Op::Leave { names, .. } => names,
        }
    }

    /// How many numbers `batch.lua` answers it with.
    pub(super) fn reply_len(&self) -> usize {
        match self {
            Op::Acquire { .. } => Answer::LEN,
            Op::Release { .. } | Op::Undo { .. } | Op::Leave { .. } => 1,
        }
    }

    /// Whether `lone.lua` may take it: an admission or a release on one key, the admission without a
    /// standing and keeping the token it gets.
    pub(super) fn lone(&self) -> bool {
        match self {
            Op::Acquire {
                names,
                wait,
                keep,
                holder,
                shadow,
                ..
            } => {
                names.len() == 1 && wait.is_none() && *keep == 0 && holder.is_none() && *shadow == 0
            }
            Op::Release { names, .. } => names.len() == 1,
            Op::Undo { .. } | Op::Leave { .. } => false,
        }
    }

    /// Its record's kind and flags (see `batch.lua`).
    pub(super) fn kind(&self) -> (char, u8) {
        match self {
            Op::Acquire {
                generated,
                wait,
                holder,
                shadow,
                ..
            } => {
                let standing = match wait {
                    Some(WaitArgs { floors, .. }) if !floors.is_empty() => 6,
                    Some(WaitArgs { handoff: true, .. }) => 10,
                    Some(_) => 2,
                    None => 0,
                };
                let labelled = if holder.is_some() { 16 } else { 0 };
                let watched = if *shadow != 0 { 32 } else { 0 };
                ('a', u8::from(*generated) | standing | labelled | watched)
            }
            Op::Release { .. } => ('r', 0),
            Op::Undo { .. } => ('u', 0),
            Op::Leave { handed, .. } => ('l', if handed.is_some() { 8 } else { 0 }),
        }
    }
}

/// A record's head: its kind and flags (hex), and the number of its keys when it has several
/// (`batch.lua`).
struct Head(char, u8, usize);

impl redis::ToRedisArgs for Head {
    fn write_redis_args<W: ?Sized + redis::RedisWrite>(&self, out: &mut W) {
        match self {
            Head(kind, flags, 1) => out.write_arg_fmt(format_args!("{kind}{flags:x}")),
            Head(kind, flags, n) => out.write_arg_fmt(format_args!("{kind}{flags:x}x{n}")),
        }
    }
}

/// An admission's terms and the token its lease keeps, as one argument written straight into the command.
struct Terms<'a>(&'a (u32, u64, Vec<ClassLimits>), u64);

impl redis::ToRedisArgs for Terms<'_> {
    fn write_redis_args<W: ?Sized + redis::RedisWrite>(&self, out: &mut W) {
        let ((weight, lease_ms, limits), keep) = (self.0, self.1);
        if let [limits] = limits.as_slice() {
            let (default_limit, max_limit) = (limits.default_limit, limits.max_limit);
            out.write_arg_fmt(format_args!(
                "{weight} {lease_ms} {keep} {default_limit} {max_limit}"
            ));
            return;
        }
        let mut terms = format!("{weight} {lease_ms} {keep}");
        for limits in limits {
            let (default_limit, max_limit) = (limits.default_limit, limits.max_limit);
            let _ = write!(terms, " {default_limit} {max_limit}");
        }
        out.write_arg(terms.as_bytes());
    }
}

/// The call of `script` with these operations' records.
pub(super) fn records<'a, 'b>(
    script: &'a redis::Script,
    offset: i64,
    ops: impl IntoIterator<Item = &'b Op>,
) -> redis::ScriptInvocation<'a> {
    let mut invocation = script.prepare_invoke();
    invocation.arg(offset);
    let mut places: HashMap<&str, usize> = HashMap::new();
    for op in ops {
        let names = op.names();
        let (kind, flags) = op.kind();
        invocation.arg(Head(kind, flags, names.len()));
        for key in names {
            let next = places.len() + 1;
            let place = *places.entry(key.tag()).or_insert_with(|| {
                key.declare(&mut invocation);
                next
            });
            invocation.arg(place);
        }
        match op {
            Op::Acquire {
                id,
                terms,
                keep,
                wait,
                holder,
                shadow,
                ..
            } => {
                invocation.arg(Member(id)).arg(Terms(terms, *keep));
                if let Some(wait) = wait {
                    let level = format!("{}:{}", wait.priority, wait.flow_weight.max(1));
                    invocation
                        .arg(&wait.ticket)
                        .arg(level)
                        .arg(&wait.flow)
                        .arg(wait.lease_ms);
                    if !wait.floors.is_empty() {
                        invocation.arg(&wait.floors);
                    }
                }
                if let Some(holder) = holder {
                    invocation.arg(&**holder);
                }
                if *shadow != 0 {
                    invocation.arg(*shadow);
                }
            }
            Op::Release { id, token, .. } => {
                invocation.arg(Member(id)).arg(token);
            }
            Op::Undo {
                id, token, before, ..
            } => {
                let [weight, lease_ms, old] = before;
                invocation
                    .arg(Member(id))
                    .arg(token)
                    .arg(format!("{weight} {lease_ms} {old}"));
            }
            Op::Leave { ticket, handed, .. } => {
                invocation.arg(ticket);
                if let Some(id) = handed {
                    invocation.arg(Member(id));
                }
            }
        }
    }
    invocation
}
