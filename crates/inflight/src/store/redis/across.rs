//! Redis Cluster: operations whose keys are in different slots, which no one script may touch.
//!
//! An admission on keys of several slots takes them slot group by slot group, in slot order (the keys
//! of one slot in one script, atomically). When a group refuses, the groups taken before it are
//! released before the refusal is answered: the limit is never passed and a refused admission holds
//! nothing, but while it rolls back a concurrent admission on those keys may be refused (for one round
//! trip). The fixed order means two admissions on the same keys never hold one each and refuse each
//! other. Keys that share a hash tag share a slot (`{t1}:app:a1` and `{t1}:tenant`) and one script.
//!
//! A waiter takes its ticket in the queue of the key that refuses it, in its group's script, and leaves
//! the queues of the groups after it (those before it admitted it, which took its ticket out there).
//!
//! A release goes to every group; a renewal renews every group and answers as one (held where any
//! group held it). Overrides and their index (in a slot of its own) follow `index.lua`'s order.

use std::sync::Arc;

use super::answer::{decision, Answer};
use super::connect::slot;
use super::naming::KeyNames;
use super::overrides;
use super::records::Op;
use super::store::{number, wait_args, RedisStore};
use crate::error::StoreError;
use crate::id::PermitId;
use crate::policy::ClassLimits;
use crate::store::{AcquireRequest, KeyStatus, OverrideChange, RenewRequest, Renewal};

/// The indices of `names` grouped by slot, groups in slot order, each in the request's order (so the
/// group of the first key starts with it); one group when every key shares a slot.
pub(super) fn groups(names: &[KeyNames]) -> Vec<Vec<usize>> {
    let mut slotted: Vec<(u16, usize)> = names
        .iter()
        .enumerate()
        .map(|(i, names)| (slot(names.tag().as_bytes()), i))
        .collect();
    slotted.sort_unstable();
    slotted
        .chunk_by(|a, b| a.0 == b.0)
        .map(|group| group.iter().map(|&(_, i)| i).collect())
        .collect()
}

/// A group an admission took: its keys' places, the token it gave, and what the id held there before
/// (`weight lease_ms token`; weight 0: nothing).
type Taken<'a> = (&'a [usize], u64, [u64; 3]);

fn pick<T: Clone>(all: &[T], group: &[usize]) -> Vec<T> {
    group.iter().map(|&i| all[i].clone()).collect()
}

impl RedisStore {
    /// On a cluster, the slot groups of `names` when they span more than one slot.
    pub(super) fn across(&self, names: &[KeyNames]) -> Option<Vec<Vec<usize>>> {
        if !self.conn.is_cluster() || names.len() < 2 {
            return None;
        }
        let groups = groups(names);
        (groups.len() > 1).then_some(groups)
    }

    /// An admission on keys of several slots (see the module's doc); answered as `batch.lua` answers
    /// one admission.
    pub(super) async fn acquire_across(
        &self,
        names: Vec<KeyNames>,
        groups: Vec<Vec<usize>>,
        req: &AcquireRequest<'_>,
        terms: (u32, u64, Vec<ClassLimits>),
    ) -> Result<Answer, StoreError> {
        let (weight, lease_ms, limits) = terms;
        let (id, generated) = (req.id, req.generated);
        // Each group taken, with the token it gave and what the id held there before.
        let mut taken: Vec<Taken> = Vec::new();
        let (mut reclaimed, mut first, mut expires_at_ms, mut token) = (0, None, 0, 0);
        let mut expired = 0; // tickets found expired on the way
        let mut counted = 0i64; // bit i: key i recorded the lease
        let mut shadowed = 0i64; // bit i: key i went past its shadow limit
        for (g, group) in groups.iter().enumerate() {
            let floors = match req.floors.is_empty() {
                true => Vec::new(),
                false => pick(req.floors, group),
            };
            let op = Op::Acquire {
                names: pick(&names, group),
                id: id.clone(),
                terms: (weight, lease_ms, pick(&limits, group)),
                keep: token,
                generated,
                wait: wait_args(req, &floors),
                holder: req.holder.map(Box::from),
                shadow: group
                    .iter()
                    .enumerate()
                    .filter(|(_, &i)| req.shadow >> i & 1 == 1)
                    .fold(0, |mask, (j, _)| mask | 1 << j),
            };
            let reply = match self.batcher.admit(op).await {
                Ok(reply) => reply,
                Err(error) => {
                    // Perhaps taken before the answer was lost, by a token not known here: the others
                    // are given back, and this group's lease expires (its id names no lease of another
                    // admission: it may be a held one's).
                    self.roll_back(&names, &taken, id).await;
                    return Err(error);
                }
            };
            reclaimed += reply.reclaimed;
            expired += reply.tickets_expired;
            match reply.decision {
                decision::ADMITTED => {
                    for (j, &i) in group.iter().enumerate() {
                        if reply.counted >> j & 1 == 1 {
                            counted |= 1 << i;
                        }
                        if reply.shadowed >> j & 1 == 1 {
                            shadowed |= 1 << i;
                        }
                    }
                    let before = reply.held.map(|n| n.max(0).unsigned_abs());
                    let given = reply.token.max(0).unsigned_abs();
                    taken.push((group, given, before));
                    expires_at_ms = reply.expires_at_ms;
                    // The permit's token is its first group's (in slot order), kept by the others.
                    if token == 0 {
                        token = given;
                    }
                    if group[0] == 0 {
                        first = Some((reply.limit, reply.in_flight));
                    }
                }
                decision::UNLIMITED => {}
                refused => {
                    self.roll_back(&names, &taken, id).await;
                    if let (decision::WAITS, Some(ticket)) = (refused, &req.ticket) {
                        // Its ticket waits here: a place an earlier refusal gave it further on goes.
                        self.leave_across(&names, &groups[g + 1..], ticket.name)
                            .await?;
                    }
                    let index = group[usize::try_from(reply.index).unwrap_or(0)];
                    return Ok(Answer {
                        index: index as i64,
                        reclaimed,
                        tickets_expired: expired,
                        ..reply
                    });
                }
            }
        }
        if taken.is_empty() {
            let unlimited = Answer {
                decision: decision::UNLIMITED,
                index: -1,
                reclaimed,
                tickets_expired: expired,
                ..Answer::default()
            };
            return Ok(unlimited);
        }
        // The first key's figures; (0, 0) when its own group was unlimited.
        let (limit, in_flight) = first.unwrap_or((0, 0));
        Ok(Answer {
            decision: decision::ADMITTED,
            index: -1,
            limit,
            in_flight,
            expires_at_ms,
            reclaimed,
            token: i64::try_from(token).unwrap_or(i64::MAX),
            held: [0; 3],
            counted,
            tickets_expired: expired,
            shadowed,
        })
    }

    /// Undoes what a refused admission took: each group's lease removed, or what the id held there
    /// before put back; a later admission's lease of the id stays. An undo that fails leaves its lease to
    /// expire.
    async fn roll_back(&self, names: &[KeyNames], taken: &[Taken<'_>], id: &PermitId) {
        let releases = taken.iter().map(|&(group, token, before)| {
            self.batcher.run(Op::Undo {
                names: pick(names, group),
                id: id.clone(),
                token,
                before,
            })
        });
        for result in futures_util::future::join_all(releases).await {
            if let Err(error) = result {
                tracing::warn!(%error, "a refused admission across slots could not give back a slot; its lease will expire");
            }
        }
    }

    /// A waiter gives up its ticket in the queues of the keys of `groups`; whether any held it.
    pub(super) async fn leave_across(
        &self,
        names: &[KeyNames],
        groups: &[Vec<usize>],
        ticket: &str,
    ) -> Result<bool, StoreError> {
        let leaves = groups.iter().map(|group| {
            let ticket = ticket.to_owned();
            self.batcher.run(Op::Leave {
                names: pick(names, group),
                ticket,
                handed: None,
            })
        });
        let mut left = false;
        for result in futures_util::future::join_all(leaves).await {
            left |= result?;
        }
        Ok(left)
    }

    /// A release from every group; true when any held a live lease.
    pub(super) async fn release_across(
        &self,
        names: Vec<KeyNames>,
        groups: Vec<Vec<usize>>,
        id: &PermitId,
        token: u64,
    ) -> Result<bool, StoreError> {
        let releases = groups.iter().map(|group| {
            self.batcher.run(Op::Release {
                names: pick(&names, group),
                id: id.clone(),
                token,
            })
        });
        let mut released = false;
        for result in futures_util::future::join_all(releases).await {
            released |= result?;
        }
        Ok(released)
    }

    /// A renewal of keys of several slots: every group renewed in one call each. Held where any group
    /// held it (then taken again, where there is room, on the groups that lost it: a held permit stays
    /// held), unless a group that recorded it at admission lost it and has no room (lost); otherwise
    /// re-added when every group could re-add it, and lost (what was re-added given back) when one
    /// could not, as one script decides on one server.
    pub(super) async fn renew_across(
        &self,
        req: &RenewRequest,
        groups: Vec<Vec<usize>>,
    ) -> Result<Renewal, StoreError> {
        // Which keys of a group recorded the lease at admission, as the group's own bits.
        let counted = |group: &[usize]| -> u32 {
            let bits = group.iter().enumerate();
            bits.map(|(j, &i)| (req.counted >> i & 1) << j).sum()
        };
        let renew = |group: &Vec<usize>, readd: Option<u32>| {
            let keys: Vec<Arc<str>> = pick(&req.keys, group);
            let limits = pick(&req.limits, group);
            let terms = (readd, counted(group));
            async move { self.renew_keys(&keys, &limits, req, terms).await }
        };
        let mut outcomes =
            futures_util::future::try_join_all(groups.iter().map(|g| renew(g, None))).await?;
        let held = outcomes.iter().find_map(|(renewal, held)| match renewal {
            Renewal::Renewed(grant) if *held => Some(grant.weight),
            _ => None,
        });
        if let Some(weight) = held {
            let lost: Vec<usize> = (0..groups.len())
                .filter(|&i| outcomes[i].0 == Renewal::Lost)
                .collect();
            let again = lost.iter().map(|&i| renew(&groups[i], Some(weight)));
            for (i, outcome) in lost
                .iter()
                .zip(futures_util::future::try_join_all(again).await?)
            {
                outcomes[*i] = outcome;
            }
        }
        let grant = |renewal: &Renewal| match renewal {
            Renewal::Renewed(grant) | Renewal::Readded(grant) => Some(*grant),
            Renewal::Lost => None,
        };
        let first = groups.iter().position(|group| group[0] == 0).unwrap_or(0);
        let chosen =
            grant(&outcomes[first].0).or_else(|| outcomes.iter().find_map(|(r, _)| grant(r)));
        let lost = outcomes.iter().any(|(r, _)| *r == Renewal::Lost);
        let readded = outcomes
            .iter()
            .any(|(r, _)| matches!(r, Renewal::Readded(_)));
        // Gone, with no room to take it back, from a group that recorded it at admission: it lapsed
        // there alone (its slot out of reach for a lease), and the permit is no longer counted there.
        let lapsed = (groups.iter().zip(&outcomes))
            .any(|(group, (r, _))| *r == Renewal::Lost && counted(group) != 0);
        match chosen {
            Some(grant) if held.is_some() && !lapsed => Ok(Renewal::Renewed(grant)),
            Some(grant) if !lost && readded => Ok(Renewal::Readded(grant)),
            // Every group unlimited: nothing recorded, nothing to lose.
            Some(grant) if !lost => Ok(Renewal::Renewed(grant)),
            _ => {
                let readded: Vec<Taken> = groups
                    .iter()
                    .zip(&outcomes)
                    .filter_map(|(group, (r, _))| match r {
                        Renewal::Readded(grant) => Some((group.as_slice(), grant.token, [0; 3])),
                        _ => None,
                    })
                    .collect();
                self.roll_back(&self.names(&req.keys), &readded, &req.id)
                    .await;
                Ok(Renewal::Lost)
            }
        }
    }

    /// Status on a cluster: the override in the key's slot, the index in its own, in the order that
    /// keeps the index a superset of the keys with an override (`index.lua`).
    pub(super) async fn status_cluster(
        &self,
        key: &str,
        limits: ClassLimits,
        change: OverrideChange,
    ) -> Result<KeyStatus, StoreError> {
        // The view of this process hears of the change at once, as of the index's version it left.
        match change {
            OverrideChange::Keep => Ok(self.status_in_slot(key, limits, change).await?.0),
            OverrideChange::Set(n) => {
                self.index_change('+', key, n).await?;
                let (status, _) = self.status_in_slot(key, limits, change).await?;
                // Again: a concurrent clear may have removed it between the two steps.
                let version = self.index_change('+', key, n).await?;
                self.view.note(key, true, version);
                Ok(status)
            }
            OverrideChange::Clear => {
                let (status, _) = self.status_in_slot(key, limits, change).await?;
                let mut noted = (false, self.index_change('-', key, 0).await?);
                // A concurrent set may have set it again after its own index step: add it back.
                let (now, _) = self
                    .status_in_slot(key, limits, OverrideChange::Keep)
                    .await?;
                if let Some(n) = now.override_limit {
                    noted = (true, self.index_change('+', key, n).await?);
                }
                self.view.note(key, noted.0, noted.1);
                Ok(status)
            }
        }
    }

    /// Changes the index of overrides (`index.lua`); its version after the change.
    async fn index_change(&self, op: char, key: &str, value: u32) -> Result<u64, StoreError> {
        let names = &self.overrides;
        match overrides::change(&self.conn, names, self.max_overrides, op, key, value).await? {
            Some(version) => Ok(version),
            None => {
                let max = number(i64::try_from(self.max_overrides).unwrap_or(i64::MAX))?;
                Err(StoreError::TooManyOverrides { max })
            }
        }
    }
}
