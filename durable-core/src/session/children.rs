//! Child sessions from inside a session's turn: starting one as a journaled call,
//! collecting its outcome into the journal, and waiting for children with the lease
//! given up.
//!
//! # How it stays exactly-once
//!
//! Starting a child is a journaled call of the tool [`CHILD_SLOT`] (class
//! `idempotent_with_key`), and the child's id is derived from that call's identity
//! ([`child_id`]): the parent's session, step, the start's arguments and their ordinal.
//! A turn re-run after a crash maps its start onto the same journal row, so it either
//! returns the recorded id or (the row in doubt: the parent died between the row and its
//! outcome) creates the child under the same id, where the store finds it already there.
//! Two children for one start are impossible: the id is the store's primary key.
//!
//! A child's outcome is journaled when it is collected (the tool [`COLLECT_SLOT`], class
//! `pure`, one row per collection), only once the child has one: a re-run parent reads
//! the recorded outcome, never a different one. Nothing is written while the child
//! still runs, so the ordinals of a re-run line up with the first attempt's.
//!
//! # Waiting
//!
//! [`Session::await_children`] gives the lease up without a checkpoint (as
//! [`await_approval`](Session::await_approval) does): the turn is replayed from the
//! journal when the session is taken again. The store clears the wait in the same
//! transaction as a child's end, and notifies idle pools, so any worker takes the parent
//! at once; the wait's deadline ([`child_recheck`](crate::DurableBuilder::child_recheck))
//! is the safety net.

use std::convert::Infallible;
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::Session;
use crate::encode::encode;
use crate::error::{DurableError, StoreError};
use crate::ids::SessionId;
use crate::journal::CallError;
use crate::replay::ReplayClass;
use crate::runtime::StartOptions;
use crate::snapshot::{Budget, Spend};
use crate::store::{
    CHILD_SLOT, COLLECT_SLOT, CheckpointStore, NewCheckpoint, NewSession, SessionStatus, Wait,
    child_id,
};
use crate::tool_spec::ToolSpec;

/// How a child session ended, as its parent reads it
/// ([`Session::collect_child`], [`Session::await_children`]). Recorded in the parent's
/// journal once collected: a replayed parent reads the same outcome.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
#[non_exhaustive]
pub enum ChildOutcome {
    /// The child completed; `state` is its application state at the end (what it set
    /// with [`Session::set_state`] before [`complete`](Session::complete)): its result.
    Completed {
        /// The child's final state.
        state: Value,
    },
    /// The child failed ([`Session::fail`]).
    Failed {
        /// The reason it recorded.
        reason: String,
    },
    /// The child was cancelled (by an operator, or with its parent).
    Cancelled {
        /// Who and why (`cancelled by <who>: <why>`), or the reason the child gave.
        reason: String,
    },
    /// The child was parked for an operator (its recoveries kept dying, or its handler
    /// parked it). An operator may unpark it; this outcome was read before.
    Parked {
        /// Why.
        reason: String,
    },
    /// The child waits for an operator: a resume refused one of its in-doubt calls as
    /// [`DurableError::ReplayUnsafe`]. It goes on once an operator resolves the call.
    ReplayUnsafe,
}

impl ChildOutcome {
    /// Whether the child completed.
    pub fn is_completed(&self) -> bool {
        matches!(self, ChildOutcome::Completed { .. })
    }
}

/// What [`Session::await_children`] came back with.
#[derive(Debug)]
#[must_use = "a released session must not be used again: return from the handler"]
#[expect(
    clippy::large_enum_variant,
    reason = "returned once per wait and destructured at once; a box would only add an allocation"
)]
pub enum ChildWait<M> {
    /// Every child has an outcome, in the order asked; the session is still leased.
    Ready {
        /// The session, to go on with.
        session: Session<M>,
        /// The outcomes, in the order of the children asked for.
        outcomes: Vec<ChildOutcome>,
    },
    /// Some child is still running: the session gave its lease up and waits. Return
    /// from the handler; a worker takes the session again when a child ends, and the
    /// turn is replayed from the journal up to here.
    Released,
}

/// The arguments of a child's start as journaled: what [`StartOptions`] holds but its id
/// (derived from the call).
#[derive(Debug, Serialize, Deserialize)]
struct ChildArgs {
    messages: Vec<Value>,
    plan: Value,
    budget: Value,
    state: Value,
    metadata: Value,
    queue: Option<String>,
    not_before: Option<i64>,
    /// Left out when `false`, so that the arguments (and the start's identity) of a
    /// child started without it stay what they were.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    charge_parent: bool,
}

fn child_spec() -> ToolSpec {
    ToolSpec::new(
        CHILD_SLOT,
        "Starts a child session.",
        ReplayClass::IdempotentWithKey,
        json!({ "type": "object" }),
    )
}

fn collect_spec() -> ToolSpec {
    ToolSpec::new(
        COLLECT_SLOT,
        "Reads a child session's outcome.",
        ReplayClass::Pure,
        json!({ "type": "object" }),
    )
}

impl<M> Session<M>
where
    M: Serialize + DeserializeOwned + Clone,
{
    /// Starts a child session from inside this session's turn, as a journaled call, and
    /// returns its id: its own transcript (`options.messages`), plan, budget, state,
    /// queue and lease, on this runtime's app version, with this session as its parent.
    /// `options.id` is ignored: the child's id is derived from this call's identity
    /// ([`child_id`]), so a turn re-run after a crash finds the
    /// child it started and never starts a second. The child is released at once, for
    /// any worker's pool (as [`Durable::submit`](crate::Durable::submit) does).
    ///
    /// Two starts with the same options in one turn are two children (the ordinal tells
    /// them apart), as two identical tool calls are two calls. Refused like any call
    /// with a side effect while one of this session's `unsafe_on_replay` calls is in
    /// doubt, and once the session was cancelled ([`DurableError::Cancelled`]).
    ///
    /// Errors: a store error while creating the child returns
    /// [`DurableError::Store`] and leaves the start in doubt: return from the handler,
    /// and the re-run of the turn starts (or finds) the same child.
    pub async fn spawn_child<C: Serialize>(
        &self,
        options: StartOptions<C>,
    ) -> Result<SessionId, DurableError> {
        let messages = options
            .messages
            .iter()
            .enumerate()
            .map(|(i, m)| encode(m, format_args!("child's initial message {i}")))
            .collect::<Result<Vec<_>, _>>()?;
        if let Some(queue) = &options.queue {
            crate::validate::validate_id("queue", queue)?;
        }
        let args = ChildArgs {
            messages,
            plan: encode(&options.plan, "child's plan")?,
            budget: encode(&options.budget, "child's budget")?,
            state: options.state,
            metadata: options.metadata,
            queue: options.queue,
            not_before: options.not_before,
            charge_parent: options.charge_parent,
        };
        // What the parent has left, for a child whose spend counts against it: capped
        // when the child is created, not part of the journaled arguments (the parent's
        // clock moves; the start's identity must not).
        let parent_budget = options
            .charge_parent
            .then(|| (self.journal.budget(), self.journal.elapsed_ms()));
        let args = encode(&args, "child's start")?;
        let spec = child_spec();
        let store = Arc::clone(&self.store);
        let config = Arc::clone(&self.journal.inner.config);
        let parent = self.record.id.clone();
        let (failed, mut store_error) = tokio::sync::mpsc::unbounded_channel::<StoreError>();
        let body_args = args.clone();
        let call = self
            .journal
            .tool(&spec, args)
            .key(uuid::Uuid::new_v4().to_string())
            .run(move |ctx| {
                let store = Arc::clone(&store);
                let config = Arc::clone(&config);
                let parent = parent.clone();
                let failed = failed.clone();
                let args = body_args.clone();
                let parent_budget = parent_budget.clone();
                let id = child_id(ctx.identity());
                async move {
                    match start_child(&*store, &config, &parent, &id, args, parent_budget).await {
                        Ok(started) => started,
                        // Left in doubt (not recorded): the re-run creates or finds it.
                        Err(e) => {
                            let _ = failed.send(e);
                            std::future::pending().await
                        }
                    }
                }
            });
        let started = tokio::select! {
            biased;
            started = call => started,
            Some(e) = store_error.recv() => return Err(e.into()),
        };
        let recorded = match started {
            Ok(value) => value,
            Err(CallError::Durable(e)) => return Err(e),
            Err(CallError::Tool(reason)) => {
                return Err(DurableError::ChildNotStarted {
                    parent: self.record.id.clone(),
                    reason,
                });
            }
            Err(CallError::Recorded(failure)) => {
                return Err(DurableError::ChildNotStarted {
                    parent: self.record.id.clone(),
                    reason: failure.message,
                });
            }
        };
        recorded
            .get("child")
            .and_then(Value::as_str)
            .map(SessionId::new)
            .ok_or_else(|| DurableError::Decode {
                session: self.record.id.clone(),
                what: "a child's start".into(),
                detail: format!("the recorded result {recorded} names no child"),
            })
    }

    /// The outcome of `child` (a child of this session) if it has one, journaled: the
    /// first time an outcome is read it is recorded in this session's journal, and a
    /// re-run of the turn reads the recorded one. `None` (nothing written) while the
    /// child still runs. See [`ChildOutcome`] for what counts as an outcome.
    ///
    /// Each call that returns an outcome is one journal row: collect a child once per
    /// turn (or use [`await_children`](Self::await_children), which does).
    pub async fn collect_child(
        &self,
        child: &SessionId,
    ) -> Result<Option<ChildOutcome>, DurableError> {
        let spec = collect_spec();
        let store = Arc::clone(&self.store);
        let parent = self.record.id.clone();
        let asked = child.clone();
        let (told, mut not_yet) =
            tokio::sync::mpsc::unbounded_channel::<Result<(), DurableError>>();
        let call = self
            .journal
            .tool(&spec, json!({ "child": child.as_str() }))
            .run(move |ctx| {
                let store = Arc::clone(&store);
                let parent = parent.clone();
                let child = asked.clone();
                let told = told.clone();
                async move {
                    match outcome_of(&*store, &parent, &child).await {
                        Ok(Some((outcome, spend))) => {
                            // Recorded with the row: the parent's budget is charged
                            // once, on this run and on every replay of it.
                            if let Some(spend) = spend {
                                ctx.record_spend(spend);
                            }
                            Ok::<_, Infallible>(outcome)
                        }
                        // Nothing to record yet: the call is dropped before it writes,
                        // its ordinal handed back.
                        Ok(None) => {
                            let _ = told.send(Ok(()));
                            std::future::pending().await
                        }
                        Err(e) => {
                            let _ = told.send(Err(e));
                            std::future::pending().await
                        }
                    }
                }
            });
        tokio::select! {
            biased;
            collected = call => match collected {
                Ok(outcome) => Ok(Some(outcome)),
                Err(CallError::Durable(e)) => Err(e),
                Err(CallError::Tool(never)) => match never {},
                Err(CallError::Recorded(failure)) => Err(DurableError::Decode {
                    session: self.record.id.clone(),
                    what: format!("the outcome of child `{child}`"),
                    detail: failure.message,
                }),
            },
            Some(told) = not_yet.recv() => told.map(|()| None),
        }
    }

    /// Waits for every one of `children` (children of this session) to have an outcome:
    /// fan-in. Each one's outcome is collected once ([`collect_child`](Self::collect_child),
    /// journaled). When all have one, [`ChildWait::Ready`] with the session, still
    /// leased, and the outcomes in the order asked. Otherwise the session gives its lease
    /// up without a checkpoint ([`ChildWait::Released`]): return from the handler. No
    /// worker takes it until one of the children ends (or is parked, or waits for an
    /// operator), or until [`child_recheck`](crate::DurableBuilder::child_recheck) has
    /// passed; then a worker on any machine takes it and the handler replays the turn
    /// from the journal (the model's replies and the starts recorded, the outcomes
    /// collected so far returned as recorded) to this call again.
    ///
    /// Messages pushed since the last checkpoint are not written: the replay pushes them
    /// again. A failure, cancellation or `ReplayUnsafe` of a child is its outcome, not an
    /// error of this call.
    pub async fn await_children(
        mut self,
        children: &[SessionId],
    ) -> Result<ChildWait<M>, DurableError> {
        let mut outcomes: Vec<Option<ChildOutcome>> = vec![None; children.len()];
        loop {
            let mut pending = Vec::new();
            for (slot, child) in outcomes.iter_mut().zip(children) {
                if slot.is_none() {
                    *slot = self.collect_child(child).await?;
                    if slot.is_none() {
                        pending.push(child.clone());
                    }
                }
            }
            if pending.is_empty() {
                let outcomes = outcomes.into_iter().flatten().collect();
                return Ok(ChildWait::Ready {
                    session: self,
                    outcomes,
                });
            }
            let now = self.store.now().await?;
            let recheck = i64::try_from(self.journal.inner.config.child_recheck.as_millis())
                .unwrap_or(i64::MAX);
            let wait = Wait::children(pending, now.saturating_add(recheck));
            let lease = self.journal.lease();
            let waiting = self
                .store
                .wait(lease.fence(), &wait)
                .await
                .map_err(|e| self.lost(e))?;
            if waiting {
                self.stop_renewing();
                tracing::info!(session = %self.record.id, "session waits for its children");
                return Ok(ChildWait::Released);
            }
            // A child ended meanwhile: read the outcomes again.
        }
    }
}

/// Creates the child `id` of `parent` from the journaled start `args` and releases it;
/// an id already held by this parent's child is the child an earlier attempt started.
/// `Ok(Err(reason))`: the id is held by another session (recorded as the start's failure).
async fn start_child(
    store: &dyn CheckpointStore,
    config: &crate::config::Config,
    parent: &SessionId,
    id: &SessionId,
    args: Value,
    parent_budget: Option<(Budget, u64)>,
) -> Result<Result<Value, String>, StoreError> {
    let corrupt = |e: serde_json::Error| StoreError::Corrupt {
        session: parent.clone(),
        version: None,
        detail: format!("a child's start could not be read back: {e}"),
    };
    let mut args: ChildArgs = serde_json::from_value(args).map_err(corrupt)?;
    if args.charge_parent
        && let Some((parent_budget, elapsed_ms)) = parent_budget
    {
        let own: Budget = serde_json::from_value(args.budget).map_err(corrupt)?;
        let capped = own.capped_by_parent(&parent_budget, elapsed_ms);
        args.budget = serde_json::to_value(&capped).map_err(corrupt)?;
    }
    let new = NewSession {
        id: id.clone(),
        app_version: config.app_version.clone(),
        metadata: args.metadata,
        owner: config.owner.clone(),
        lease_ttl: config.lease_ttl,
        initial: NewCheckpoint {
            messages: args.messages,
            plan: args.plan,
            budget: args.budget,
            state: args.state,
            wake_at: args.not_before,
        },
        queue: args.queue,
    };
    match store.create_child(parent, new).await {
        Ok((_, lease)) => {
            store.release_lease(&lease).await?;
            tracing::info!(%parent, child = %id, "child session started");
        }
        Err(StoreError::SessionExists(_)) => {
            let found = store.session(id).await?;
            if found.parent.as_ref() != Some(parent) {
                return Ok(Err(format!(
                    "the child's id `{id}` is held by a session that is not a child of `{parent}`"
                )));
            }
        }
        Err(e) => return Err(e),
    }
    Ok(Ok(json!({ "child": id.as_str() })))
}

/// The outcome of `child` if it has one, checking that it is a child of `parent`, with
/// what the child spent when its spend is charged to the parent
/// ([`Budget::charged_to_parent`]).
async fn outcome_of(
    store: &dyn CheckpointStore,
    parent: &SessionId,
    child: &SessionId,
) -> Result<Option<(ChildOutcome, Option<Spend>)>, DurableError> {
    let Some(outcome) = child_outcome(store, parent, child).await? else {
        return Ok(None);
    };
    let standing = crate::runtime::session_budget(store, child).await?;
    let spend = standing
        .budget
        .charged_to_parent
        .then(|| standing.budget.total_spend());
    Ok(Some((outcome, spend)))
}

/// Whether `session`'s journal holds the start of `child`: a fork inherits the starts
/// its origin journaled (a fork never repeats an effect of its parent, so the re-run
/// start returns the origin's child), and collects that child as its own.
async fn started_here(
    store: &dyn CheckpointStore,
    session: &SessionId,
    child: &SessionId,
) -> Result<bool, DurableError> {
    Ok(store.calls(session, None).await?.iter().any(|row| {
        row.identity.tool == CHILD_SLOT
            && row
                .result
                .as_ref()
                .and_then(|r| r.get("child"))
                .and_then(Value::as_str)
                == Some(child.as_str())
    }))
}

/// The outcome of `child` if it has one, checking that it is a child of `parent` (or
/// that `parent` journaled its start: see [`started_here`]).
async fn child_outcome(
    store: &dyn CheckpointStore,
    parent: &SessionId,
    child: &SessionId,
) -> Result<Option<ChildOutcome>, DurableError> {
    let record = match store.session(child).await {
        Ok(record) => record,
        Err(StoreError::SessionNotFound(_)) => {
            return Err(DurableError::NotAChild {
                parent: parent.clone(),
                child: child.clone(),
            });
        }
        Err(e) => return Err(e.into()),
    };
    if record.parent.as_ref() != Some(parent) && !started_here(store, parent, child).await? {
        return Err(DurableError::NotAChild {
            parent: parent.clone(),
            child: child.clone(),
        });
    }
    let reason = || record.status_reason.clone().unwrap_or_default();
    Ok(match record.status {
        SessionStatus::Completed => {
            let last = store.load_checkpoint_window(child, None, 0).await?;
            Some(ChildOutcome::Completed { state: last.state })
        }
        SessionStatus::Failed => Some(ChildOutcome::Failed { reason: reason() }),
        SessionStatus::Cancelled => Some(ChildOutcome::Cancelled { reason: reason() }),
        SessionStatus::Parked => Some(ChildOutcome::Parked { reason: reason() }),
        SessionStatus::Active | SessionStatus::AwaitingApproval => {
            let blocked = store
                .children(parent)
                .await?
                .into_iter()
                .any(|c| c.session.id == *child && c.operator_needed);
            blocked.then_some(ChildOutcome::ReplayUnsafe)
        }
    })
}
