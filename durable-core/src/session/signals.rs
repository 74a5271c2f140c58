//! Signals from inside a session's turn: reading one as a journaled call, and waiting for
//! one with the lease given up.
//!
//! # How it stays exactly-once
//!
//! Reading a signal is a journaled call of the tool [`SIGNAL_SLOT`] (class `pure`): the
//! store marks the signal consumed under the call's [`consumer_key`] (derived from its
//! identity), and the journal records what was read. A turn re-run after a crash between
//! the two asks with the same key and is handed the same signal; a turn replayed after
//! the row was recorded reads the row. So each signal is read once, at one place of the
//! turn, whatever crashes; and a read that found nothing is recorded as such (a replay
//! finds nothing there either, even if a signal arrived since).
//!
//! # Waiting
//!
//! [`Session::wait_signal`] journals its deadline ([`SIGNAL_DEADLINE_SLOT`]) so that a
//! replay waits until the same moment, then gives the lease up without a checkpoint (as
//! [`await_children`](Session::await_children) does). The send that delivers the signal
//! clears the wait in its own transaction and tells idle pools, so a worker on any machine
//! takes the session at once and the turn replays from the journal to the read, which
//! now finds the signal. Nothing is written while the wait goes on, so the ordinals of a
//! replay line up with the first attempt's.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::Session;
use crate::error::{DurableError, StoreError};
use crate::journal::CallError;
use crate::replay::ReplayClass;
use crate::store::{SIGNAL_DEADLINE_SLOT, SIGNAL_SLOT, SignalRecord, Wait, consumer_key};
use crate::tool_spec::ToolSpec;

/// A signal as the session read it ([`Session::recv_signal`], [`Session::wait_signal`]):
/// recorded in the session's journal, so a replayed turn reads the same one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Signal {
    /// Its number in the store.
    pub id: i64,
    /// The session it was sent to.
    pub session: crate::SessionId,
    /// Its name.
    pub name: String,
    /// What it carries.
    pub payload: Value,
    /// Who sent it.
    pub sent_by: String,
    /// When it was sent (ms, database clock).
    pub sent_at: i64,
}

impl Signal {
    /// The payload decoded as `T`.
    ///
    /// Errors: [`DurableError::Decode`] naming the signal when the payload does not fit.
    pub fn payload_as<T: DeserializeOwned>(&self) -> Result<T, DurableError> {
        serde_json::from_value(self.payload.clone()).map_err(|e| DurableError::Decode {
            session: self.session.clone(),
            what: format!("the payload of signal `{}` #{}", self.name, self.id),
            detail: e.to_string(),
        })
    }
}

impl From<SignalRecord> for Signal {
    fn from(record: SignalRecord) -> Self {
        Signal {
            id: record.id,
            session: record.session,
            name: record.name,
            payload: record.payload,
            sent_by: record.sent_by,
            sent_at: record.sent_at,
        }
    }
}

/// What [`Session::wait_signal`] came back with.
#[derive(Debug)]
#[must_use = "a released session must not be used again: return from the handler"]
pub enum SignalWait<M> {
    /// A signal was read (and recorded); the session is still leased.
    Received {
        /// The session, to go on with.
        session: Session<M>,
        /// The signal.
        signal: Signal,
    },
    /// The deadline passed with no signal (recorded: a replay times out here too); the
    /// session is still leased.
    TimedOut {
        /// The session, to go on with.
        session: Session<M>,
    },
    /// No signal yet: the session gave its lease up and waits. Return from the handler;
    /// a worker takes the session again when the signal is sent (or the deadline passes),
    /// and the turn is replayed from the journal up to here.
    Released,
}

/// What one journaled read found.
enum Read {
    /// A signal, recorded.
    Got(Signal),
    /// Nothing, recorded (no deadline, or it passed).
    Nothing,
    /// Nothing yet, nothing written: the deadline is still ahead.
    NotYet,
}

fn signal_spec() -> ToolSpec {
    ToolSpec::new(
        SIGNAL_SLOT,
        "Reads a signal sent to the session.",
        ReplayClass::Pure,
        json!({ "type": "object" }),
    )
}

fn deadline_spec() -> ToolSpec {
    ToolSpec::new(
        SIGNAL_DEADLINE_SLOT,
        "Fixes when a wait for a signal ends.",
        ReplayClass::Pure,
        json!({ "type": "object" }),
    )
}

impl<M> Session<M>
where
    M: Serialize + DeserializeOwned + Clone,
{
    /// Reads the oldest pending signal named `name` sent to this session, if there is
    /// one, as a journaled call: the signal is consumed (no later read gets it) and
    /// recorded in this session's journal, and a re-run of the turn reads the same one
    /// at the same place. `None` when none is pending, recorded too: a replay finds
    /// nothing here even if a signal arrived since (it is read by the next call).
    ///
    /// Each call is one journal row: poll once per step, or use
    /// [`wait_signal`](Self::wait_signal), which writes nothing while it waits.
    ///
    /// ```no_run
    /// # async fn turn(mut session: durable_core::Session<serde_json::Value>) -> Result<(), durable_core::DurableError> {
    /// if let Some(steer) = session.recv_signal("steer").await? {
    ///     let advice: String = steer.payload_as()?;
    ///     session.push(serde_json::json!({ "role": "user", "content": advice }));
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn recv_signal(&self, name: &str) -> Result<Option<Signal>, DurableError> {
        crate::validate::validate_id("signal name", name)?;
        match self.read_signal(name, None).await? {
            Read::Got(signal) => Ok(Some(signal)),
            Read::Nothing | Read::NotYet => Ok(None),
        }
    }

    /// Waits for a signal named `name`, for at most `timeout`: the oldest pending one is
    /// read at once if there is one ([`SignalWait::Received`]). Otherwise the session
    /// gives its lease up without a checkpoint ([`SignalWait::Released`]): return from the
    /// handler. No worker takes it until the signal is sent or the deadline passes; then
    /// a worker on any machine takes it and the handler replays the turn from the journal
    /// to this call again, which reads the signal, or, past the deadline,
    /// returns [`SignalWait::TimedOut`] (recorded: a replay times out here too).
    ///
    /// The deadline is fixed the first time this call runs (journaled), so a replay waits
    /// until the same moment. Messages pushed since the last checkpoint are not written:
    /// the replay pushes them again.
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # use durable_core::{Session, SignalWait};
    /// # async fn turn(session: Session<serde_json::Value>) -> Result<(), durable_core::DurableError> {
    /// match session.wait_signal("go-ahead", Duration::from_secs(3600)).await? {
    ///     SignalWait::Received { session, signal } => { /* go on with `signal.payload` */ }
    ///     SignalWait::TimedOut { session } => { /* nobody answered within the hour */ }
    ///     SignalWait::Released => return Ok(()), // woken when the signal comes
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn wait_signal(
        mut self,
        name: &str,
        timeout: Duration,
    ) -> Result<SignalWait<M>, DurableError> {
        crate::validate::validate_id("signal name", name)?;
        let deadline = self.signal_deadline(name, timeout).await?;
        loop {
            match self.read_signal(name, Some(deadline)).await? {
                Read::Got(signal) => {
                    return Ok(SignalWait::Received {
                        session: self,
                        signal,
                    });
                }
                Read::Nothing => return Ok(SignalWait::TimedOut { session: self }),
                Read::NotYet => {}
            }
            let lease = self.journal.lease();
            let waiting = self
                .store
                .wait(lease.fence(), &Wait::signal(name, deadline))
                .await
                .map_err(|e| self.lost(e))?;
            if waiting {
                self.stop_renewing();
                tracing::info!(session = %self.record.id, signal = name, "session waits for a signal");
                return Ok(SignalWait::Released);
            }
            // A signal arrived meanwhile: read again.
        }
    }

    /// The deadline of a wait for `name` (ms, database clock), journaled the first time.
    async fn signal_deadline(&self, name: &str, timeout: Duration) -> Result<i64, DurableError> {
        let spec = deadline_spec();
        let store = Arc::clone(&self.store);
        let timeout_ms = i64::try_from(timeout.as_millis()).unwrap_or(i64::MAX);
        let args = json!({ "name": name, "timeout_ms": timeout_ms });
        let fixed = self
            .journal
            .tool(&spec, args)
            .run(move |_| {
                let store = Arc::clone(&store);
                async move {
                    let now = store.now().await?;
                    Ok::<_, StoreError>(now.saturating_add(timeout_ms))
                }
            })
            .await;
        match fixed {
            Ok(deadline) => Ok(deadline),
            Err(CallError::Durable(e)) => Err(e),
            Err(CallError::Tool(e)) => Err(e.into()),
            Err(CallError::Recorded(failure)) => Err(DurableError::Decode {
                session: self.record.id.clone(),
                what: format!("the deadline of a wait for signal `{name}`"),
                detail: failure.message,
            }),
        }
    }

    /// One journaled read of a signal named `name`: recorded when it finds one, or finds
    /// none and `deadline` is absent or past; dropped before it writes otherwise.
    async fn read_signal(&self, name: &str, deadline: Option<i64>) -> Result<Read, DurableError> {
        let spec = signal_spec();
        let store = Arc::clone(&self.store);
        let lease = self.journal.lease();
        let asked = name.to_owned();
        let (told, mut not_yet) = tokio::sync::mpsc::unbounded_channel::<Result<(), StoreError>>();
        let call = self
            .journal
            .tool(&spec, json!({ "name": name }))
            .run(move |ctx| {
                let store = Arc::clone(&store);
                let lease = lease.clone();
                let name = asked.clone();
                let told = told.clone();
                let consumer = consumer_key(ctx.identity());
                async move {
                    let found = store.consume_signal(lease.fence(), &name, &consumer).await;
                    let past = match (&found, deadline) {
                        (Ok(None), Some(deadline)) => store.now().await.map(|now| now >= deadline),
                        _ => Ok(true),
                    };
                    match (found, past) {
                        (Ok(Some(record)), _) => Ok::<_, Infallible>(json!(Signal::from(record))),
                        (Ok(None), Ok(true)) => Ok(Value::Null),
                        // Nothing to record yet: the call is dropped before it writes,
                        // its ordinal handed back.
                        (Ok(None), Ok(false)) => {
                            let _ = told.send(Ok(()));
                            std::future::pending().await
                        }
                        (Err(e), _) | (_, Err(e)) => {
                            let _ = told.send(Err(e));
                            std::future::pending().await
                        }
                    }
                }
            });
        let read = tokio::select! {
            biased;
            read = call => read,
            Some(told) = not_yet.recv() => {
                return match told {
                    Ok(()) => Ok(Read::NotYet),
                    Err(e) => Err(self.lost(e)),
                };
            }
        };
        let recorded = match read {
            Ok(value) => value,
            Err(CallError::Durable(e)) => return Err(e),
            Err(CallError::Tool(never)) => match never {},
            Err(CallError::Recorded(failure)) => {
                return Err(DurableError::Decode {
                    session: self.record.id.clone(),
                    what: format!("a read of signal `{name}`"),
                    detail: failure.message,
                });
            }
        };
        if recorded.is_null() {
            return Ok(Read::Nothing);
        }
        serde_json::from_value(recorded)
            .map(Read::Got)
            .map_err(|e| DurableError::Decode {
                session: self.record.id.clone(),
                what: format!("a read of signal `{name}`"),
                detail: e.to_string(),
            })
    }
}
