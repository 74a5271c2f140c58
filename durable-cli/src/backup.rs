//! `durable backup`: a consistent online copy of a SQLite store; `pg_dump` guidance for
//! PostgreSQL.

use serde_json::json;

use crate::BackupArgs;
use crate::display::{self, clip};
use crate::error::{CliError, Code};
use crate::open::{Kind, Opened};
use crate::render;

pub async fn backup(opened: &Opened, json: bool, args: BackupArgs) -> Result<(), CliError> {
    match &opened.kind {
        #[cfg(feature = "sqlite")]
        Kind::Sqlite { store, path } => sqlite(store, path, json, args).await,
        #[cfg(not(any(feature = "sqlite", feature = "postgres")))]
        Kind::None(never) => match *never {},
        #[cfg(feature = "postgres")]
        Kind::Postgres { store, shown_url } => postgres(store, shown_url, json, args).await,
    }
}

#[cfg(feature = "sqlite")]
async fn sqlite(
    store: &durable::sqlite::SqliteStore,
    from: &str,
    json: bool,
    args: BackupArgs,
) -> Result<(), CliError> {
    let Some(to) = args.to else {
        return Err(CliError::new(
            Code::Usage,
            "pass --to <FILE>: the new file to write the copy to",
        ));
    };
    let shown_to = display::escape(&to.display().to_string()).into_owned();
    // The store creates the file exclusively (no race); this says it in plain words.
    if std::fs::symlink_metadata(&to).is_ok() {
        return Err(CliError::new(
            Code::Refused,
            format!("`{shown_to}` exists; a backup never overwrites a file: choose a new name"),
        ));
    }
    let copy = store.backup_to(&to).await?;
    if json {
        return render::print_json(&json!({
            "from": from,
            "to": copy.path.display().to_string(),
            "bytes": copy.bytes,
            "sessions": copy.sessions,
            "checkpoints": copy.checkpoints,
            "journal_rows": copy.journal_rows,
            "schema_version": copy.schema_version,
            "integrity_check": "ok",
        }));
    }
    outln!(
        "backed up `{}` to `{shown_to}`: {} session{}, {} checkpoint{}, {} journal row{}, {}",
        clip(from, display::TEXT),
        copy.sessions,
        plural(copy.sessions),
        copy.checkpoints,
        plural(copy.checkpoints),
        copy.journal_rows,
        plural(copy.journal_rows),
        render::size(usize::try_from(copy.bytes).unwrap_or(usize::MAX)),
    );
    outln!(
        "the copy is one file (no -wal to keep with it), readable by you only, and passed `PRAGMA integrity_check`"
    );
    Ok(())
}

fn plural(n: i64) -> &'static str {
    if n == 1 { "" } else { "s" }
}

#[cfg(feature = "postgres")]
async fn postgres(
    _store: &durable::postgres::PostgresStore,
    shown_url: &str,
    json: bool,
    args: BackupArgs,
) -> Result<(), CliError> {
    let file = args
        .to
        .as_ref()
        .map_or_else(|| "durable.dump".to_owned(), |p| p.display().to_string());
    // No password at all (not even `***`, which pg_dump would send): it comes from
    // PGPASSWORD or ~/.pgpass.
    let dump_url = shown_url.replacen(":***@", "@", 1);
    let command = format!(
        "pg_dump --format=custom --file {} --table {} {}",
        shell_quote(&file),
        shell_quote(TABLES),
        shell_quote(&dump_url)
    );
    if json {
        render::print_json(&json!({
            "written": false,
            "command": command,
            "tables": TABLES,
        }))?;
    } else {
        outln!("PostgreSQL is backed up with its own tools; this command writes nothing.");
        outln!("A consistent copy of the durable tables (one snapshot, while workers run):");
        outln!();
        outln!("  {}", display::escape(&command));
        outln!();
        outln!(
            "Give the password through PGPASSWORD or ~/.pgpass, not on the command line (other users see it in `ps`)."
        );
        outln!(
            "{TABLES} is every table of the store: sessions, messages, checkpoints, tool calls, errors, resolutions, migrations, and the integrity keys and log."
        );
        outln!(
            "Restore into an empty database with `pg_restore --dbname <URL> {}`; for point-in-time recovery, archive the server's WAL.",
            display::escape(&shell_quote(&file))
        );
    }
    if args.to.is_some() {
        return Err(CliError::new(
            Code::Refused,
            "nothing was written: durable backup --to copies SQLite stores only; run the pg_dump command above",
        ));
    }
    Ok(())
}

/// The `pg_dump --table` pattern of a durable store's tables.
#[cfg(feature = "postgres")]
const TABLES: &str = "durable_*";

/// `text` as one POSIX shell word.
#[cfg(feature = "postgres")]
fn shell_quote(text: &str) -> String {
    if !text.is_empty()
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./:@%+=,".contains(c))
    {
        return text.to_owned();
    }
    format!("'{}'", text.replace('\'', r"'\''"))
}
