//! The core's steps for the writer's records beside the prefix: the
//! names listed after a writer transaction (ACLs on), and the record of a
//! key the token may not read, whose state is held for it.

use crate::decision::phase::Pending;
use crate::decision::phase::{ConfirmStep, Consistency, Phase};
use crate::decision::protocol::{Delay, Next, Request};
use crate::decision::protocol::{KeyRead, Note, Output};
use crate::decision::Core;
use crate::model::identity::validate_identity;
use crate::model::meta::{parse_meta, KeyMeta};
use crate::model::value::{parse_value, AdminState};

impl Core {
    /// The names of the writer's records: those the answer does not show
    /// and the state served does not hold (a key hidden from the token, or
    /// a record left by a key deleted by hand) are read directly, like a
    /// key the state holds that the answer lacks.
    pub(super) fn on_record_names(
        &mut self,
        mut p: Box<Pending>,
        consistency: Consistency,
        names: Option<Vec<Box<str>>>,
        index: Option<u64>,
        now: u64,
        out: &mut Output,
    ) -> Next {
        // A stale server that has not applied the writer's transaction yet
        // (the records' index below the generation's; also a transaction
        // that wrote no record): ask the leader.
        if consistency.is_stale() && index.is_none_or(|i| i < p.view.generation_index) {
            self.phase = Phase::Confirming {
                pending: p,
                step: ConfirmStep::RecordNames {
                    consistency: Consistency::Default,
                },
            };
            return Next {
                request: Request::RecordNames { stale: false },
                delay: Delay::None,
            };
        }
        let denied = names.is_none();
        let served = self.served.as_deref();
        let unknown: Vec<Box<str>> = names
            .unwrap_or_default()
            .into_iter()
            .filter(|k| {
                validate_identity(k).is_ok()
                    && !p.view.keys.contains_key(k)
                    && !served.is_some_and(|s| s.keys.contains_key(k))
                    && !p.to_probe.contains(k)
            })
            .collect();
        p.listed = true;
        out.notes.push(Note::RecordsListed {
            unknown: unknown.len(),
            denied,
        });
        p.named.extend(unknown.iter().cloned());
        p.to_probe.extend(unknown);
        self.proceed(p, now, out)
    }

    /// The writer's record of a key probed 403 that the state never held:
    /// the state it names is held for the key. Without one (the writer
    /// deleted the key and its record since the names were listed, or the
    /// store changed) nothing is known of the key: it is left out, as a
    /// key no record names, rather than held with no value (which answers
    /// nothing and would keep HAProxy's state, a `ready` say, over the
    /// next identity's drain).
    pub(super) fn on_record(
        &mut self,
        mut p: Box<Pending>,
        key: Box<str>,
        never_held: bool,
        read: KeyRead,
        now: u64,
        out: &mut Output,
    ) -> Next {
        let state = match read {
            KeyRead::Present(pair) => parse_meta(&pair.value)
                .ok()
                .as_ref()
                .and_then(Core::record_state),
            KeyRead::Absent | KeyRead::Forbidden => None,
        };
        match state {
            Some(state) => {
                p.written.insert(key, state);
            }
            // A key held hidden keeps what it holds.
            None if !never_held => {}
            None => {
                p.probes.remove(&key);
            }
        }
        self.proceed(p, now, out)
    }

    /// The state a writer record names (its `value`), if valid.
    pub(super) fn record_state(meta: &KeyMeta) -> Option<AdminState> {
        parse_value(meta.value.as_bytes()).ok()
    }
}
