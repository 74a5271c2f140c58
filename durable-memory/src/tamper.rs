//! Tampering behind the store's back, for the conformance suite's tampering cases
//! (`durable_conformance::tamper`): each [`Tamper`] changes the rows the way an
//! `UPDATE` or `DELETE` would change a SQL backend's tables, seals untouched, and the
//! store's next read must see it. Only with the `testing` feature.

use async_trait::async_trait;
use durable_conformance::tamper::{Tamper, Tamperer};
use durable_core::store::CallStatus;
use durable_core::{CallId, SessionId};

use crate::MemoryStore;
use crate::state::{Session, State};

/// Changes a [`MemoryStore`]'s rows directly ([`MemoryStore::tamperer`]).
#[derive(Debug, Clone)]
pub struct MemoryTamperer(MemoryStore);

impl MemoryStore {
    /// A [`Tamperer`] of this store's rows, for the tampering cases.
    pub fn tamperer(&self) -> MemoryTamperer {
        MemoryTamperer(self.clone())
    }
}

fn session<'s>(state: &'s mut State, id: &SessionId) -> &'s mut Session {
    state
        .sessions
        .get_mut(id)
        .unwrap_or_else(|| panic!("tamper: no session `{id}`"))
}

fn row<'s>(state: &'s mut State, call: &CallId) -> &'s mut crate::state::CallRow {
    let id = state
        .calls
        .get(call)
        .cloned()
        .expect("tamper: no such call");
    session(state, &id)
        .journal
        .iter_mut()
        .find(|r| r.record.id == *call)
        .expect("tamper: no such call")
}

fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text).expect("tamper: JSON text")
}

#[async_trait]
impl Tamperer for MemoryTamperer {
    async fn apply(&self, tamper: Tamper) {
        let mut state = self.0.lock();
        let state = &mut *state;
        match tamper {
            Tamper::SetInputHash { call, input_hash } => {
                row(state, &call).record.identity.input_hash = input_hash;
            }
            Tamper::ForgetOutcome { call } => {
                let r = &mut row(state, &call).record;
                r.status = CallStatus::NotHappened;
                r.result = None;
                r.mac = None;
            }
            Tamper::SetResult { call, result } => {
                row(state, &call).record.result = Some(json(&result));
            }
            Tamper::DeleteCall { call } => {
                let id = state
                    .calls
                    .get(&call)
                    .cloned()
                    .expect("tamper: no such call");
                session(state, &id).journal.retain(|r| r.record.id != call);
            }
            Tamper::MoveCall { call, step } => {
                row(state, &call).record.identity.step = step;
            }
            Tamper::SetStatus { call, status } => {
                row(state, &call).record.status =
                    CallStatus::parse(&status).expect("tamper: a status");
            }
            Tamper::SwapCallSeqs { a, b } => {
                let (seq_a, seq_b) = (row(state, &a).seq, row(state, &b).seq);
                row(state, &a).seq = seq_b;
                row(state, &b).seq = seq_a;
            }
            Tamper::SetMessage {
                session: id,
                seq,
                message,
            } => {
                let m = session(state, &id)
                    .messages
                    .iter_mut()
                    .find(|m| m.seq == seq)
                    .expect("tamper: no such message");
                m.text = message;
            }
            Tamper::DeleteMessage { session: id, seq } => {
                session(state, &id).messages.retain(|m| m.seq != seq);
            }
            Tamper::SwapMessages { session: id, a, b } => {
                let messages = &mut session(state, &id).messages;
                let i = messages.iter().position(|m| m.seq == a).expect("message a");
                let j = messages.iter().position(|m| m.seq == b).expect("message b");
                let (text, seal) = (messages[i].text.clone(), messages[i].seal.clone());
                messages[i].text = std::mem::replace(&mut messages[j].text, text);
                messages[i].seal = std::mem::replace(&mut messages[j].seal, seal);
            }
            Tamper::SetPlan {
                session: id,
                version,
                plan,
            } => {
                session(state, &id)
                    .checkpoints
                    .iter_mut()
                    .find(|c| c.version == version)
                    .expect("tamper: no such checkpoint")
                    .plan = plan;
            }
            Tamper::RollBackCheckpoint { session: id } => {
                let s = session(state, &id);
                let latest = s.record.latest_version;
                s.checkpoints.retain(|c| c.version != latest);
                s.record.latest_version -= 1;
            }
            Tamper::DeleteResolutions { session: id } => {
                session(state, &id).resolutions.clear();
            }
            Tamper::WipeJournal { session: id } => {
                let s = session(state, &id);
                s.journal.clear();
                s.resolutions.clear();
                s.head.journal_rows = 0;
                s.head.resolutions = 0;
            }
        }
    }
}
