//! The `durable` binary against real SQLite stores: every subcommand's output and exit
//! code, every bad-input case, and the end-to-end resolve of an in-doubt email.
//!
//! Stores are populated through the library (`tests/cli_support`); the binary is the one
//! Cargo built for this test (`CARGO_BIN_EXE_durable`).

mod cli_support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use cli_support::{Run, approvals, durable_env, hardening, run, scenarios, workers};
use durable::CheckpointStore;
use durable::sqlite::SqliteStore;

/// A fresh SQLite file: its directory guard, its path as a `--db` value, and the store.
async fn sqlite() -> (tempfile::TempDir, String, Arc<dyn CheckpointStore>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("agent.db");
    let store: Arc<dyn CheckpointStore> =
        Arc::new(SqliteStore::open(&path).await.expect("open store"));
    let db = path.to_str().expect("utf-8 path").to_owned();
    (dir, db, store)
}

macro_rules! scenario {
    ($($name:ident),* $(,)?) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            let (_dir, db, store) = sqlite().await;
            scenarios::$name(&store, &db).await;
        }
    )*};
}

scenario!(
    sessions,
    show,
    calls,
    in_doubt,
    resolve_refusals,
    resolve_end_to_end,
    fork,
    export,
    prune,
    retarget,
    unpark,
    unknown_things,
);

macro_rules! hardening {
    ($($name:ident),* $(,)?) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            let (_dir, db, store) = sqlite().await;
            hardening::$name(&store, &db).await;
        }
    )*};
}

hardening!(hostile_text);

macro_rules! approvals {
    ($($name:ident),* $(,)?) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            let (_dir, db, store) = sqlite().await;
            approvals::$name(&store, &db).await;
        }
    )*};
}

approvals!(approvals_listing, approve, deny_and_refusals, expire);

macro_rules! workers {
    ($($name:ident),* $(,)?) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            let (_dir, db, store) = sqlite().await;
            workers::$name(&store, &db).await;
        }
    )*};
}

workers!(
    workers,
    wake,
    queue_limit,
    tenant_limit,
    signal,
    show_queue_sleep_and_lease
);

#[tokio::test]
async fn sqlite_urls_are_accepted_in_every_spelling() {
    let (_dir, db, store) = sqlite().await;
    cli_support::populate(&store).await;
    for url in [db.clone(), format!("sqlite:{db}"), format!("sqlite://{db}")] {
        let out = run(&url, &["sessions", "--json"]);
        assert_eq!(out.json().as_array().map(Vec::len), Some(4), "{url}");
    }
}

/// How many sessions `durable sessions --json` lists with `args` and `env`.
#[track_caller]
fn listed(args: &[&str], env: &[(&str, &str)]) -> Option<usize> {
    let mut all = args.to_vec();
    all.extend(["sessions", "--json"]);
    let out: Run = durable_env(&all, env).into();
    out.json().as_array().map(Vec::len)
}

#[tokio::test]
async fn the_store_is_db_then_durable_db_then_database_url() {
    let (dir, db, store) = sqlite().await;
    cli_support::populate(&store).await;
    let typo = dir.path().join("typo.db");
    let typo = typo.to_str().expect("utf-8");

    // Only DURABLE_DB; only DATABASE_URL (a SQLite path or URL works there too).
    assert_eq!(listed(&[], &[("DURABLE_DB", &db)]), Some(4));
    assert_eq!(listed(&[], &[("DATABASE_URL", &db)]), Some(4));
    let url = format!("sqlite:{db}");
    assert_eq!(listed(&[], &[("DATABASE_URL", &url)]), Some(4));
    // Both: DURABLE_DB wins (DATABASE_URL names a file that does not exist).
    assert_eq!(
        listed(&[], &[("DURABLE_DB", &db), ("DATABASE_URL", typo)]),
        Some(4)
    );
    // --db wins over both.
    assert_eq!(
        listed(
            &["--db", &db],
            &[("DURABLE_DB", typo), ("DATABASE_URL", typo)]
        ),
        Some(4)
    );
    // An empty variable counts as unset.
    assert_eq!(
        listed(&[], &[("DURABLE_DB", ""), ("DATABASE_URL", &db)]),
        Some(4)
    );

    // A wrong location names where it came from.
    let wrong = |env: &[(&str, &str)]| -> Run { durable_env(&["sessions"], env).into() };
    wrong(&[("DURABLE_DB", typo), ("DATABASE_URL", &db)]).fails(6, "no SQLite database at");
    wrong(&[("DURABLE_DB", typo)]).fails(6, "; check DURABLE_DB (");
    wrong(&[("DATABASE_URL", typo)]).fails(6, "; check DATABASE_URL (");
    run(typo, &["sessions"]).fails(6, "; check --db (");
}

#[test]
fn no_database_is_a_usage_error_naming_the_three_ways() {
    for env in [&[][..], &[("DURABLE_DB", ""), ("DATABASE_URL", " ")]] {
        let out: Run = durable_env(&["sessions"], env).into();
        out.fails(
            2,
            "no database given: pass --db <sqlite file or postgres URL>, or set DURABLE_DB or DATABASE_URL",
        );
        assert_eq!(out.stderr.trim_end().lines().count(), 1, "{}", out.stderr);
    }
}

#[test]
fn migrate_is_now_retarget() {
    for args in [
        &["migrate", "s-1", "--app-version", "v2"][..],
        &["--db", "/nonexistent.db", "migrate", "s-1", "--help"],
    ] {
        let out: Run = durable_env(args, &[]).into();
        out.fails(2, "`durable migrate` is now `durable retarget`");
        assert!(
            out.stderr.contains("`durable retarget --help`"),
            "{}",
            out.stderr
        );
        assert_eq!(out.stderr.trim_end().lines().count(), 1, "{}", out.stderr);
    }
    let help: Run = durable_env(&["retarget", "--help"], &[]).into();
    let text = words(help.ok());
    assert!(text.contains("--map <OLD=NEW>"), "{text}");
    assert!(text.contains("Not a schema migration"), "{text}");
    assert!(text.contains("Formerly `durable migrate`"), "{text}");
}

/// `text` with every run of whitespace one space: help text wraps to the terminal.
fn words(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[test]
fn a_missing_file_is_not_created() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("typo.db");
    let db = path.to_str().expect("utf-8");
    for args in every_command(dir.path()) {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        run(db, &args).fails(6, "no SQLite database at");
        assert!(!path.exists(), "`{}` created a database", args.join(" "));
    }
    run(&format!("sqlite:{db}"), &["in-doubt"]).fails(6, "no SQLite database at");
    assert_eq!(files(dir.path()).len(), 0);
}

/// Every command, reading and writing, with arguments that would do something on a
/// store; `elsewhere` receives their output files (exports, backups).
fn every_command(elsewhere: &Path) -> Vec<Vec<String>> {
    let out = elsewhere.join("out").display().to_string();
    let copy = elsewhere.join("copy.db").display().to_string();
    [
        "sessions",
        "show s-1",
        "calls s-1",
        "in-doubt",
        "approvals",
        "prune --older-than 1d --dry-run",
        "retarget s-1 --app-version v2 --dry-run",
        "unpark s-1",
        "workers",
        "limits",
        "wake s-1",
        "queue-limit q-1 2",
        "queue-limit q-1 --remove",
        "tenant-limit t-1 2",
        "fork s-1 --from-version 0 --to s-2",
        "prune --older-than 1d",
        "retarget s-1 --app-version v2",
        "resolve c-1 --did-not-happen",
        "approvals --expire",
        "approve c-1",
        "approve c-1 --args {}",
        "deny c-1 --reason no",
    ]
    .iter()
    .map(|line| line.split(' ').map(str::to_owned).collect())
    .chain([
        vec![
            "export".into(),
            "--last".into(),
            "1".into(),
            "--out".into(),
            out,
        ],
        vec!["backup".into(), "--to".into(), copy],
    ])
    .collect()
}

/// Every file in `dir` with its bytes (`-wal`, `-shm` and `-journal` files included).
fn files(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .expect("read dir")
        .map(|entry| {
            let entry = entry.expect("entry");
            let bytes = std::fs::read(entry.path()).unwrap_or_default();
            (entry.file_name().to_string_lossy().into_owned(), bytes)
        })
        .collect()
}

/// Runs every command on `db` and checks that each is refused as not a durable store
/// and that nothing in `dir` changed (no byte, no new file).
fn refused_untouched(dir: &Path, db: &str) {
    let elsewhere = tempfile::tempdir().expect("tempdir");
    let before = files(dir);
    for args in every_command(elsewhere.path()) {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        run(db, &args).fails(6, "is not a durable store");
        assert_eq!(
            files(dir),
            before,
            "`durable --db {db} {}` changed the directory",
            args.join(" ")
        );
    }
    assert_eq!(
        files(elsewhere.path()).len(),
        0,
        "nothing is exported or copied"
    );
}

#[tokio::test]
async fn a_foreign_database_is_never_changed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("foreign.db");
    let pool = sqlx::SqlitePool::connect_with(
        sqlx::sqlite::SqliteConnectOptions::new()
            .filename(&path)
            .create_if_missing(true),
    )
    .await
    .expect("create a foreign database");
    sqlx::query("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT NOT NULL)")
        .execute(&pool)
        .await
        .expect("create table");
    sqlx::query("INSERT INTO notes (body) VALUES ('keep me as I am')")
        .execute(&pool)
        .await
        .expect("insert");
    pool.close().await;
    assert_eq!(
        files(dir.path()).len(),
        1,
        "a rollback-journal database, alone"
    );
    // Byte-identical afterwards: no table added, journal mode (header) unchanged, and
    // no -wal, -shm or -journal next to it.
    refused_untouched(dir.path(), path.to_str().expect("utf-8"));
}

#[test]
fn an_empty_file_stays_empty() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("empty.db");
    std::fs::write(&path, b"").expect("create an empty file");
    refused_untouched(dir.path(), path.to_str().expect("utf-8"));
    assert_eq!(std::fs::metadata(&path).expect("still there").len(), 0);
}

#[test]
fn a_file_that_is_not_a_database_is_unavailable() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path: PathBuf = dir.path().join("notes.txt");
    std::fs::write(
        &path,
        "these are not the tables you are looking for\n".repeat(200),
    )
    .expect("write");
    refused_untouched(dir.path(), path.to_str().expect("utf-8"));
}

#[test]
fn dev_null_is_refused_and_nothing_appears_next_to_it() {
    let siblings = ["/dev/null-journal", "/dev/null-wal", "/dev/null-shm"];
    let existed: Vec<bool> = siblings.iter().map(|s| Path::new(s).exists()).collect();
    let elsewhere = tempfile::tempdir().expect("tempdir");
    for args in every_command(elsewhere.path()) {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        run("/dev/null", &args).fails(6, "is not a durable store");
        for (sibling, existed) in siblings.iter().zip(&existed) {
            assert!(
                *existed || !Path::new(sibling).exists(),
                "`durable --db /dev/null {}` created {sibling}",
                args.join(" ")
            );
        }
    }
    assert_eq!(files(elsewhere.path()).len(), 0);
}
#[tokio::test]
async fn a_newer_schema_is_refused() {
    let (_dir, db, store) = sqlite().await;
    drop(store);
    let pool = sqlx::SqlitePool::connect(&format!("sqlite:{db}"))
        .await
        .expect("raw pool");
    sqlx::query(
        "INSERT INTO durable_schema_migrations (version, description, success, checksum, execution_time) \
         VALUES (9999, 'from the future', 1, x'00', 0)",
    )
    .execute(&pool)
    .await
    .expect("fake a newer migration");
    pool.close().await;
    run(&db, &["sessions"]).fails(
        6,
        "schema is at version 9999, newer than this release supports",
    );
}

#[test]
fn unknown_url_schemes_are_unavailable_and_keep_passwords_out() {
    run("mysql://root:hunter2@db/x", &["sessions"])
        .fails(6, "unsupported database URL `mysql://root:***@db/x`");
    let out = run("mysql://root:hunter2@db/x", &["sessions"]);
    assert!(!out.stderr.contains("hunter2"), "{}", out.stderr);
}

#[cfg(not(feature = "postgres"))]
#[test]
fn postgres_urls_name_the_missing_feature() {
    run("postgres://127.0.0.1:1/x", &["sessions"]).fails(
        6,
        "built without `postgres:` support; reinstall durable-cli with `--features postgres`",
    );
}

#[test]
fn help_lists_commands_and_exit_codes() {
    let out: Run = durable_env(&["--help"], &[]).into();
    let text = words(out.ok());
    for needle in [
        "sessions",
        "show",
        "calls",
        "in-doubt",
        "resolve",
        "approvals",
        "approve",
        "deny",
        "durable --db agent.db approvals --expire",
        "fork",
        "export",
        "prune",
        "retarget",
        "workers",
        "limits",
        "wake",
        "queue-limit",
        "Without --db: $DURABLE_DB, else $DATABASE_URL",
        "--db, else the DURABLE_DB environment variable, else DATABASE_URL",
        "Exit codes:",
        "3  not found",
        "6  database unavailable",
    ] {
        assert!(
            text.contains(&words(needle)),
            "{needle:?} missing from --help:\n{}",
            out.stdout
        );
    }
    let resolve: Run = durable_env(&["resolve", "--help"], &[]).into();
    assert!(
        resolve.ok().contains("--did-not-happen"),
        "{}",
        resolve.stdout
    );
    for (command, needle) in [
        ("approvals", "--expire"),
        (
            "approve",
            "Values shown masked (`<secret>`, `***`) may be kept as shown",
        ),
        ("deny", "--reason <REASON>"),
    ] {
        let help: Run = durable_env(&[command, "--help"], &[]).into();
        assert!(words(help.ok()).contains(needle), "{}", help.stdout);
    }
    let version: Run = durable_env(&["--version"], &[]).into();
    assert!(version.ok().starts_with("durable "), "{}", version.stdout);
}

/// An application key, as `DURABLE_MAC_KEY` holds it.
const APP_KEY: &str = "0123456789abcdef-cli-test-key";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_sealed_with_an_app_key_needs_it() {
    use durable::integrity::Keyring;
    use durable::sqlite::SqliteStoreOptions;

    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("keyed.db");
    let keyed = SqliteStoreOptions::file(&path)
        .keyring(Keyring::with_app_key(APP_KEY.as_bytes().to_vec()).expect("key"));
    let store: Arc<dyn CheckpointStore> =
        Arc::new(SqliteStore::connect_with(keyed).await.expect("open keyed"));
    let p = cli_support::populate(&store).await;
    let db = path.to_str().expect("utf-8");
    let with = |key: &str, args: &[&str]| -> Run {
        let mut all = vec!["--db", db];
        all.extend_from_slice(args);
        durable_env(&all, &[("DURABLE_MAC_KEY", key)]).into()
    };

    // Without the key: one line naming the key, nothing written.
    for args in [
        &["sessions"][..],
        &["resolve", p.doubt_call.id.as_str(), "--did-not-happen"],
    ] {
        run(db, args).fails(6, "key `app-");
    }
    with("short", &["sessions"]).fails(2, "DURABLE_MAC_KEY");

    // With it: the CLI reads, and its resolution is sealed so the application reads it.
    assert_eq!(
        with(APP_KEY, &["sessions", "--json"])
            .json()
            .as_array()
            .map(Vec::len),
        Some(4)
    );
    let id = p.doubt_call.id.as_str();
    with(
        APP_KEY,
        &[
            "resolve",
            id,
            "--did-not-happen",
            "--note",
            "not in the outbox",
        ],
    )
    .ok();
    let call = store
        .call(&p.doubt_call.id)
        .await
        .expect("the application reads it");
    assert_eq!(call.status, durable::store::CallStatus::NotHappened);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backup_writes_a_checked_copy_of_a_live_store() {
    let (dir, db, store) = sqlite().await;
    cli_support::populate(&store).await;
    let copy = dir.path().join("copy.db");
    let copy_arg = copy.to_str().expect("utf-8");

    let out = run(&db, &["backup", "--to", copy_arg]);
    let text = out.ok();
    assert!(text.contains("4 sessions"), "{text}");
    assert!(text.contains("integrity_check"), "{text}");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&copy).expect("copy").permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "{mode:o}");
    }
    // One self-contained file, and a store: the same sessions, read from the copy alone.
    assert!(!dir.path().join("copy.db-wal").exists());
    let listed = run(copy_arg, &["sessions", "--json"]).json();
    assert_eq!(listed.as_array().map(Vec::len), Some(4), "{listed}");

    // Never overwrites.
    let bytes = std::fs::read(&copy).expect("copy");
    run(&db, &["backup", "--to", copy_arg]).fails(4, "exists");
    assert_eq!(std::fs::read(&copy).expect("copy"), bytes);
    run(&db, &["backup"]).fails(2, "--to");

    let second = dir.path().join("second.db");
    let report = run(
        &db,
        &["backup", "--to", second.to_str().expect("utf-8"), "--json"],
    )
    .json();
    assert_eq!(report["sessions"], 4, "{report}");
    assert_eq!(report["integrity_check"], "ok");

    // What the README warns about: the .db file alone, copied while the store runs,
    // misses what is still in the -wal file.
    let naive = dir.path().join("naive.db");
    std::fs::copy(&db, &naive).expect("copy the .db file alone");
    let naive = run(naive.to_str().expect("utf-8"), &["sessions", "--json"]);
    assert!(
        naive.code != 0 || naive.json().as_array().map_or(0, Vec::len) < 4,
        "the .db alone held every session: {}",
        naive.stdout
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_megabyte_id_does_not_pad_the_table() {
    use durable::Message;

    let (_dir, db, store) = sqlite().await;
    cli_support::populate(&store).await;
    let worker = durable::Durable::builder(Arc::clone(&store))
        .owner("worker-9")
        .build();
    let session = worker
        .start::<Message>(durable::StartOptions::new().with_id(durable::SessionId::new("s-plain")))
        .await
        .expect("start");
    session.release().await.expect("release");
    // Written behind durable's back (durable refuses such ids): a store from elsewhere.
    let long = format!("s-{}{}", hardening::EVIL, "x".repeat(1 << 20));
    let pool = sqlx::SqlitePool::connect(&format!("sqlite:{db}"))
        .await
        .expect("raw pool");
    sqlx::query("UPDATE durable_sessions SET id = ? WHERE id = 's-plain'")
        .bind(&long)
        .execute(&pool)
        .await
        .expect("rename behind durable's back");
    pool.close().await;

    let out = run(&db, &["sessions"]);
    hardening::assert_run_safe("sessions", &out);
    let widest = out
        .stdout
        .lines()
        .chain(out.stderr.lines())
        .map(|l| l.chars().count())
        .max()
        .unwrap_or(0);
    assert!(widest <= 1100, "a line of {widest} characters");
    assert!(
        out.stdout.len() + out.stderr.len() < 16 * 1024,
        "{} bytes",
        out.stdout.len()
    );
    let text = out.ok();
    let row = text
        .lines()
        .find(|l| l.starts_with("s-\\e]0;pwned\\u{7} \\e[1;31m"))
        .unwrap_or_else(|| panic!("no row for the long id:\n{text}"));
    assert!(row.contains("… "), "cut with an ellipsis: {row}");
    assert!(
        text.lines().all(|l| l.chars().count() < 200),
        "the other rows are not padded:\n{text}"
    );
    // JSON keeps the whole id.
    let listed = run(&db, &["sessions", "--json"]).json();
    assert!(
        listed
            .as_array()
            .expect("array")
            .iter()
            .any(|s| s["id"] == long.as_str()),
        "the full id is in --json"
    );
    // Every other command that shows ids: escaped and bounded too, whatever it finds.
    for args in [
        &["in-doubt"][..],
        &["verify"],
        &["export", "--last", "9", "--out", "/nonexistent"],
    ] {
        let out = run(&db, args);
        hardening::assert_run_safe(&args.join(" "), &out);
        let widest = out
            .stdout
            .lines()
            .chain(out.stderr.lines())
            .map(|l| l.chars().count())
            .max();
        assert!(
            widest.unwrap_or(0) <= 1100,
            "{args:?}: a line of {widest:?} characters"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_names_the_tampered_session() {
    let (_dir, db, store) = sqlite().await;
    let p = cli_support::populate(&store).await;
    let clean = run(&db, &["verify"]);
    assert!(
        clean.ok().contains("4 sessions verified, 0 failed"),
        "{}",
        clean.stdout
    );
    assert!(
        clean.stdout.contains("PRAGMA integrity_check): ok"),
        "{}",
        clean.stdout
    );

    // A completed keyed charge set back to "not happened": the next resume would charge
    // again. Behind durable's back, as someone with the file would.
    let pool = sqlx::SqlitePool::connect(&format!("sqlite:{db}"))
        .await
        .expect("raw pool");
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

    let out = run(&db, &["verify"]);
    out.fails(7, "integrity check failed: 1 of 4 sessions failed");
    let row = out
        .stdout
        .lines()
        .find(|l| l.starts_with("s-done"))
        .unwrap_or_else(|| panic!("no row for s-done:\n{}", out.stdout));
    assert!(row.contains("TAMPERED"), "{row}");
    for other in ["s-doubt", "s-live", "s-cancelled"] {
        let line = out
            .stdout
            .lines()
            .find(|l| l.starts_with(other))
            .expect(other);
        assert!(line.contains(" ok "), "{line}");
    }
    let report = run(&db, &["verify", "--json"]);
    assert_eq!(report.code, 7);
    let value: serde_json::Value = serde_json::from_str(&report.stdout).expect("json");
    assert_eq!(value["ok"], false);
    // One session only.
    run(&db, &["verify", "s-doubt"]).ok();
    run(&db, &["verify", "s-done"]).fails(7, "1 of 1 session failed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_app_key_is_refused_in_one_line() {
    use durable::integrity::Keyring;
    use durable::sqlite::SqliteStoreOptions;

    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("keyed.db");
    let keyed = SqliteStoreOptions::file(&path)
        .keyring(Keyring::with_app_key(APP_KEY.as_bytes().to_vec()).expect("key"));
    let store: Arc<dyn CheckpointStore> =
        Arc::new(SqliteStore::connect_with(keyed).await.expect("open keyed"));
    let p = cli_support::populate(&store).await;
    let db = path.to_str().expect("utf-8");
    for args in [
        &["sessions"][..],
        &["resolve", p.doubt_call.id.as_str(), "--did-not-happen"],
    ] {
        let mut all = vec!["--db", db];
        all.extend_from_slice(args);
        let out: Run =
            durable_env(&all, &[("DURABLE_MAC_KEY", "another-key-of-enough-length")]).into();
        // The key is wrong, the store was not changed: say so, not "tampered".
        out.fails(6, "key `app-");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restored_backup_is_refused_until_acknowledged() {
    let (dir, db, store) = sqlite().await;
    cli_support::populate(&store).await;
    let copy = dir.path().join("restored.db");
    let copy_arg = copy.to_str().expect("utf-8");
    run(&db, &["backup", "--to", copy_arg]).ok();
    drop(store);

    // The copy, put where a restore puts it, has no witness: verify says so, and says
    // what to do.
    let verify = run(copy_arg, &["verify"]);
    assert_eq!(verify.code, 7, "{}\n{}", verify.stdout, verify.stderr);
    assert!(
        verify.stdout.contains("rollback witness: ROLLED BACK"),
        "{}",
        verify.stdout
    );
    assert!(
        verify.stderr.contains("acknowledge-rollback"),
        "{}",
        verify.stderr
    );
    // A writer refuses it.
    run(copy_arg, &["unpark", "anything"]).fails(7, "was rolled back");

    let ack = run(copy_arg, &["acknowledge-rollback", "--by", "ops", "--json"]).json();
    assert_eq!(ack["witness_missing"], true, "{ack}");
    let sessions = run(copy_arg, &["sessions", "--json"]).json();
    let rows = sessions.as_array().expect("rows");
    assert!(!rows.is_empty());
    for row in rows {
        let status = row["status"].as_str().unwrap_or_default();
        assert!(
            ["parked", "completed", "failed", "cancelled"].contains(&status),
            "an unfinished session was left runnable after a restore: {row}"
        );
    }
    let verify = run(copy_arg, &["verify"]);
    assert!(
        verify.ok().contains("rollback witness: ok"),
        "{}",
        verify.stdout
    );
    // On a PostgreSQL URL it connects (and says where it could not), password hidden.
    let unreachable = run(
        "postgres://u:secret@127.0.0.1:1/db",
        &["acknowledge-rollback", "--by", "ops"],
    );
    unreachable.fails(6, "127.0.0.1:1");
    assert!(
        !unreachable.stderr.contains("secret"),
        "{}",
        unreachable.stderr
    );
}

/// Key rotation and a lost key, from the CLI: `durable rekey` rotates a store whose sessions
/// have messages (K1 → K2, K1 as previous), `verify` shows the audited rotation; with
/// the key lost, `--unverified` still lists the sessions, marked as unverified, and
/// refuses to write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rekey_rotates_and_unverified_reads_a_store_whose_key_is_lost() {
    use durable::integrity::Keyring;
    use durable::sqlite::SqliteStoreOptions;

    const NEW_KEY: &str = "fedcba9876543210-cli-new-key";
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("keyed.db");
    let keyed = SqliteStoreOptions::file(&path)
        .keyring(Keyring::with_app_key(APP_KEY.as_bytes().to_vec()).expect("key"));
    let store = SqliteStore::connect_with(keyed).await.expect("open keyed");
    let shared: Arc<dyn CheckpointStore> = Arc::new(store.clone());
    cli_support::populate(&shared).await;
    store.close().await;
    drop(shared);
    let db = path.to_str().expect("utf-8");
    let rotating = [
        ("DURABLE_MAC_KEY", NEW_KEY),
        ("DURABLE_PREVIOUS_MAC_KEYS", APP_KEY),
    ];
    let out: Run = durable_env(&["--db", db, "rekey"], &rotating).into();
    let text = out.ok();
    assert!(text.contains("rekey from `app-"), "{text}");
    let out: Run = durable_env(&["--db", db, "verify"], &[("DURABLE_MAC_KEY", NEW_KEY)]).into();
    let text = out.ok();
    assert!(
        text.contains("integrity log: ok (1 event, sealed)"),
        "{text}"
    );
    assert!(text.contains("4 sessions verified, 0 failed"), "{text}");
    let out: Run = durable_env(
        &["--db", db, "verify", "--json"],
        &[("DURABLE_MAC_KEY", NEW_KEY)],
    )
    .into();
    let report = out.json();
    assert_eq!(report["integrity_log"]["ok"], true, "{report}");
    assert_eq!(report["integrity_log"]["events"][0]["event"], "rekey");

    // The key lost: nothing lists, unless unverified, which says so and never writes.
    run(db, &["sessions"]).fails(6, "key `app-");
    let out = run(db, &["--unverified", "sessions"]);
    let text = out.ok();
    assert!(text.starts_with("UNVERIFIED"), "{text}");
    assert!(text.contains("s-done"), "{text}");
    assert!(out.stderr.contains("--unverified"), "{}", out.stderr);
    let listed = run(db, &["--unverified", "sessions", "--json"]).json();
    assert_eq!(listed["unverified"], true, "{listed}");
    run(db, &["--unverified", "unpark", "s-done"]).fails(2, "--unverified only reads");
    run(db, &["--unverified", "verify"]).fails(2, "--unverified");

    // An edited integrity log fails `verify`.
    let pool = sqlx::SqlitePool::connect(&format!("sqlite:{db}"))
        .await
        .expect("raw pool");
    sqlx::query("UPDATE durable_integrity_log SET rows = 0")
        .execute(&pool)
        .await
        .expect("edit the log");
    pool.close().await;
    let out: Run = durable_env(&["--db", db, "verify"], &[("DURABLE_MAC_KEY", NEW_KEY)]).into();
    out.fails(7, "integrity log");
    assert!(
        out.stdout.contains("integrity log: FAILED"),
        "{}",
        out.stdout
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decision_without_user_is_audited_by_uid() {
    let (_dir, db, store) = sqlite().await;
    let population = cli_support::populate(&store).await;
    let call = population.doubt_call.id.to_string();
    // A container or CI job: no USER, LOGNAME or USERNAME.
    let out: Run = std::process::Command::new(env!("CARGO_BIN_EXE_durable"))
        .args(["--db", &db, "resolve", &call, "--did-not-happen", "--json"])
        .env_remove("USER")
        .env_remove("LOGNAME")
        .env_remove("USERNAME")
        .env_remove("DURABLE_DB")
        .env_remove("DATABASE_URL")
        .env_remove("DURABLE_MAC_KEY")
        .env_remove("DURABLE_PREVIOUS_MAC_KEYS")
        .output()
        .expect("run")
        .into();
    out.ok();
    let resolutions = store
        .resolutions(&population.doubt)
        .await
        .expect("resolutions");
    assert_eq!(resolutions.len(), 1);
    assert!(
        resolutions[0].by.starts_with("uid:"),
        "{:?}",
        resolutions[0].by
    );
}

/// One row with a status this release does not know (written by a newer release, or
/// changed outside durable) does not make `sessions` fail for the whole store: that row is
/// listed as `unknown` with its raw status, the others whole; acting on that session is a
/// typed error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_status_is_listed_not_fatal() {
    use durable::Message;

    let (_dir, db, store) = sqlite().await;
    let worker = durable::Durable::builder(Arc::clone(&store))
        .owner("worker-9")
        .build();
    for id in ["s-known", "s-future"] {
        let session = worker
            .start::<Message>(durable::StartOptions::new().with_id(durable::SessionId::new(id)))
            .await
            .expect("start");
        session.release().await.expect("release");
    }
    let pool = sqlx::SqlitePool::connect(&format!("sqlite:{db}"))
        .await
        .expect("raw pool");
    sqlx::query("UPDATE durable_sessions SET status = 'suspended' WHERE id = 's-future'")
        .execute(&pool)
        .await
        .expect("a status from a newer release");
    pool.close().await;

    let text = run(&db, &["sessions"]).ok().to_owned();
    let row = |id: &str| {
        text.lines()
            .find(|l| l.starts_with(id))
            .unwrap_or_else(|| panic!("no row for {id}:\n{text}"))
            .to_owned()
    };
    assert!(row("s-future").contains("unknown (`suspended`)"), "{text}");
    assert!(row("s-known").contains("active"), "{text}");
    assert!(text.contains("status this release does not know"), "{text}");
    let listed = run(&db, &["sessions", "--json"]).json();
    let listed = listed.as_array().expect("array");
    let future = listed
        .iter()
        .find(|s| s["id"] == "s-future")
        .expect("the unknown row is in --json");
    assert_eq!(future["status"], "unknown", "{future}");
    assert_eq!(future["raw_status"], "suspended", "{future}");
    assert!(
        listed
            .iter()
            .any(|s| s["id"] == "s-known" && s["status"] == "active")
    );
    // Acting on that session: a typed error naming the status.
    run(&db, &["show", "s-future"]).fails(1, "unknown session status `suspended`");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn budget_show_and_raise() {
    let (_dir, db, store) = sqlite().await;
    cli_support::budget::budget(&store, &db).await;
}
