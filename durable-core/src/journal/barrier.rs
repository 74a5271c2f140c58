//! The two guards in front of every call with a side effect.
//!
//! - **The session-wide barrier.** While any `unsafe_on_replay` call of the session is in
//!   doubt (issued, outcome unknown, not being run by this journal), no call with a side
//!   effect runs in the session, in any step; `pure` calls and model calls may. The
//!   journal knows every such call without a query per call: the resume seeds it with
//!   the in-doubt rows it read, and a call of its own whose outcome could not be recorded
//!   (its future dropped, its finishing write failed) joins it. A candidate is re-read
//!   from the store before it refuses anything, so an operator's resolution (or a verify
//!   hook's answer) lifts the barrier without a resume.
//! - **The divergence check.** While a step is re-run, once it has taken a model reply
//!   that was asked for after a recorded call with a side effect it has not replayed (a
//!   recorded reply no longer decoded and the harness re-asked, now or in an earlier
//!   re-run), a call with a
//!   side effect that matches no record, while a recorded call with a side effect of that
//!   step has not been replayed yet, is refused with [`DurableError::ReplayDiverged`]:
//!   the re-run is no longer the first attempt, and running the new call could repeat
//!   the recorded effect. Before the model is asked anew, the calls of a re-run come from
//!   recorded replies: a call that matches no record is one the first attempt never
//!   reached (parallel calls of one reply are decided in any order, so a sibling's record
//!   may simply not be matched *yet*), and it runs. A checkpoint that would end a step
//!   with a recorded call unreplayed is always refused, so a recorded result is never
//!   dropped from the conversation unseen.
//!
//! The parallel calls of one reply run as a batch ([`Journal::join_calls`]). A call in
//! doubt that a sibling of the batch will replay is not a reason to refuse the others
//! before that sibling got to it: a call of the batch that meets the barrier waits while
//! a sibling has not *decided* (started running a call of its own, met the barrier
//! itself, or ended), then looks again. Once every sibling has decided, a call still in
//! doubt that none of them took up refuses as before.

use std::future::Future;

use futures_util::future::join_all;

use super::{Journal, JournalState, StepCache};
use crate::error::DurableError;
use crate::ids::CallId;
use crate::replay::ReplayClass;
use crate::store::{CARRIED_STEP, CallKind, CallRecord, CallStatus};
use crate::tool_spec::ToolSpec;

tokio::task_local! {
    /// The batch and the position in it of the call being polled (inside
    /// [`Journal::join_calls`]).
    static SIBLING: (u64, usize);
}

/// Forgets a batch when [`Journal::join_calls`] ends or is dropped.
struct BatchGuard<'j> {
    journal: &'j Journal,
    batch: u64,
}

impl Drop for BatchGuard<'_> {
    fn drop(&mut self) {
        self.journal.state().batches.remove(&self.batch);
        self.journal.inner.siblings.notify_waiters();
    }
}

impl Journal {
    /// Runs the calls of one model reply concurrently, as one batch, and returns their
    /// outputs in order.
    ///
    /// The calls of one reply are independent: on a resume they may be decided in any
    /// order. When a crash left one of them in doubt (an `unsafe_on_replay` call issued,
    /// its outcome never recorded), the session-wide barrier refuses every other call with
    /// a side effect until that call is settled, unless this journal is replaying it
    /// (its verify hook asking, say). Run separately, a sibling that happened to be
    /// polled first would be refused before the call in doubt was taken up; in a batch it
    /// waits for the other calls of the batch to start, to meet the barrier themselves or
    /// to end, then looks again: refused only if the call in doubt is still nobody's.
    ///
    /// [`Toolbox::dispatch_all`](crate::Toolbox::dispatch_all) runs its calls this way;
    /// use it for calls you run concurrently yourself.
    ///
    /// ```no_run
    /// # use durable_core::{Journal, ToolSpec};
    /// # async fn demo(journal: &Journal, email: &ToolSpec, charge: &ToolSpec) {
    /// // One future type for both calls: the same body, told what to answer.
    /// let answer = |text: &'static str| move |_| async move { Ok::<_, String>(text.to_owned()) };
    /// let [sent, charged]: [_; 2] = journal
    ///     .join_calls([
    ///         journal.tool(email, serde_json::json!({ "to": "ann@example.com" }))
    ///             .run(answer("sent")),
    ///         journal.tool(charge, serde_json::json!({ "cents": 1200 }))
    ///             .run(answer("charged")),
    ///     ])
    ///     .await
    ///     .try_into()
    ///     .expect("two calls, two outputs");
    /// # let _ = (sent, charged); }
    /// ```
    pub async fn join_calls<F, I>(&self, calls: I) -> Vec<F::Output>
    where
        I: IntoIterator<Item = F>,
        F: Future,
    {
        let calls: Vec<F> = calls.into_iter().collect();
        let batch = {
            let mut state = self.state();
            state.last_batch += 1;
            let batch = state.last_batch;
            state.batches.insert(batch, (0..calls.len()).collect());
            batch
        };
        let _forget = BatchGuard {
            journal: self,
            batch,
        };
        join_all(calls.into_iter().enumerate().map(|(position, call)| {
            SIBLING.scope((batch, position), async move {
                let output = call.await;
                self.decided();
                output
            })
        }))
        .await
    }

    /// The call being polled, if it belongs to a batch, has decided: it runs a call of its
    /// own, met the barrier, or ended. Wakes the siblings waiting at the barrier.
    pub(super) fn decided(&self) {
        // Outside a batch (most calls) the state is not even locked.
        if SIBLING.try_with(|_| ()).is_err() {
            return;
        }
        let changed = decide(&mut self.state());
        if changed {
            self.inner.siblings.notify_waiters();
        }
    }

    /// Refuses `refused` while an `unsafe_on_replay` call of the session other than
    /// `except` is in doubt.
    pub(super) async fn barrier(
        &self,
        refused: &ToolSpec,
        except: Option<&CallId>,
    ) -> Result<(), DurableError> {
        if crate::guard_switch::guard_off("barrier") {
            return Ok(());
        }
        loop {
            // Registered before anything is read: a sibling deciding from here on wakes it.
            let news = self.inner.siblings.notified();
            tokio::pin!(news);
            news.as_mut().enable();
            let decisions = self.state().batch_decisions;
            let candidate = self
                .state()
                .doubts
                .iter()
                .filter(|r| Some(&r.id) != except)
                .min_by_key(|r| r.issued_at)
                .cloned();
            let Some(row) = candidate else {
                return Ok(());
            };
            let current = self
                .inner
                .store
                .call(&row.id)
                .await
                .map_err(|e| self.note_store_error(e))?;
            let (running_here, wait) = {
                let mut state = self.state();
                let running_here = state.issued_here.contains(&current.id);
                let wait = if running_here || current.status != CallStatus::Issued {
                    Wait::No
                } else {
                    if decide(&mut state) {
                        // The siblings waiting here look again: one fewer to wait for.
                        self.inner.siblings.notify_waiters();
                    }
                    let undecided = SIBLING
                        .try_with(|&(batch, _)| {
                            state.batches.get(&batch).is_some_and(|s| !s.is_empty())
                        })
                        .unwrap_or(false);
                    if undecided && current.identity.step == state.step {
                        Wait::ForSiblings
                    } else if state.batch_decisions != decisions {
                        Wait::LookAgain
                    } else {
                        Wait::No
                    }
                };
                (running_here, wait)
            };
            match wait {
                Wait::ForSiblings => {
                    news.await;
                    continue;
                }
                Wait::LookAgain => continue,
                Wait::No => {}
            }
            if current.status == CallStatus::Issued && !running_here {
                let reason = if current.identity.step == self.step() {
                    format!(
                        "no call with a side effect may run beside it, and this step asks for `{}` \
                         with arguments that match no recorded call",
                        refused.name
                    )
                } else {
                    format!(
                        "no call with a side effect runs in this session while an unsafe call is in doubt \
                         (it was issued in step {}, this is step {})",
                        current.identity.step,
                        self.step()
                    )
                };
                return Err(DurableError::ReplayUnsafe {
                    call: current.id.clone(),
                    tool: current.identity.tool.clone(),
                    class: current.class,
                    refused_tool: refused.name.clone(),
                    reason,
                });
            }
            // Settled meanwhile (resolved, verified) or taken over by a call of ours.
            self.state().doubts.retain(|r| r.id != current.id);
        }
    }

    /// Refuses a fresh call with a side effect whose tool and arguments are those of an
    /// effect a fork's parent ran after the fork point (a row of
    /// [`CARRIED_STEP`](crate::store::CARRIED_STEP)), unless an operator resolved it as not
    /// happened: a fork never repeats an effect of its parent.
    pub(super) async fn check_carried(
        &self,
        refused: &ToolSpec,
        input_hash: &str,
    ) -> Result<(), DurableError> {
        let carried = self
            .inner
            .carried
            .get_or_try_init(|| async {
                self.inner
                    .store
                    .calls(&self.inner.session, Some(CARRIED_STEP))
                    .await
                    .map_err(|e| self.note_store_error(e))
            })
            .await?;
        for row in carried.iter().filter(|r| {
            r.kind == CallKind::Tool
                && r.identity.tool == refused.name
                && r.identity.input_hash == input_hash
        }) {
            // Re-read: an operator may have resolved an in-doubt carried call since.
            let current = self
                .inner
                .store
                .call(&row.id)
                .await
                .map_err(|e| self.note_store_error(e))?;
            if current.status != CallStatus::NotHappened {
                return Err(DurableError::InheritedEffect {
                    call: current.id.clone(),
                    status: current.status.as_str().to_owned(),
                    refused_tool: refused.name.clone(),
                });
            }
        }
        Ok(())
    }

    /// Refuses a call that matches no record while a recorded call with a side effect
    /// of the step being re-run has not been replayed.
    ///
    /// A call of a tool whose recorded call in this step was made under another argument
    /// schema is refused at once, model asked anew or not: today's code hashes the same
    /// intent differently (a renamed or added field), so it cannot match its record.
    pub(super) async fn check_divergence(&self, refused: &ToolSpec) -> Result<(), DurableError> {
        if crate::guard_switch::guard_off("divergence") {
            return Ok(());
        }
        let mut cache = self.inner.cache.lock().await;
        self.load_step(&mut cache).await?;
        let reshaped = cache.rows.values().any(|r| {
            cache.unreplayed.contains(&r.id)
                && r.identity.tool == refused.name
                && !r.schema_hash.is_empty()
                && r.schema_hash != refused.fingerprint
        });
        if !cache.diverged && !reshaped {
            return Ok(());
        }
        self.first_unreplayed(&cache, &refused.name)
    }

    /// Refuses to end the current step while one of its recorded calls with a side effect
    /// was not replayed by this attempt, whether or not the model was asked anew
    /// ([`DurableError::ReplayDiverged`]), or while one of its calls awaits approval or was
    /// approved and has not run ([`DurableError::AwaitingApproval`]).
    pub(crate) async fn check_step_replayed(&self) -> Result<(), DurableError> {
        let mut cache = self.inner.cache.lock().await;
        self.load_step(&mut cache).await?;
        self.first_unreplayed(&cache, "checkpoint")?;
        Self::first_undecided(&cache)
    }

    /// Refuses to end the current step while one of its calls awaits approval or was
    /// approved and has not run ([`DurableError::AwaitingApproval`]): the check of
    /// [`check_step_replayed`](Self::check_step_replayed) that also holds for
    /// `checkpoint_after`, whose own call did run.
    pub(crate) async fn check_approvals_settled(&self) -> Result<(), DurableError> {
        let mut cache = self.inner.cache.lock().await;
        self.load_step(&mut cache).await?;
        Self::first_undecided(&cache)
    }

    /// A call of this step awaiting a decision, or approved and not run yet: ending the
    /// step would leave it behind (approved, it would never run). The harness parks the
    /// session instead (`Session::await_approval`); the turn replays once decided.
    fn first_undecided(cache: &StepCache) -> Result<(), DurableError> {
        if let Some(row) = cache
            .rows
            .values()
            .filter(|r| matches!(r.status, CallStatus::Requested | CallStatus::Approved))
            .min_by_key(|r| cache.issue_order(r))
        {
            return Err(DurableError::AwaitingApproval {
                call: row.id.clone(),
                tool: row.identity.tool.clone(),
                status: row.status.as_str().to_owned(),
            });
        }
        Ok(())
    }

    fn first_unreplayed(&self, cache: &StepCache, refused_tool: &str) -> Result<(), DurableError> {
        let Some(row) = cache
            .rows
            .values()
            .filter(|r| cache.unreplayed.contains(&r.id))
            .min_by_key(|r| cache.issue_order(r))
        else {
            return Ok(());
        };
        Err(DurableError::ReplayDiverged {
            session: self.inner.session.clone(),
            step: cache.step,
            recorded: row.id.clone(),
            recorded_tool: row.identity.tool.clone(),
            refused_tool: refused_tool.to_owned(),
        })
    }

    /// Whether every recorded call with a side effect of the current step was replayed.
    pub(super) async fn step_replayed(&self) -> bool {
        self.inner.cache.lock().await.unreplayed.is_empty()
    }

    /// A row whose outcome this journal will not record (its call's future was dropped,
    /// its finishing write failed): if it is an `unsafe_on_replay` call, it is in doubt.
    pub(super) fn hand_to_barrier(&self, row: &CallRecord) {
        let mut state = self.state();
        let ours = state.issued_here.remove(&row.id);
        if ours && guards_session(row) && !state.doubts.iter().any(|r| r.id == row.id) {
            state.doubts.push(row.clone());
        }
    }

    /// The row's outcome is recorded: it is neither running here nor in doubt.
    pub(super) fn settled(&self, id: &CallId) {
        let mut state = self.state();
        state.issued_here.remove(id);
        state.doubts.retain(|r| &r.id != id);
    }
}

/// What the barrier does before it refuses a call in doubt.
enum Wait {
    /// Refuse (or pass): nothing may change.
    No,
    /// A sibling of the batch has not decided yet: it may take the call up.
    ForSiblings,
    /// A sibling decided since the row was read: read it again.
    LookAgain,
}

/// Marks the call being polled as decided in its batch; whether that changed anything.
fn decide(state: &mut JournalState) -> bool {
    let Ok((batch, position)) = SIBLING.try_with(|&s| s) else {
        return false;
    };
    let removed = state
        .batches
        .get_mut(&batch)
        .is_some_and(|undecided| undecided.remove(&position));
    if removed {
        state.batch_decisions += 1;
    }
    removed
}

/// The rows that start a journal's barrier: the session's `unsafe_on_replay` tool calls
/// that are issued with no outcome.
pub(super) fn initial_doubts(rows: Vec<CallRecord>) -> Vec<CallRecord> {
    rows.into_iter()
        .filter(|r| r.status == CallStatus::Issued && guards_session(r))
        .collect()
}

/// Whether a row, while in doubt, bars every call with a side effect in its session: an
/// `unsafe_on_replay` call, or a keyed call whose record holds no key (issued before its
/// tool became `idempotent_with_key`: nothing upstream can deduplicate it).
fn guards_session(row: &CallRecord) -> bool {
    row.kind == CallKind::Tool
        && (row.class == ReplayClass::UnsafeOnReplay
            || (row.class == ReplayClass::IdempotentWithKey && row.idempotency_key.is_none()))
}

/// Whether a row loaded for a re-run step must be replayed before the step may take a
/// new call with a side effect or end.
pub(super) fn must_replay(row: &CallRecord) -> bool {
    row.kind == CallKind::Tool && row.class != ReplayClass::Pure
}

impl StepCache {
    /// Where `row` stands in issue order: its time, then its place among the rows
    /// loaded from the store, then its identity, so that rows issued in one millisecond
    /// are told apart the same way every run (the rows are held in a hash map).
    fn issue_order<'r>(&self, row: &'r CallRecord) -> (i64, usize, &'r str, i64, &'r str) {
        (
            row.issued_at,
            self.order.get(&row.id).copied().unwrap_or(usize::MAX),
            &row.identity.tool,
            row.identity.ordinal,
            &row.identity.input_hash,
        )
    }

    /// Notes a model reply the re-run takes: `recorded` is its row when it was replayed,
    /// `None` when it was asked for anew. A reply newer (in issue order) than a recorded
    /// call with a side effect that this attempt has not replayed means this attempt left
    /// the first attempt's path.
    pub(super) fn note_reply(&mut self, recorded: Option<&CallId>) {
        if self.unreplayed.is_empty() {
            return;
        }
        let diverged = match recorded.and_then(|id| self.order.get(id)) {
            Some(&at) => self
                .unreplayed
                .iter()
                .any(|id| self.order.get(id).is_some_and(|&before| before < at)),
            // Asked anew: newer than every recorded row.
            None => true,
        };
        self.diverged |= diverged;
    }
}
