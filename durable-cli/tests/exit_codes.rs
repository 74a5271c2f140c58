//! The exit code of each error kind, pinned: the README's table of exit codes says what
//! `code_of` (the one place the CLI maps an error's kind to a code) does, for every kind;
//! and the real `durable` binary, on real SQLite stores, exits with the documented code
//! for each kind a command can meet.

mod cli_support;

// The file the binary compiles, compiled here too: the table is checked against the
// mapping itself, not a copy of it.
#[allow(dead_code)]
#[path = "../src/error/code.rs"]
mod code;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use cli_support::{populate, run};
use durable::CheckpointStore;
use durable::error::ErrorKind;
use durable::sqlite::SqliteStore;

/// Every kind of error. `ErrorKind` is `#[non_exhaustive]`, so this list cannot be
/// checked for completeness by the compiler: a new kind maps to `1` in `code_of` until
/// it is given a code, and needs a row here and in the README.
const KINDS: [ErrorKind; 14] = [
    ErrorKind::NotFound,
    ErrorKind::Conflict,
    ErrorKind::InvalidInput,
    ErrorKind::OperatorNeeded,
    ErrorKind::AwaitingApproval,
    ErrorKind::LimitExceeded,
    ErrorKind::Integrity,
    ErrorKind::Unreadable,
    ErrorKind::Unavailable,
    ErrorKind::PermissionDenied,
    ErrorKind::Transient,
    ErrorKind::Overloaded,
    ErrorKind::Unsupported,
    ErrorKind::Cancelled,
];

/// The README's table of exit codes ("Operating it"): the codes it lists, and the code
/// of each error kind it names.
fn readme_table() -> (BTreeSet<i32>, BTreeMap<String, i32>) {
    let readme = include_str!("../../README.md");
    let mut lines = readme
        .lines()
        .skip_while(|l| !l.starts_with("| exit code | meaning | error kinds |"));
    assert!(
        lines.next().is_some(),
        "the README has a table of exit codes headed `| exit code | meaning | error kinds |`"
    );
    assert!(lines.next().is_some_and(|l| l.starts_with("|---")));
    let mut codes = BTreeSet::new();
    let mut kinds = BTreeMap::new();
    for row in lines.take_while(|l| l.starts_with('|')) {
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        assert_eq!(cells.len(), 5, "three cells: {row}");
        let code: i32 = cells[1]
            .trim_matches('`')
            .parse()
            .unwrap_or_else(|_| panic!("a code in the first cell: {row}"));
        assert!(codes.insert(code), "code {code} listed twice");
        for kind in cells[3].split(',').map(|k| k.trim().trim_matches('`')) {
            if !kind.is_empty() {
                let before = kinds.insert(kind.to_owned(), code);
                assert_eq!(before, None, "kind `{kind}` listed twice");
            }
        }
    }
    (codes, kinds)
}

/// The code the README documents for `kind`.
fn documented(kind: ErrorKind) -> i32 {
    readme_table().1[kind.as_str()]
}

#[test]
fn the_readme_table_of_exit_codes_is_what_code_of_does() {
    let (codes, kinds) = readme_table();
    let all_codes = [
        code::Code::Ok,
        code::Code::Failure,
        code::Code::Usage,
        code::Code::NotFound,
        code::Code::Refused,
        code::Code::InvalidInput,
        code::Code::Unavailable,
        code::Code::Integrity,
    ];
    assert_eq!(
        codes,
        all_codes.iter().map(|c| *c as i32).collect::<BTreeSet<_>>(),
        "the README lists every exit code, and no other"
    );
    for kind in KINDS {
        assert_eq!(
            kinds.get(kind.as_str()).copied(),
            Some(code::code_of(kind) as i32),
            "the README's exit code for `{kind}` is the one `code_of` chooses"
        );
    }
    let known: BTreeSet<&str> = KINDS.iter().map(|k| k.as_str()).collect();
    for kind in kinds.keys() {
        assert!(
            known.contains(kind.as_str()),
            "the README names `{kind}`, which is no kind"
        );
    }
}

/// One command per kind a command can meet, each on a real store, exits with the code
/// the README documents for that kind. Not reachable from the CLI: `operator_needed`,
/// `awaiting_approval` and `limit_exceeded` (raised while a harness runs a session),
/// `permission_denied` (the commands that only read never write), `transient`,
/// `overloaded` and `unsupported` (a failing or exhausted database, a backend without
/// the operation); their codes are pinned by the table test above.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_kind_a_command_meets_exits_with_its_documented_code() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("agent.db");
    let store: Arc<dyn CheckpointStore> =
        Arc::new(SqliteStore::open(&path).await.expect("open store"));
    let db = path.to_str().expect("utf-8 path").to_owned();
    let p = populate(&store).await;

    run(&db, &["show", "s-nope"]).fails(documented(ErrorKind::NotFound), "s-nope");
    run(
        &db,
        &["resolve", p.live_call.id.as_str(), "--did-not-happen"],
    )
    .fails(documented(ErrorKind::Conflict), "is still running");
    run(
        &db,
        &[
            "resolve",
            p.doubt_call.id.as_str(),
            "--happened",
            "--result",
            "{\"id\": ",
        ],
    )
    .fails(
        documented(ErrorKind::InvalidInput),
        "--result is not valid JSON",
    );
    run("/dev/null", &["sessions"])
        .fails(documented(ErrorKind::Unavailable), "is not a durable store");
    run(&db, &["sessions", "--no-such-flag"]).fails(2, "--no-such-flag");

    // Behind durable's back, as someone with the file would: a status from a newer
    // release on one session, a completed charge set back to "not happened" on another.
    let pool = sqlx::SqlitePool::connect(&format!("sqlite:{db}"))
        .await
        .expect("raw pool");
    let changed = sqlx::query("UPDATE durable_sessions SET status = 'suspended' WHERE id = ?")
        .bind(p.cancelled.as_str())
        .execute(&pool)
        .await
        .expect("a status from a newer release");
    assert_eq!(changed.rows_affected(), 1);
    let changed = sqlx::query(
        "UPDATE durable_tool_calls SET status = 'not_happened', result = NULL \
         WHERE session_id = ? AND tool_name = 'charge_card'",
    )
    .bind(p.done.as_str())
    .execute(&pool)
    .await
    .expect("tamper");
    assert_eq!(changed.rows_affected(), 1);
    pool.close().await;

    run(&db, &["show", p.cancelled.as_str()]).fails(
        documented(ErrorKind::Unreadable),
        "unknown session status `suspended`",
    );
    run(&db, &["calls", p.done.as_str()]).fails(documented(ErrorKind::Integrity), "");
}
