//! The end-of-run invariants, read from the real store.

use durable_core::SessionId;
use durable_core::snapshot::Budget;
use durable_core::store::{CallStatus, CheckpointStore, SessionStatus};
use serde_json::Value;

use crate::program::Programs;
use crate::world::World;

/// The end-of-run invariants, read from the real store: every effect in a ledger is
/// recorded with the ledger's result (or listed in doubt), and every completed
/// session's budget charged each model reply once. Sessions that lost a row behind the
/// store's back (`lost`) are refused as tampered instead (checked by the caller): their
/// effects are in no journal that can be read.
pub(crate) async fn check_end(
    store: &dyn CheckpointStore,
    programs: &Programs,
    sessions: &[SessionId],
    lost: &std::collections::BTreeSet<SessionId>,
    world: &World,
    violations: &mut Vec<String>,
) {
    let of_lost = |call: &str| lost.iter().any(|id| call.starts_with(&format!("{id}/")));
    let in_doubt = store.in_doubt(None).await.unwrap_or_default();
    let mut journals = std::collections::BTreeMap::new();
    for id in sessions.iter().filter(|id| !lost.contains(*id)) {
        match store.calls(id, None).await {
            Ok(rows) => {
                journals.insert(id.clone(), rows);
            }
            Err(durable_core::StoreError::SessionNotFound(_)) => {}
            Err(e) => violations.push(format!("reading the journal of {id}: {e}")),
        }
    }
    let mut surfaced =
        |tool: &str, call: &str, result: &Value, key: Option<&str>, line: Option<&str>| {
            let matches = |row: &&durable_core::store::CallRecord| {
                row.identity.tool == tool
                    && row.args["call"] == call
                    && key.is_none_or(|k| row.idempotency_key.as_deref() == Some(k))
                    && line
                        .is_none_or(|s| crate::world::same_line(row.identity.session.as_str(), s))
            };
            // In the journal of the call's session, or of a fork of it (which runs its
            // parent's calls, with the same arguments).
            let recorded = journals
                .values()
                .flatten()
                .filter(matches)
                .filter(|row| matches!(row.status, CallStatus::Completed | CallStatus::Resolved))
                .min_by_key(|row| row.result.as_ref() != Some(result));
            match recorded {
                Some(row) if row.result.as_ref() == Some(result) => {}
                Some(row) => violations.push(format!(
                    "{tool} for {call}: the ledger says {result}, the journal recorded {:?}",
                    row.result
                )),
                None if in_doubt.iter().any(|row| matches(&row)) => {}
                None => violations.push(format!(
                    "effect not surfaced: {tool} for {call} happened ({result}) and the journal \
                 neither records it nor lists it in doubt"
                )),
            }
        };
    for email in world.emails().into_iter().filter(|e| !of_lost(&e.call)) {
        surfaced(
            "send_email",
            &email.call,
            &email.result,
            None,
            Some(&email.session),
        );
    }
    for wire in world.wires().into_iter().filter(|w| !of_lost(&w.call)) {
        surfaced("wire", &wire.call, &wire.result, None, Some(&wire.session));
    }
    for (key, charge) in world
        .charges()
        .into_iter()
        .filter(|(_, c)| !of_lost(&c.call))
    {
        surfaced("charge", &charge.call, &charge.result, Some(&key), None);
    }
    // Every signal a completed session consumed was read by its harness, and is in its
    // journal: a consumption whose read died is handed to the re-run read, never lost.
    for (id, rows) in &journals {
        let completed = store
            .session(id)
            .await
            .is_ok_and(|s| s.status == SessionStatus::Completed);
        if !completed {
            continue;
        }
        let Ok(signals) = store.signals(id).await else {
            violations.push(format!("reading the signals of {id}"));
            continue;
        };
        for signal in signals.iter().filter(|s| !s.is_pending()) {
            let journaled = rows.iter().any(|row| {
                row.identity.tool == durable_core::store::SIGNAL_SLOT
                    && row
                        .result
                        .as_ref()
                        .and_then(|r| r.get("id"))
                        .and_then(Value::as_i64)
                        == Some(signal.id)
            });
            if !journaled || !world.signal_read(signal.id) {
                violations.push(format!(
                    "a signal lost: #{} of {id} consumed by {:?}, {} its journal, {} its harness",
                    signal.id,
                    signal.consumed_by,
                    if journaled { "in" } else { "not in" },
                    if world.signal_read(signal.id) {
                        "read by"
                    } else {
                        "never read by"
                    },
                ));
            }
        }
    }
    for (id, program) in programs {
        let Ok(session) = store.session(id).await else {
            continue;
        };
        if session.status != SessionStatus::Completed {
            continue;
        }
        match store.load_checkpoint(id, None).await {
            Ok(cp) => match serde_json::from_value::<Budget>(cp.budget) {
                Ok(budget) if budget.spent_nano_usd == program.spend() => {}
                Ok(budget) => violations.push(format!(
                    "spend of {id}: the budget shows {} nano-dollars, its model replies cost {}",
                    budget.spent_nano_usd,
                    program.spend()
                )),
                Err(e) => violations.push(format!("budget of {id} unreadable: {e}")),
            },
            Err(e) => violations.push(format!("latest checkpoint of {id}: {e}")),
        }
    }
}
