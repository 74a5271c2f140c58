//! `durable verify`: every seal, chain and count of a whole store (or one session),
//! offline, plus the database's own consistency check.

use durable::SessionId;
use durable::integrity::{IntegrityLog, SessionCheck, verify_each};
use serde_json::{Value, json};

use crate::VerifyArgs;
use crate::display::{self, ID, TEXT, clip};
use crate::error::{CliError, Code};
use crate::open::{Kind, Opened};
use crate::render::{self, table};

/// The database's own check: what ran, whether it held, and what it said.
struct DatabaseCheck {
    name: &'static str,
    ok: Option<bool>,
    detail: Vec<String>,
}

async fn database_check(opened: &Opened) -> Result<DatabaseCheck, CliError> {
    match &opened.kind {
        #[cfg(feature = "sqlite")]
        Kind::Sqlite { store, .. } => {
            let report = store.integrity_check().await?;
            Ok(DatabaseCheck {
                name: "PRAGMA integrity_check",
                ok: Some(report == ["ok"]),
                detail: report,
            })
        }
        #[cfg(not(any(feature = "sqlite", feature = "postgres")))]
        Kind::None(never) => match *never {},
        #[cfg(feature = "postgres")]
        Kind::Postgres { store, .. } => {
            let name = "amcheck bt_index_check";
            Ok(match store.index_check().await? {
                durable::postgres::IndexCheck::Checked { indexes, problems } => DatabaseCheck {
                    name,
                    ok: Some(problems.is_empty()),
                    detail: if problems.is_empty() {
                        vec![format!("ok: {indexes} indexes")]
                    } else {
                        problems
                    },
                },
                other => DatabaseCheck {
                    name,
                    ok: None,
                    detail: vec![match other {
                        durable::postgres::IndexCheck::Unavailable(why) => why,
                        _ => "not run".into(),
                    }],
                },
            })
        }
    }
}

/// The rollback witness: whether the database still holds every effect its witness saw
/// acknowledged (SQLite), or is where the store last ran (PostgreSQL).
async fn rollback_check(opened: &Opened) -> Result<Option<(bool, String)>, CliError> {
    #[cfg(feature = "postgres")]
    if let Kind::Postgres { store, .. } = &opened.kind {
        let report = store.placement_report().await?;
        return Ok(Some(if report.rolled_back() {
            (false, report.changes.join("; "))
        } else {
            (true, "ok".to_owned())
        }));
    }
    Ok(match &opened.kind {
        #[cfg(feature = "sqlite")]
        Kind::Sqlite { store, .. } => {
            let report = store.rollback_report();
            Some(if !report.rolled_back() {
                (true, "ok".to_owned())
            } else if report.witness_missing {
                (
                    false,
                    "the database expects a witness file and it is gone (moved, copied or restored without it)".to_owned(),
                )
            } else {
                (
                    false,
                    format!(
                        "{} witnessed call(s) in {} session(s) are missing{}",
                        report.lost.len(),
                        report.sessions().len(),
                        if report.foreign_witness {
                            ", and the witness belongs to another store"
                        } else {
                            ""
                        }
                    ),
                )
            })
        }
        #[allow(unreachable_patterns)]
        _ => None,
    })
}

/// The store's integrity log with the check of its seal.
async fn integrity_log(opened: &Opened) -> Result<IntegrityLog, CliError> {
    Ok(match &opened.kind {
        #[cfg(feature = "sqlite")]
        Kind::Sqlite { store, .. } => store.integrity_log().await?,
        #[cfg(feature = "postgres")]
        Kind::Postgres { store, .. } => store.integrity_log().await?,
        #[cfg(not(any(feature = "sqlite", feature = "postgres")))]
        Kind::None(never) => match *never {},
    })
}

fn print_log(log: &IntegrityLog) {
    if !log.events.is_empty() {
        let mut t = table(["#", "EVENT", "FROM KEY", "TO KEY", "ROWS", "AT", "DETAIL"]);
        for e in &log.events {
            t.add_row(vec![
                e.id.to_string(),
                clip(&e.event, ID),
                clip(e.from_key.as_deref().unwrap_or("-"), ID),
                clip(&e.to_key, ID),
                e.rows.to_string(),
                render::time(e.created_at),
                clip(&e.detail, TEXT),
            ]);
        }
        render::print_table(&t);
    }
    match &log.problem {
        None => outln!(
            "integrity log: ok ({} event{}, sealed)",
            log.events.len(),
            if log.events.len() == 1 { "" } else { "s" }
        ),
        Some(problem) => outln!("integrity log: FAILED: {}", clip(problem, TEXT)),
    }
}

/// `durable rekey`: the writer's open has moved the store to the configured key (or
/// refused); report the key it is sealed with and the integrity log's newest event.
pub async fn rekey(opened: &Opened, json: bool) -> Result<(), CliError> {
    let log = integrity_log(opened).await?;
    let newest = log.events.last();
    if json {
        render::print_json(&json!({
            "ok": log.is_ok(),
            "sealed_with": newest.map(|e| e.to_key.clone()),
            "newest_event": newest,
            "integrity_log_problem": log.problem,
        }))?;
    } else {
        match newest {
            Some(e) if e.event == "rekey" || e.event == "restore" => outln!(
                "sealed with `{}`; newest integrity event: {} from `{}` ({} rows, {})",
                display::escape(&e.to_key),
                display::escape(&e.event),
                display::escape(e.from_key.as_deref().unwrap_or("-")),
                e.rows,
                render::time(e.created_at)
            ),
            _ => outln!("the store was already sealed with the configured key: nothing to re-seal"),
        }
        print_log(&log);
    }
    match log.refused() {
        Some(e) => Err(e.into()),
        None => Ok(()),
    }
}

fn line(check: &SessionCheck) -> Value {
    json!({
        "session": check.session,
        "ok": check.is_ok(),
        "checkpoints": check.checkpoints,
        "journal_rows": check.journal_rows,
        "resolutions": check.resolutions,
        "problem": check.problem,
    })
}

pub async fn verify(opened: &Opened, json: bool, args: VerifyArgs) -> Result<(), CliError> {
    let session = args.session.map(SessionId::new);
    // Each session's check is printed as it is made, a page of rows at a time: nothing
    // that grows with the store is held.
    let mut table = render::StreamTable::new([
        "SESSION",
        "RESULT",
        "CHECKPOINTS",
        "JOURNAL ROWS",
        "RESOLUTIONS",
        "PROBLEM",
    ]);
    let mut pending: Vec<Vec<String>> = Vec::new();
    let (mut verified, mut failed) = (0usize, 0usize);
    let mut array = None;
    if json {
        outln!("{{\n  \"sessions\":");
        array = Some(render::JsonArray::begin());
    }
    let mut encode_error = None;
    verify_each(opened.shared.as_ref(), session.as_ref(), |c| {
        verified += 1;
        failed += usize::from(!c.is_ok());
        match &mut array {
            Some(array) => {
                if let Err(e) = array.item(&line(&c)) {
                    encode_error.get_or_insert(e);
                }
            }
            None => {
                pending.push(vec![
                    clip(c.session.as_str(), ID),
                    if c.is_ok() { "ok" } else { "TAMPERED" }.to_owned(),
                    c.checkpoints.to_string(),
                    c.journal_rows.to_string(),
                    c.resolutions.to_string(),
                    clip(c.problem.as_deref().unwrap_or("-"), TEXT),
                ]);
                if pending.len() >= 200 {
                    table.page(&pending);
                    pending.clear();
                }
            }
        }
    })
    .await?;
    if let Some(e) = encode_error {
        return Err(e);
    }
    table.page(&pending);
    let database = database_check(opened).await?;
    let log = integrity_log(opened).await?;
    let database_failed = database.ok == Some(false);
    let rollback = rollback_check(opened).await?;
    let rolled_back = rollback.as_ref().is_some_and(|(ok, _)| !ok);
    let log_failed = !log.is_ok();
    if let Some(array) = array {
        array.end();
        // The rest of the report, after the sessions (an object's keys have no order).
        let rest = json!({
            "ok": failed == 0 && !database_failed && !log_failed && !rolled_back,
            "rollback_witness": rollback.as_ref().map(|(ok, detail)| json!({"ok": ok, "detail": detail})),
            "integrity_log": {
                "ok": log.is_ok(),
                "problem": log.problem,
                "events": log.events,
            },
            "database": {
                "check": database.name,
                "ok": database.ok,
                "detail": database.detail,
            },
        });
        let text = serde_json::to_string_pretty(&rest)
            .map_err(|e| CliError::new(Code::Failure, format!("cannot encode JSON output: {e}")))?;
        // `{ "ok": …, … }` without its braces, after the sessions' array.
        let inner = text
            .trim()
            .trim_start_matches('{')
            .trim_end_matches('}')
            .trim_end();
        outln!("  ,{}\n}}", display::json_text(inner));
    } else {
        if verified == 0 {
            outln!("no sessions");
        }
        print_log(&log);
        let verdict = match database.ok {
            Some(true) => "ok".to_owned(),
            Some(false) => format!("FAILED: {}", clip(&database.detail.join("; "), TEXT)),
            None => clip(&database.detail.join("; "), TEXT),
        };
        outln!("database ({}): {verdict}", database.name);
        if let Some((ok, detail)) = &rollback {
            let verdict = if *ok {
                detail.clone()
            } else {
                format!("ROLLED BACK: {}", clip(detail, TEXT))
            };
            outln!("rollback witness: {verdict}");
        }
        outln!(
            "{} session{} verified, {failed} failed",
            verified,
            if verified == 1 { "" } else { "s" }
        );
    }
    if rolled_back {
        return Err(CliError::new(
            Code::Integrity,
            "the store was rolled back (listed above): writers refuse it; stop every worker, then `durable acknowledge-rollback` (restoring a backup does not help: it is a rollback too)",
        ));
    }
    if failed > 0 || database_failed || log_failed {
        let mut what = Vec::new();
        if failed > 0 {
            what.push(format!(
                "{failed} of {verified} session{} failed",
                if verified == 1 { "" } else { "s" }
            ));
        }
        if database_failed {
            what.push(format!("the database failed `{}`", database.name));
        }
        if log_failed {
            what.push("the integrity log's seal does not hold".to_owned());
        }
        return Err(CliError::new(
            Code::Integrity,
            format!(
                "integrity check failed: {} (listed above); the store was changed outside durable: restore from a backup (a restore is a rollback: then `durable acknowledge-rollback`)",
                what.join(", ")
            ),
        ));
    }
    Ok(())
}
