//! The backend conformance suite of `durable`: one set of tests every
//! [`CheckpointStore`] must pass, the replay protocol's runtime cases included.
//!
//! A backend is a crate that implements the store contract of `durable-core` (the store
//! traits of [`durable_core::store`], their records, [`StoreError`](durable_core::StoreError),
//! and the sealing in [`durable_core::integrity`]). This crate proves that it keeps it:
//! add it as a dev-dependency and write one test file.
//!
//! ```toml
//! [dev-dependencies]
//! durable-conformance = "0.1"
//! tokio = { version = "1", features = ["rt-multi-thread", "macros"] }
//! ```
//!
//! Each case is a `pub async fn case(store: Arc<dyn CheckpointStore>)` that panics with a
//! message naming the violated contract. [`conformance_suite!`](crate::conformance_suite)
//! generates one `#[test]` per case (so a failure names the case), each on a fresh store
//! from your factory. `tests/conformance.rs` of a backend is then, for the memory store:
//!
//! ```no_run
//! # mod wrapper {
//! use std::sync::Arc;
//!
//! use durable_core::CheckpointStore;
//! use durable_memory::{MemoryStore, MemoryStoreOptions};
//!
//! /// A fresh, empty store per case (here: the memory store, which accepts being
//! /// volatile so the runtime cases may run `unsafe_on_replay` tools on it).
//! async fn make_store() -> Arc<dyn CheckpointStore> {
//!     Arc::new(
//!         MemoryStore::open(MemoryStoreOptions::new().accept_volatile(true))
//!             .expect("open a memory store"),
//!     )
//! }
//!
//! durable_conformance::conformance_suite!(make_store);
//! # }
//! ```
//!
//! Run it with `cargo test --test conformance`, one case with
//! `cargo test --test conformance <case_name>` ([`CASES`] lists them all).
//!
//! The memory store (`durable-memory`) is the reference backend to copy: one module per
//! concept, named as this crate's files (sessions, leases, queues, checkpoints, journal,
//! approvals, maintenance), each contract point in plain Rust, and it passes the whole
//! suite in a few seconds. The SQL backends (`durable-sqlite`, `durable-postgres`) run the
//! same macro over a database file and a throwaway PostgreSQL database.
//!
//! The factory is called once per case. It returns either an `Arc<dyn CheckpointStore>`
//! or a pair `(Arc<dyn CheckpointStore>, guard)`; the guard (a temporary directory, a
//! throwaway database) is dropped after the case, once the store has been dropped. See
//! [`StoreFixture`].
//!
//! Every case uses fresh random session ids, so cases can run one after the other on one
//! database. Recovery cases ([`recovery_concurrent_claims_are_exclusive`] and friends)
//! call [`claim_expired`](durable_core::store::LeaseStore::claim_expired), which claims
//! *any* expired session of the database, so cases that run *at the same time* need a
//! database each (the generated tests run in parallel; give each its own database, as a
//! fresh file or schema).
//!
//! The tampering cases ([`tamper::run_tamper_cases`]) need a way to change rows behind
//! the store's back: the backend implements [`tamper::Tamperer`] for its tables (see the
//! memory store's `tamperer`, feature `testing`, or the SQL backends' `tests/tamper.rs`).

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};

use durable_core::ids::{CallId, SessionId};
use durable_core::replay::ReplayClass;
use durable_core::store::{
    CallIdentity, CallKind, CallOutcome, CheckpointStore, FinishCall, Lease, NewCall,
    NewCheckpoint, NewSession, SessionRecord,
};

mod approval;
mod approval_runtime;
mod blocked;
mod budget;
mod cancel;
mod checkpoint_after;
mod checkpoints;
mod children;
mod fork;
mod ids;
mod journal;
mod leases;
mod limiter;
mod limiter_runtime;
mod maintenance;
mod outcomes;
mod priorities;
mod protocol;
mod recovery;
mod refusals;
mod resolution;
mod runtime;
mod sessions;
mod signals;
mod sizes;
mod stall;
mod stream;
pub mod tamper;
mod tenants;
mod window;
mod workers;

pub use approval::*;
pub use approval_runtime::*;
pub use blocked::*;
pub use budget::*;
pub use cancel::*;
pub use checkpoint_after::*;
pub use checkpoints::*;
pub use children::*;
pub use fork::*;
pub use ids::*;
pub use journal::*;
pub use leases::*;
pub use limiter::*;
pub use limiter_runtime::*;
pub use maintenance::*;
pub use outcomes::*;
pub use priorities::*;
pub use protocol::*;
pub use recovery::*;
pub use refusals::*;
pub use resolution::*;
pub use runtime::*;
pub use sessions::*;
pub use signals::*;
pub use sizes::*;
pub use stream::*;
pub use tenants::*;
pub use window::*;
pub use workers::*;

/// How long one case may run before it is reported as hung (a deadlocked store call).
pub const CASE_TIMEOUT: Duration = Duration::from_secs(120);

/// What a store factory given to [`conformance_suite!`](crate::conformance_suite)
/// returns: the store, optionally with a guard that must outlive it.
pub trait StoreFixture: Send + 'static {
    /// The store under test.
    fn store(&self) -> Arc<dyn CheckpointStore>;
}

impl StoreFixture for Arc<dyn CheckpointStore> {
    fn store(&self) -> Arc<dyn CheckpointStore> {
        Arc::clone(self)
    }
}

/// `(store, guard)`: the guard (e.g. a `tempfile::TempDir`) is dropped after the store.
impl<G: Send + 'static> StoreFixture for (Arc<dyn CheckpointStore>, G) {
    fn store(&self) -> Arc<dyn CheckpointStore> {
        Arc::clone(&self.0)
    }
}

/// Runs one case on a fresh multi-threaded runtime (2 workers), with [`CASE_TIMEOUT`].
/// Called by the tests [`conformance_suite!`](crate::conformance_suite) generates.
///
/// (Not `#[tokio::test]`: its `crate = "…"` option takes a string literal, in which a
/// `macro_rules!` cannot write `$crate`, so the generated tests could not name our tokio.)
#[doc(hidden)]
pub fn __durable_run<M, MF, X, C, CF>(name: &'static str, make_store: M, case: C)
where
    M: FnOnce() -> MF,
    MF: Future<Output = X>,
    X: StoreFixture,
    C: FnOnce(Arc<dyn CheckpointStore>) -> CF,
    CF: Future<Output = ()>,
{
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("conformance: cannot build a tokio runtime");
    runtime.block_on(async move {
        let fixture = make_store().await;
        let store = fixture.store();
        if tokio::time::timeout(CASE_TIMEOUT, case(store)).await.is_err() {
            panic!(
                "conformance case `{name}` did not finish within {CASE_TIMEOUT:?}: a store call is probably deadlocked"
            );
        }
        drop(fixture);
    });
}

/// Generates one `#[test]` per conformance case, each running on a fresh store.
///
/// `$make_store` is anything callable with no arguments that returns a future of a
/// [`StoreFixture`]: the name of an `async fn`, or a closure `|| async { … }`. It is called
/// once per case; return a fresh database each time (see the [module docs](crate)).
///
/// Run one case with `cargo test --test <file> <case_name>`.
#[macro_export]
macro_rules! conformance_suite {
    ($make_store:expr) => {
        $crate::__durable_conformance_cases!(__durable_conformance_tests!($make_store));
    };
}

/// Calls `$crate::$callback!(($args) case, case, …)` with the list of every case: the
/// single list behind both [`conformance_suite!`] and [`CASES`](durable_core::CASES).
#[doc(hidden)]
#[macro_export]
macro_rules! __durable_conformance_cases {
    ($callback:ident ! ($($args:tt)*)) => {
        $crate::$callback! { ($($args)*)
            // sessions
            session_create_reads_back_every_field,
            session_duplicate_id_is_refused,
            session_missing_is_not_found,
            session_list_filters_and_orders,
            // leases
            lease_second_owner_is_refused,
            lease_same_owner_reacquire_bumps_fence,
            lease_refusal_text_gives_expiry_and_time_left,
            lease_expiry_lets_another_owner_in,
            lease_concurrent_acquire_has_one_winner,
            lease_stale_token_writes_nothing,
            lease_renew_extends,
            lease_renew_with_stale_token_is_lost,
            lease_release_lets_another_owner_in,
            lease_terminal_and_parked_are_not_resumable,
            // recovery
            recovery_list_expired_shows_only_active_expired,
            recovery_concurrent_claims_are_exclusive,
            recovery_attempts_count_up_then_park,
            recovery_idle_lease_is_not_counted,
            recovery_checkpoint_resets_attempts,
            recovery_resume_by_id_parks_a_poison_pill,
            recovery_released_lease_is_not_counted,
            // worker pools: sleep, queues, limits
            worker_sleeping_session_is_claimed_once_due,
            worker_crash_after_sleeping_keeps_the_wake_up,
            worker_wake_session_ends_a_sleep_early,
            worker_claims_keep_to_their_app_version_and_queues,
            worker_queue_limit_bounds_claims,
            worker_concurrent_claims_respect_the_queue_limit,
            worker_lease_renewed_at_tracks_take_and_renew,
            worker_claims_match_a_model,
            worker_an_expired_lease_in_a_limited_queue_is_not_renewed,
            worker_pool_skips_a_session_waiting_for_an_operator,
            worker_pool_skips_a_refused_session_whose_lease_ran_out,
            worker_pool_claims_a_session_a_verify_hook_may_settle,
            // claim priorities
            worker_priorities_take_the_highest_first_then_the_oldest,
            worker_priority_aging_bounds_how_long_the_lowest_waits,
            // per-tenant concurrency
            worker_tenant_limit_bounds_claims,
            worker_concurrent_claims_respect_the_tenant_limit,
            worker_tenants_are_listed_with_their_figures,
            // fleet-wide rate limits
            limiter_definition_is_shared_and_the_last_wins,
            limiter_starts_honour_the_rate_and_the_capacity,
            limiter_waiters_are_served_first_come_first_served,
            limiter_a_429_holds_the_whole_fleet,
            limiter_tokens_charged_after_a_reply_delay_the_next_call,
            limiter_model_calls_wait_their_turn_and_replays_do_not,
            limiter_toolbox_calls_wait_their_turn,
            limiter_a_far_turn_is_refused_and_keeps_its_place,
            limiter_a_far_turn_releases_the_session_until_then,
            // child sessions
            children_a_rerun_parent_never_starts_a_second_child,
            children_await_releases_the_parent_and_a_child_end_wakes_it,
            children_fan_out_and_fan_in_across_workers,
            children_failure_cancellation_and_replay_unsafe_reach_the_parent,
            children_only_a_parents_own_children_are_collected,
            children_spend_is_charged_to_the_parent_once_when_asked,
            children_a_fork_collects_the_children_its_origin_started,
            // cancellation
            cancel_stops_a_running_session_at_its_next_call,
            cancel_cascades_to_children_at_once,
            cancel_committed_starts_no_effect_before_the_worker_hears_of_it,
            cancel_committed_reruns_nothing_and_runs_no_approved_call,
            cancel_of_a_dead_workers_session_ends_on_the_next_take,
            // signals
            signals_are_consumed_once_in_order_under_their_key,
            signals_a_keyed_send_is_sent_once_and_bad_sends_are_refused,
            signals_a_read_killed_after_its_consumption_reads_the_same_signal,
            signals_a_wait_releases_the_session_and_a_send_wakes_it,
            signals_a_wait_times_out_at_its_journaled_deadline,
            // streamed model replies
            stream_reply_is_journaled_once_and_replayed_as_a_stream,
            stream_reply_failed_or_dropped_journals_nothing,
            stream_reply_is_checked_like_a_whole_reply,
            // checkpoints
            checkpoint_initial_is_version_zero,
            checkpoint_cas_conflict_writes_nothing,
            checkpoint_completion_is_one_write,
            checkpoint_concurrent_writers_never_fork,
            checkpoint_old_versions_keep_their_transcript,
            checkpoint_json_round_trips_exactly,
            checkpoint_list_is_oldest_first,
            checkpoint_missing_version_is_not_found,
            checkpoint_storage_is_linear,
            fork_copies_version_and_leaves_source_untouched,
            fork_missing_version_is_refused,
            fork_never_repeats_a_parent_effect_after_the_fork_point,
            fork_from_the_last_checkpoint_keeps_the_in_flight_turn,
            fork_keeps_the_barrier_of_an_earlier_in_doubt_call,
            fork_rerun_runs_only_the_named_call_again,
            // ids
            ids_are_validated_before_the_database,
            free_text_with_nul_is_refused_before_the_database,
            // journal
            journal_issue_inserts_issued_row,
            journal_issue_same_identity_returns_existing,
            journal_concurrent_issue_inserts_once,
            journal_identity_components_are_distinct,
            journal_idempotency_key_conflict,
            journal_finish_records_outcome,
            journal_finish_twice_is_refused,
            journal_finish_with_checkpoint_is_atomic,
            journal_reissue_bumps_attempt,
            journal_calls_filter_and_order,
            journal_refuses_a_call_of_a_closed_step,
            journal_record_call_inserts_finished_row,
            // in doubt + resolution
            in_doubt_requires_a_lost_lease,
            resolve_happened_records_result_and_audit,
            resolve_did_not_happen_allows_reissue,
            resolve_refuses_calls_not_in_doubt,
            // approvals
            approval_request_runs_nothing_and_is_pending,
            approval_with_edited_args_is_issued_once,
            approval_denial_is_the_recorded_outcome,
            approval_two_decisions_at_once_one_wins,
            approval_deadline_is_kept_on_the_store_clock,
            approval_awaiting_session_holds_no_lease,
            approval_ended_sessions_have_none_pending,
            runtime_requested_calls_are_not_run,
            runtime_approved_call_runs_once_on_the_next_worker,
            runtime_edited_approval_runs_with_the_edit_and_its_key,
            runtime_denied_call_returns_the_reason,
            runtime_expired_request_is_denied_by_its_deadline,
            runtime_calls_of_one_turn_await_together,
            runtime_edits_need_a_call_site_that_takes_them,
            runtime_approved_call_that_cannot_run_is_denied,
            runtime_checkpoint_after_keeps_the_step_open_for_a_request,
            runtime_edited_key_held_by_another_call_is_refused,
            runtime_revoke_racing_the_resume_is_the_recorded_denial,
            // maintenance
            errors_round_trip_in_order,
            migrate_checks_version_and_renames_tools,
            purge_refuses_active_recent_and_in_doubt,
            purge_deletes_every_row,
            durability_reports,
            now_tracks_the_system_clock,
            // runtime: the replay protocol over this store
            runtime_recorded_results_are_returned_for_every_class,
            runtime_recorded_failures_are_replayed,
            runtime_in_doubt_keyed_reruns_with_recorded_key,
            runtime_in_doubt_unsafe_is_refused,
            runtime_verify_hook_decides_in_doubt_unsafe,
            runtime_operator_resolution_is_honoured,
            runtime_no_effect_runs_beside_an_orphan,
            runtime_ordinals_and_steps_scope_identity,
            runtime_model_responses_replay_and_spend_once,
            runtime_idempotency_key_conflict_runs_nothing,
            runtime_invalid_arguments_journal_nothing,
            runtime_lost_lease_stops_the_zombie,
            runtime_checkpoints_restore_transcript_plan_budget,
            runtime_undecodable_message_fails_the_resume,
            runtime_app_version_requires_migration,
            runtime_secret_arguments_are_masked,
            runtime_start_or_resume_starts_new_ids_and_resumes_known_ones,
            runtime_retry_records_attempts,
            runtime_tool_retry_policy_records_attempts,
            runtime_resolution_unparks_a_parked_session,
            runtime_failed_model_calls_do_not_shift_positions,
            runtime_interrupted_unsafe_call_blocks_the_live_session,
            runtime_live_session_sees_a_resolution,
            runtime_interrupted_checkpoint_stops_the_handle,
            // runtime: the session-wide barrier and divergence
            runtime_barrier_holds_across_steps,
            runtime_barrier_survives_checkpoint_and_resume,
            runtime_barrier_covers_own_interrupted_call_in_later_steps,
            runtime_diverged_rerun_is_refused,
            runtime_rerun_runs_calls_the_first_attempt_never_reached,
            runtime_divergence_survives_a_second_rerun,
            runtime_undecodable_record_is_not_replayed,
            runtime_reshaped_tool_is_refused_without_a_reask,
            runtime_rerun_cannot_skip_a_recorded_effect,
            runtime_non_finite_values_never_enter_the_journal,
            runtime_every_refusal_is_reported_as_refused,
            // runtime: a tool result and its checkpoint in one transaction
            runtime_checkpoint_after_commits_result_and_checkpoint_together,
            runtime_checkpoint_after_returns_recorded_results,
            runtime_checkpoint_after_records_failures_and_writes_nothing_on_refusal,
            runtime_checkpoint_after_allows_one_call,
            runtime_checkpoint_after_interrupted_stops_the_handle,
            runtime_checkpoint_after_failed_write_pushes_nothing,
            runtime_checkpoint_after_dropped_after_the_call_leaves_it_in_doubt,
            runtime_checkpoint_after_other_handles_are_not_the_scope,
            runtime_checkpoint_after_commits_a_verified_result,
            runtime_checkpoint_after_does_not_end_a_step_with_an_unreplayed_call,
            // size caps, checked before anything is written
            sizes_a_reply_above_the_cap_writes_nothing,
            sizes_a_result_above_the_cap_is_failed_and_never_rerun,
            sizes_a_message_above_the_cap_writes_no_checkpoint,
            // long listings, page by page
            paging_calls_page_walks_the_journal_by_position,
            paging_session_listing_resumes_after_a_cursor,
            // a bounded resume: the transcript's tail, the rest on demand
            runtime_resume_window_holds_the_tail_and_the_rest_on_demand,
            runtime_resume_window_checkpoints_append_after_the_unloaded_messages,
            runtime_resume_window_of_nothing,
            store_messages_reads_a_checked_range,
            // budgets: ceilings checked before the call, spend counted once
            budget_ceiling_reached_mid_turn_refuses_the_next_call_and_runs_nothing,
            budget_replay_is_charged_once_and_never_refused,
            budget_rerun_after_a_crash_counts_what_was_paid_again,
            budget_fork_counts_inherited_effects_once,
            budget_approved_call_is_counted_once_when_it_runs,
            budget_raise_unparks_the_session_and_the_call_runs,
        }
    };
}

/// Expands to one `#[test]` per case.
#[doc(hidden)]
#[macro_export]
macro_rules! __durable_conformance_tests {
    (($make_store:expr) $($case:ident),* $(,)?) => {
        $(
            #[test]
            fn $case() {
                $crate::__durable_run(
                    ::core::stringify!($case),
                    $make_store,
                    $crate::$case,
                );
            }
        )*
    };
}

/// Expands to the case names as a `&[&str]`.
#[doc(hidden)]
#[macro_export]
macro_rules! __durable_conformance_names {
    (() $($case:ident),* $(,)?) => {
        &[$(::core::stringify!($case)),*]
    };
}

/// The names of every case, in the order [`conformance_suite!`](crate::conformance_suite)
/// generates them.
pub const CASES: &[&str] = crate::__durable_conformance_cases!(__durable_conformance_names!());

// ---------------------------------------------------------------------------------------
// Shared helpers for the cases.

/// A lease that stays live for the whole case.
const LONG_TTL: Duration = Duration::from_secs(600);

/// The recovery bound passed to `acquire_lease` by cases that do not test it.
const MAX_ATTEMPTS: i32 = 5;

/// Slack allowed between the store's clock readings and ours (ms).
const CLOCK_SLACK_MS: i64 = 1_000;

/// A unique owner name (cases never share owners, so "same owner" is always on purpose).
fn owner(tag: &str) -> String {
    format!("{tag}-{}", uuid::Uuid::new_v4().simple())
}

/// A unique session id.
fn session_id() -> SessionId {
    SessionId::new(format!("conformance-{}", uuid::Uuid::new_v4()))
}

/// The n-th test message.
fn message(n: usize) -> Value {
    json!({"role": "user", "content": format!("message {n}"), "n": n})
}

/// A checkpoint appending `messages`, with a plan/budget/state that name `tag`.
fn checkpoint(tag: &str, messages: Vec<Value>) -> NewCheckpoint {
    NewCheckpoint {
        messages,
        plan: json!({"plan": tag, "steps": [tag, "done"]}),
        budget: json!({"tag": tag, "spent_usd": 0.25, "tokens": 1234}),
        state: json!({"state": tag}),
        wake_at: None,
    }
}

/// A [`NewSession`] with a random id, app version `v1`, two initial messages.
fn new_session(owner: &str, ttl: Duration) -> NewSession {
    NewSession {
        id: session_id(),
        app_version: "v1".to_owned(),
        metadata: json!({"scratchpad": "/tmp/x", "labels": ["a", "b"]}),
        owner: owner.to_owned(),
        lease_ttl: ttl,
        initial: checkpoint("initial", vec![message(0), message(1)]),
        queue: None,
    }
}

/// Creates a fresh session leased to `owner` for [`LONG_TTL`].
async fn create(store: &dyn CheckpointStore, owner: &str) -> (SessionRecord, Lease) {
    create_with(store, new_session(owner, LONG_TTL)).await
}

/// Creates `new`, panicking with context on failure.
async fn create_with(store: &dyn CheckpointStore, new: NewSession) -> (SessionRecord, Lease) {
    let id = new.id.clone();
    store
        .create_session(new)
        .await
        .unwrap_or_else(|e| panic!("create_session(`{id}`) failed: {e:?}"))
}

/// Reads a session that must exist.
async fn read(store: &dyn CheckpointStore, id: &SessionId) -> SessionRecord {
    store
        .session(id)
        .await
        .unwrap_or_else(|e| panic!("session(`{id}`) failed: {e:?}"))
}

/// The store's clock.
async fn now(store: &dyn CheckpointStore) -> i64 {
    store.now().await.expect("now() failed")
}

/// Waits until the store's clock (the one leases are compared with) is past `at` (ms).
async fn wait_past(store: &dyn CheckpointStore, at: i64) {
    while now(store).await <= at {
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// A tool call with a fresh id.
fn tool_call(
    session: &SessionId,
    step: i64,
    tool: &str,
    input_hash: &str,
    ordinal: i64,
) -> NewCall {
    NewCall {
        id: CallId::random(),
        kind: CallKind::Tool,
        identity: CallIdentity {
            session: session.clone(),
            step,
            tool: tool.to_owned(),
            input_hash: input_hash.to_owned(),
            ordinal,
        },
        class: ReplayClass::UnsafeOnReplay,
        args: json!({"to": "a@example.com", "body": "hello", "n": ordinal}),
        idempotency_key: None,
        schema_hash: "schema-1".to_owned(),
    }
}

/// A completed outcome with spend.
fn completed(result: Value) -> FinishCall {
    FinishCall {
        outcome: CallOutcome::Completed(result),
        spend: Some(json!({"usd": 0.5})),
    }
}

/// `std::time::SystemTime::now()` in ms since the epoch.
fn system_ms() -> i64 {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("system clock before 1970");
    i64::try_from(since.as_millis()).expect("system clock out of range")
}

/// `ttl` in ms.
fn ms(ttl: Duration) -> i64 {
    i64::try_from(ttl.as_millis()).expect("ttl out of range")
}

/// Asserts that `$result` is `Err(pattern)`, evaluating to `$body` (bindings of the
/// pattern in scope); otherwise panics naming the operation, the expected error and what
/// came back.
macro_rules! expect_err {
    ($result:expr, $pat:pat => $body:expr, $($context:tt)+) => {
        match $result {
            Err($pat) => $body,
            other => panic!(
                "{}: expected `Err({})`, got {:?}",
                format_args!($($context)+),
                stringify!($pat),
                other
            ),
        }
    };
    ($result:expr, $pat:pat, $($context:tt)+) => {
        expect_err!($result, $pat => (), $($context)+)
    };
}
use expect_err;

#[cfg(test)]
mod tests {
    use super::CASES;

    #[test]
    fn case_names_are_unique_and_snake_case() {
        let mut seen = std::collections::HashSet::new();
        for name in CASES {
            assert!(seen.insert(*name), "case `{name}` is listed twice");
            assert!(
                name.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'),
                "case `{name}` is not snake_case"
            );
        }
        assert!(CASES.len() >= 40, "only {} cases listed", CASES.len());
    }
}
