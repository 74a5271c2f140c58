//! [`Operator`]: the verbs of a person who steers the fleet from outside a session.

use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::{Durable, ForkOptions, OnFailure};
use crate::error::{DurableError, StoreError};
use crate::ids::{CallId, SessionId};
use crate::session::Session;
use crate::store::{
    ApprovalDecision, CallRecord, CallStatus, CancelSession, CancelledSession, DEADLINE,
    DecideApproval, ForkPlan, ForkSession, PendingApproval, Resolution, ResolveCall,
    RetargetSession, SessionRecord, SessionStatus,
};

/// The operator's handle on a store: what a person (or the tool they use: the `durable`
/// CLI, the console) does to fix or steer the fleet from outside a session. It decides
/// calls awaiting approval ([`approve`](Self::approve), [`deny`](Self::deny),
/// [`revoke`](Self::revoke)), resolves in-doubt calls ([`resolve`](Self::resolve)), wakes,
/// unparks and retargets sessions, forks them, sets queue limits, and lists what awaits
/// a person ([`in_doubt`](Self::in_doubt), [`approvals`](Self::approvals),
/// [`queues`](Self::queues)).
///
/// Get one from a runtime with [`Durable::operator`]; the harness's verbs (start, resume,
/// recover, submit, worker pools) stay on [`Durable`]. It shares the runtime's store and
/// settings (an audit without an explicit `by` names the runtime's owner; a retarget
/// moves a session to the runtime's app version), is cheap to clone (two reference
/// counts) and is `Send + Sync`, so one handle can serve every request of a console.
///
/// # Example
/// ```
/// use durable_core::{Durable, Operator};
///
/// async fn approve_all(durable: &Durable) -> Result<usize, durable_core::DurableError> {
///     let operator: Operator = durable.operator();
///     let pending = operator.approvals(None).await?;
///     for request in &pending {
///         operator.approve(&request.call.id, None, "alice", Some("reviewed")).await?;
///     }
///     Ok(pending.len())
/// }
/// ```
#[derive(Clone, Debug)]
pub struct Operator {
    pub(super) durable: Durable,
}

impl Durable {
    /// The operator's handle on this runtime's store: approvals, resolutions, wake,
    /// unpark, retarget, fork, queue limits and the listings an operator reads (see
    /// [`Operator`]).
    pub fn operator(&self) -> Operator {
        Operator {
            durable: self.clone(),
        }
    }
}

impl Operator {
    /// The runtime this handle was taken from.
    pub fn durable(&self) -> &Durable {
        &self.durable
    }

    /// Every in-doubt call (all sessions, or one).
    pub async fn in_doubt(
        &self,
        session: Option<&SessionId>,
    ) -> Result<Vec<CallRecord>, DurableError> {
        Ok(self.durable.store.in_doubt(session).await?)
    }

    /// Resolves an in-doubt call as an operator, audited with `by` and `note`.
    ///
    /// *Happened* records `result` as the call's result: on resume it is what the
    /// tool call returns, so the agent continues with it. *Did not happen* lets the
    /// next resume execute the call.
    ///
    /// A session parked for this call (a harness parks on `ReplayUnsafe`) is returned to
    /// `active` once none of its calls is in doubt any more, so the next resume (or
    /// [`recover_next`](Durable::recover_next)) continues it.
    pub async fn resolve(
        &self,
        call: &CallId,
        resolution: Resolution,
        by: &str,
        note: Option<&str>,
    ) -> Result<CallRecord, DurableError> {
        let record = self
            .durable
            .store
            .resolve_call(ResolveCall {
                call: call.clone(),
                resolution,
                by: by.to_owned(),
                note: note.map(str::to_owned),
            })
            .await?;
        let session = &record.identity.session;
        if self.durable.store.session(session).await?.status == SessionStatus::Parked
            && self.durable.store.in_doubt(Some(session)).await?.is_empty()
        {
            match self.durable.store.unpark_session(session).await {
                Ok(_) | Err(StoreError::NotParked { .. }) => {}
                Err(e) => return Err(e.into()),
            }
            tracing::info!(%session, "session unparked: no call is in doubt any more");
        }
        Ok(record)
    }

    /// Calls awaiting a person's decision (all sessions, or one), oldest request first;
    /// `expired` says whether a deadline passed (see
    /// [`expire_approvals`](Self::expire_approvals)).
    pub async fn approvals(
        &self,
        session: Option<&SessionId>,
    ) -> Result<Vec<PendingApproval>, DurableError> {
        Ok(self.durable.store.pending_approvals(session).await?)
    }

    /// Approves a requested call as `by`, with `edited` arguments instead of the
    /// requested ones when `Some` (checked by
    /// [`check_edited_args`](crate::approval::check_edited_args): valid against the
    /// tool's schema, secret arguments unchanged; an edit equal to the request approves
    /// it as requested). Audited with `by` and `note`. Once no call of the session awaits
    /// a decision, it is `active` again and the next resume runs the call, exactly once.
    ///
    /// # Errors
    /// [`DurableError::InvalidEdit`] (nothing decided);
    /// [`StoreError::NotAwaitingApproval`] when the call is not awaiting a decision (of
    /// two operators deciding at once, the second gets this);
    /// [`StoreError::ApprovalExpired`] past its deadline.
    pub async fn approve(
        &self,
        call: &CallId,
        edited: Option<Value>,
        by: &str,
        note: Option<&str>,
    ) -> Result<CallRecord, DurableError> {
        let args = match edited {
            None => None,
            Some(edited) => {
                let row = self.durable.store.call(call).await?;
                if row.status != CallStatus::Requested {
                    return Err(StoreError::NotAwaitingApproval {
                        call: call.clone(),
                        status: row.status.as_str().to_owned(),
                    }
                    .into());
                }
                crate::approval::check_edited_args(&row, &edited, &self.durable.config.limits)?
            }
        };
        self.decide(call, ApprovalDecision::Approve { args }, by, note)
            .await
    }

    /// Denies a requested call as `by`: it never runs, and `reason` becomes the tool
    /// result the model reads on the next resume. Errors as for
    /// [`approve`](Self::approve); an empty reason is
    /// [`StoreError::EmptyDenialReason`].
    pub async fn deny(
        &self,
        call: &CallId,
        reason: &str,
        by: &str,
        note: Option<&str>,
    ) -> Result<CallRecord, DurableError> {
        let decision = ApprovalDecision::Deny {
            reason: reason.to_owned(),
        };
        self.decide(call, decision, by, note).await
    }

    /// Takes back the approval of a call that has not run, as `by`: it never runs, and
    /// `reason` becomes the tool result the model reads. For an approved call that cannot
    /// run any more ([`DurableError::ApprovedCallRefused`]: its tool's schema changed,
    /// its edited arguments no longer decode, a secret is not held after a restart): the
    /// session's step cannot end until it is decided again.
    ///
    /// # Errors
    /// [`StoreError::NotAwaitingApproval`] unless the call is `approved` (a requested one
    /// is denied with [`deny`](Self::deny)); an empty reason is
    /// [`StoreError::EmptyDenialReason`].
    pub async fn revoke(
        &self,
        call: &CallId,
        reason: &str,
        by: &str,
        note: Option<&str>,
    ) -> Result<CallRecord, DurableError> {
        let decision = ApprovalDecision::Revoke {
            reason: reason.to_owned(),
        };
        self.decide(call, decision, by, note).await
    }

    /// Denies every request whose deadline has passed (on the store's clock), by the
    /// deadline (audited as `deadline`), across sessions or for one; returns the calls
    /// expired now. A request decided meanwhile by a person is left to that decision.
    pub async fn expire_approvals(
        &self,
        session: Option<&SessionId>,
    ) -> Result<Vec<CallRecord>, DurableError> {
        let mut expired = Vec::new();
        for pending in self.durable.store.pending_approvals(session).await? {
            if !pending.expired {
                continue;
            }
            match self
                .decide(&pending.call.id, ApprovalDecision::Expire, DEADLINE, None)
                .await
            {
                Ok(row) => expired.push(row),
                Err(DurableError::Store(StoreError::NotAwaitingApproval { .. })) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(expired)
    }

    async fn decide(
        &self,
        call: &CallId,
        decision: ApprovalDecision,
        by: &str,
        note: Option<&str>,
    ) -> Result<CallRecord, DurableError> {
        let row = self
            .durable
            .store
            .decide_approval(DecideApproval {
                call: call.clone(),
                decision,
                by: by.to_owned(),
                note: note.map(str::to_owned),
            })
            .await?;
        tracing::info!(call = %row.id, tool = %row.identity.tool, status = row.status.as_str(), by, "approval decided");
        Ok(row)
    }

    /// Sets (or, with `None`, removes) a queue's fleet-wide limit: at most `max_running`
    /// of its sessions run at once across every worker of the store (the store enforces
    /// it when a pool claims; see [`CheckpointStore::set_queue_limit`](crate::store::QueueStore::set_queue_limit)).
    ///
    /// ```no_run
    /// # async fn demo(durable: durable_core::Durable) -> Result<(), durable_core::DurableError> {
    /// // The mail provider allows two concurrent senders: two email agents at most.
    /// durable.operator().set_queue_limit("email", Some(2)).await?;
    /// # Ok(()) }
    /// ```
    pub async fn set_queue_limit(
        &self,
        queue: &str,
        max_running: Option<u32>,
    ) -> Result<(), DurableError> {
        self.durable
            .store
            .set_queue_limit(queue, max_running)
            .await?;
        tracing::info!(queue, ?max_running, "queue limit set");
        Ok(())
    }

    /// Sets (or, with `None`, removes) a tenant's fleet-wide limit: at most
    /// `max_running` of the sessions started for it
    /// ([`StartOptions::with_tenant`](crate::StartOptions::with_tenant)) hold a lease at
    /// once, across every queue and worker. Binds claims only, as a queue's limit does.
    pub async fn set_tenant_limit(
        &self,
        tenant: &str,
        max_running: Option<u32>,
    ) -> Result<(), DurableError> {
        self.durable
            .store
            .set_tenant_limit(tenant, max_running)
            .await?;
        tracing::info!(tenant, ?max_running, "tenant limit set");
        Ok(())
    }

    /// How each queue stands: running, ready, sleeping, awaiting approval, parked, and
    /// its limit ([`QueueInfo`](crate::store::QueueInfo)).
    pub async fn queues(&self) -> Result<Vec<crate::store::QueueInfo>, DurableError> {
        Ok(self.durable.store.queues().await?)
    }

    /// How each tenant stands: its limit, its sessions running and queued behind it
    /// ([`TenantInfo`](crate::store::TenantInfo)).
    pub async fn tenants(&self) -> Result<Vec<crate::store::TenantInfo>, DurableError> {
        Ok(self.durable.store.tenants().await?)
    }

    /// How each fleet-wide rate limit stands: its definition, calls started in the last
    /// period, waiters, a provider's hold ([`LimiterInfo`](crate::limiter::LimiterInfo)).
    pub async fn rate_limits(&self) -> Result<Vec<crate::limiter::LimiterInfo>, DurableError> {
        Ok(self.durable.store.limiters().await?)
    }

    /// Defines (or redefines) a fleet-wide rate limit in the store (an operator's
    /// decision; the last definition wins, see [`limiter`](crate::limiter)).
    pub async fn define_rate_limit(
        &self,
        name: &str,
        limit: crate::limiter::RateLimit,
    ) -> Result<crate::limiter::Defined, DurableError> {
        let defined = self.durable.store.define_limit(name, &limit).await?;
        tracing::info!(limit = name, ?defined, "rate limit defined");
        Ok(defined)
    }

    /// Holds every call under the rate limit `name` for `retry_after` across the fleet,
    /// as a provider's `429` does ([`Journal::report_throttle`](crate::Journal::report_throttle)).
    /// Returns when the hold ends (ms, the store's clock).
    pub async fn throttle(&self, name: &str, retry_after: Duration) -> Result<i64, DurableError> {
        Ok(self.durable.store.throttle_limit(name, retry_after).await?)
    }

    /// Wakes a sleeping session now, so that the next pool claim takes it (an operator's
    /// decision; see [`Session::sleep_until`](crate::Session::sleep_until)).
    pub async fn wake(&self, session: &SessionId) -> Result<SessionRecord, DurableError> {
        Ok(self.durable.store.wake_session(session).await?)
    }

    /// Cancels a session and its children (and theirs), audited under the runtime's
    /// owner name: see [`cancel_with`](Self::cancel_with).
    pub async fn cancel(
        &self,
        session: &SessionId,
        reason: &str,
    ) -> Result<Vec<CancelledSession>, DurableError> {
        self.cancel_with(CancelSession::new(
            session.clone(),
            self.durable.config.owner.clone(),
            reason,
        ))
        .await
    }

    /// Cancels a session (and, unless [`without_children`](CancelSession::without_children),
    /// its children, recursively), audited with who and why (`durable cancel`, the
    /// console). A session no worker holds (released, asleep, waiting for its children,
    /// parked, awaiting approval) is `cancelled` at once; a running one is asked to stop
    /// and stops at its next safe point: its worker learns of it at its next lease
    /// renewal (within a third of the lease's TTL) or whoever takes it next does, and
    /// its next call is refused with [`DurableError::Cancelled`] after the session was
    /// ended as `cancelled`. No new effect starts after that; an effect in flight
    /// finishes and is recorded; calls in doubt stay for an operator. A waiting parent
    /// is woken and reads the child's cancellation as its outcome
    /// ([`ChildOutcome::Cancelled`](crate::ChildOutcome::Cancelled)). Returns what
    /// happened to each session reached, the named one first.
    pub async fn cancel_with(
        &self,
        cancel: CancelSession,
    ) -> Result<Vec<CancelledSession>, DurableError> {
        let done = self.durable.store.cancel_session(&cancel).await?;
        tracing::info!(session = %cancel.session, by = %cancel.by, reached = done.len(), "session cancelled");
        Ok(done)
    }

    /// Sends a signal into a session, from this runtime's owner name: see
    /// [`send_signal_with`](Self::send_signal_with).
    pub async fn send_signal(
        &self,
        session: &SessionId,
        name: &str,
        payload: Value,
    ) -> Result<crate::store::SignalRecord, DurableError> {
        self.send_signal_with(crate::store::NewSignal::new(
            session.clone(),
            name,
            payload,
            self.durable.config.owner.clone(),
        ))
        .await
    }

    /// Sends a signal into a session (`durable signal send`, the console, another
    /// session's harness): durable when this returns, it waits until the session reads
    /// it ([`Session::recv_signal`](crate::Session::recv_signal),
    /// [`Session::wait_signal`](crate::Session::wait_signal)), and a session waiting for
    /// a signal of this name is woken at once, on any worker. With a
    /// [key](crate::store::NewSignal::with_key), a send retried after a lost reply sends
    /// nothing more. Refused for a session that ended
    /// ([`StoreError::SessionEnded`](crate::StoreError::SessionEnded)).
    pub async fn send_signal_with(
        &self,
        signal: crate::store::NewSignal,
    ) -> Result<crate::store::SignalRecord, DurableError> {
        let sent = self.durable.store.send_signal(&signal).await?;
        tracing::info!(session = %signal.session, signal = %signal.name, id = sent.id, "signal sent");
        Ok(sent)
    }

    /// The signals sent to a session, pending and read, oldest first.
    pub async fn signals(
        &self,
        session: &SessionId,
    ) -> Result<Vec<crate::store::SignalRecord>, DurableError> {
        Ok(self.durable.store.signals(session).await?)
    }

    /// Returns a parked session to `active` (an operator's decision, e.g. after fixing
    /// what made its recoveries die). Refused with `NotParked` for any other status.
    pub async fn unpark(&self, session: &SessionId) -> Result<SessionRecord, DurableError> {
        Ok(self.durable.store.unpark_session(session).await?)
    }

    /// Moves a session to this worker's app version, with a mapping of renamed tools or
    /// steps (audited; `durable retarget` from the command line). Not a schema migration:
    /// the database is untouched.
    pub async fn retarget(
        &self,
        session: &SessionId,
        step_map: Vec<(String, String)>,
        by: &str,
    ) -> Result<SessionRecord, DurableError> {
        let current = self.durable.store.session(session).await?;
        Ok(self
            .durable
            .store
            .retarget_session(RetargetSession {
                session: session.clone(),
                from_version: current.app_version,
                to_version: self.durable.config.app_version.clone(),
                step_map,
                by: by.to_owned(),
            })
            .await?)
    }

    /// Forks `session` at `version` into a new session leased to this worker.
    ///
    /// **A fork never repeats an effect of its parent.** The fork's version 0 is the
    /// parent's version `version` and its first turn (step 0) re-runs the turn the parent
    /// ran from there, asking the model anew. The parent's calls with a side effect made
    /// from that version on are inherited: those of the re-run turn by identity (a
    /// recorded result comes back, an in-doubt call stays in doubt and bars the fork's
    /// effects until it is resolved or verified, and a re-run that asks for something else
    /// while one is unreplayed is refused as [`DurableError::ReplayDiverged`]), those of
    /// later turns by tool and arguments (a fork call that would repeat one is refused with
    /// [`DurableError::InheritedEffect`]); the parent's in-doubt calls of earlier turns
    /// keep barring the fork's effects. `pure` calls and model replies are not inherited.
    /// See [`store::ForkSession`](crate::store::ForkSession) for the rule and
    /// [`fork_plan`](Self::fork_plan) to see what it does to a given session before
    /// forking it; [`fork_with`](Self::fork_with) lets an operator run chosen calls again.
    pub async fn fork<M>(
        &self,
        session: &SessionId,
        version: i64,
        new_id: Option<SessionId>,
    ) -> Result<Session<M>, DurableError>
    where
        M: Serialize + DeserializeOwned + Clone,
    {
        let options = ForkOptions {
            new_id,
            ..ForkOptions::default()
        };
        Ok(self.fork_with(session, version, options).await?.0)
    }

    /// What forking `session` at `version` would do with each of its calls with a side
    /// effect, `rerun` being the calls an operator would let the fork run again. Reads
    /// only (every row checked under its seal). A `rerun` call the fork would not copy
    /// anyway (or not a call of `session`) is [`StoreError::CallNotFound`].
    pub async fn fork_plan(
        &self,
        session: &SessionId,
        version: i64,
        rerun: &[CallId],
    ) -> Result<ForkPlan, DurableError> {
        // The version must exist before anything is said about it.
        self.durable
            .store
            .load_checkpoint(session, Some(version))
            .await?;
        let rows = self.durable.store.calls(session, None).await?;
        ForkPlan::new(session.clone(), version, &rows, rerun)
            .map_err(|unknown| DurableError::Store(StoreError::CallNotFound(unknown[0].clone())))
    }

    /// Forks `session` at `version` as [`fork`](Self::fork) does, with the options of an
    /// operator: the new id, the calls the fork may run again
    /// ([`ForkOptions::rerun`], audited with the fork) and who forks. Returns the new
    /// session and the plan that was applied (computed just before the fork's
    /// transaction, which applies the same rule).
    pub async fn fork_with<M>(
        &self,
        session: &SessionId,
        version: i64,
        options: ForkOptions,
    ) -> Result<(Session<M>, ForkPlan), DurableError>
    where
        M: Serialize + DeserializeOwned + Clone,
    {
        let new_id = options.new_id.unwrap_or_else(SessionId::random);
        new_id.validate()?;
        let plan = self.fork_plan(session, version, &options.rerun).await?;
        let by = options
            .by
            .unwrap_or_else(|| self.durable.config.owner.clone());
        let request = ForkSession::new(
            session.clone(),
            version,
            new_id,
            self.durable.config.owner.clone(),
            self.durable.config.lease_ttl,
        )
        .rerun(options.rerun)
        .by(by);
        let requested = tokio::time::Instant::now();
        let (_, lease) = self.durable.store.fork_session_with(&request).await?;
        let resumed = self
            .durable
            .resume_leased::<M>(lease, requested, OnFailure::Release)
            .await?;
        Ok((resumed.session, plan))
    }
}
