//! Opening the store `--db` names.
//!
//! - Found at `--db`, else `DURABLE_DB`, else `DATABASE_URL` ([`locate`]); an error
//!   about the location names the one it came from.
//! - Never created: a missing file or an empty one is refused, not made into a store.
//! - Always opened read-only first. A read-only open never creates a file (no `-journal`
//!   next to `/dev/null`), never migrates and never changes the journal mode, and it
//!   refuses anything that is not a durable store (a foreign SQLite database, an empty
//!   file, a text file) with one line. Commands that only read keep that store; commands
//!   that write then open the (now known to be durable) store for writing.
//! - With the keys of `DURABLE_MAC_KEY` (and `DURABLE_PREVIOUS_MAC_KEYS`): a store sealed
//!   with an application key refuses to open without it, in one line.

use std::sync::Arc;

use durable::CheckpointStore;
use durable::integrity::{Keyring, MAC_KEY_ENV};

use crate::Access;
use crate::display;
use crate::error::{self, CliError, Code};

/// The store a command runs on.
pub struct Opened {
    /// The store, for the commands that need only the trait.
    pub shared: Arc<dyn CheckpointStore>,
    /// The concrete store, for backend-specific commands (`backup`).
    pub kind: Kind,
}

/// The concrete store behind [`Opened::shared`].
pub enum Kind {
    /// A SQLite file.
    #[cfg(feature = "sqlite")]
    Sqlite {
        store: durable::sqlite::SqliteStore,
        /// The file, as given.
        path: String,
    },
    /// A PostgreSQL database.
    #[cfg(feature = "postgres")]
    Postgres {
        store: durable::postgres::PostgresStore,
        /// The URL with its password redacted: the only form the CLI prints.
        shown_url: String,
    },
    /// No backend compiled in: never built ([`open`] fails first).
    #[cfg(not(any(feature = "sqlite", feature = "postgres")))]
    None(std::convert::Infallible),
}

/// What a `--db` value names, by the rules of [`durable::connect`].
enum Target<'a> {
    SqliteFile(&'a str),
    Postgres,
    Memory,
    /// An unknown scheme.
    Other,
}

fn target(url: &str) -> Target<'_> {
    if url == "sqlite::memory:" || url == ":memory:" {
        return Target::Memory;
    }
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        return Target::Postgres;
    }
    if let Some(rest) = url.strip_prefix("sqlite:") {
        return Target::SqliteFile(rest.strip_prefix("//").unwrap_or(rest));
    }
    if url.contains("://") {
        return Target::Other;
    }
    Target::SqliteFile(url)
}

/// The SQLite file a `--db` value names, if it names one.
pub fn sqlite_file(url: &str) -> Option<&str> {
    match target(url) {
        Target::SqliteFile(path) => Some(path),
        _ => None,
    }
}

/// The environment variable read when `--db` is absent.
pub const DB_ENV: &str = "DURABLE_DB";
/// The environment variable read when neither `--db` nor [`DB_ENV`] is given: the one
/// sqlx and most PostgreSQL tools read.
pub const DATABASE_URL_ENV: &str = "DATABASE_URL";

/// Where the store is, and which of the three ways named it.
#[derive(Debug, PartialEq, Eq)]
pub struct Location {
    /// A SQLite file or a database URL, as given.
    pub url: String,
    /// `--db`, [`DB_ENV`] or [`DATABASE_URL_ENV`]: what to fix when it is wrong.
    pub source: &'static str,
}

/// `--db`, else `DURABLE_DB`, else `DATABASE_URL` (`env` reads a variable). An empty or
/// blank value counts as unset.
pub fn locate(
    flag: Option<String>,
    env: impl Fn(&str) -> Option<String>,
) -> Result<Location, CliError> {
    let given = |v: &Option<String>| v.as_ref().is_some_and(|v| !v.trim().is_empty());
    if given(&flag) {
        return Ok(Location {
            url: flag.unwrap_or_default(),
            source: "--db",
        });
    }
    for source in [DB_ENV, DATABASE_URL_ENV] {
        let value = env(source);
        if given(&value) {
            return Ok(Location {
                url: value.unwrap_or_default(),
                source,
            });
        }
    }
    Err(CliError::new(
        Code::Usage,
        format!(
            "no database given: pass --db <sqlite file or postgres URL>, or set {DB_ENV} or {DATABASE_URL_ENV}"
        ),
    ))
}

/// Opens the store at `location` for a command with `access`.
///
/// `unverified` (read-only commands only) reads without checking seals
/// ([`Keyring::dangerous_unverified`]), for a store whose key is lost.
pub async fn open(
    location: &Location,
    access: Access,
    unverified: bool,
) -> Result<Opened, CliError> {
    let url = location.url.as_str();
    let source = location.source;
    // Whatever goes wrong from here, its report never shows the URL's password.
    error::hide_password_of(url);
    let mut keyring = Keyring::from_env()
        .map_err(|e| CliError::new(Code::Usage, format!("{MAC_KEY_ENV}: {e}")))?;
    if unverified && access == Access::Read {
        keyring = keyring.dangerous_unverified();
    }
    match target(url) {
        Target::SqliteFile(path) => sqlite(path, source, access, keyring).await,
        Target::Postgres => postgres(url, source, access, keyring).await,
        Target::Memory => Err(CliError::new(
            Code::Unavailable,
            "an in-memory database holds no sessions; pass the file or URL of a store",
        )),
        Target::Other => refused(url).await,
    }
}

/// The facade's refusal of a URL no compiled-in backend opens (an unknown scheme, a
/// backend whose feature is off): it fails on the URL's scheme, before opening anything.
async fn refused(url: &str) -> Result<Opened, CliError> {
    match durable::connect(url).await {
        Err(e) => Err(CliError::connect(e)),
        Ok(_) => Err(CliError::new(
            Code::Failure,
            "this `durable` binary cannot open that URL",
        )),
    }
}

#[cfg(feature = "sqlite")]
async fn sqlite(
    path: &str,
    source: &str,
    access: Access,
    keyring: Keyring,
) -> Result<Opened, CliError> {
    use durable::sqlite::{SqliteStore, SqliteStoreOptions};

    if std::fs::symlink_metadata(path).is_err() {
        return Err(CliError::new(
            Code::Unavailable,
            format!(
                "no SQLite database at `{}`; check {source} (this tool never creates a database)",
                display::escape(path)
            ),
        ));
    }
    let options = SqliteStoreOptions::file(path)
        .create_if_missing(false)
        .keyring(keyring);
    let read_only = SqliteStore::connect_with(options.clone().read_only(true)).await;
    let store = match (access, read_only) {
        (Access::Read, Ok(store)) => store,
        (Access::Read, Err(e)) => return Err(CliError::open(e)),
        (Access::Write, Ok(store)) => {
            store.close().await;
            SqliteStore::connect_with(options)
                .await
                .map_err(CliError::open)?
        }
        // A durable store a writer upgrades, or moves to the configured key (a reader
        // re-seals nothing, so it refuses a key rotation; the writer checks every row
        // under the old key and decides).
        (
            Access::Write,
            Err(durable::StoreError::SchemaTooOld { .. } | durable::StoreError::KeyMissing { .. }),
        ) => SqliteStore::connect_with(options)
            .await
            .map_err(CliError::open)?,
        (Access::Write, Err(e)) => return Err(CliError::open(e)),
    };
    Ok(Opened {
        shared: Arc::new(store.clone()),
        kind: Kind::Sqlite {
            store,
            path: path.to_owned(),
        },
    })
}

#[cfg(not(feature = "sqlite"))]
async fn sqlite(
    path: &str,
    _source: &str,
    _access: Access,
    _keyring: Keyring,
) -> Result<Opened, CliError> {
    refused(path).await
}

#[cfg(feature = "postgres")]
async fn postgres(
    url: &str,
    source: &str,
    access: Access,
    keyring: Keyring,
) -> Result<Opened, CliError> {
    use durable::postgres::{PostgresStore, PostgresStoreOptions};

    let shown_url = durable::store::redact_url(url);
    probe_postgres(&shown_url, source)?;
    let options = PostgresStoreOptions::new(url).keyring(keyring);
    let read_only = PostgresStore::connect_with(options.clone().read_only(true)).await;
    let store = match (access, read_only) {
        (Access::Read, Ok(store)) => store,
        (Access::Read, Err(e)) => return Err(CliError::open(e)),
        (Access::Write, Ok(store)) => {
            store.pool().close().await;
            PostgresStore::connect_with(options)
                .await
                .map_err(CliError::open)?
        }
        // A durable store a writer upgrades, or moves to the configured key (a reader
        // re-seals nothing, so it refuses a key rotation; the writer checks every row
        // under the old key and decides).
        (
            Access::Write,
            Err(durable::StoreError::SchemaTooOld { .. } | durable::StoreError::KeyMissing { .. }),
        ) => PostgresStore::connect_with(options)
            .await
            .map_err(CliError::open)?,
        (Access::Write, Err(e)) => return Err(CliError::open(e)),
    };
    Ok(Opened {
        shared: Arc::new(store.clone()),
        kind: Kind::Postgres { store, shown_url },
    })
}

#[cfg(not(feature = "postgres"))]
async fn postgres(
    url: &str,
    _source: &str,
    _access: Access,
    _keyring: Keyring,
) -> Result<Opened, CliError> {
    refused(url).await
}

/// Fails fast, with the socket error, when a PostgreSQL server named by host and port
/// does not answer: the pool would otherwise wait its whole acquire timeout and report
/// only that it timed out. URLs without a plain host (Unix sockets) are left to the pool.
///
/// Takes the URL with its password already redacted, so that nothing it parses or
/// prints can hold any part of the password, whatever characters that contains.
#[cfg(feature = "postgres")]
fn probe_postgres(shown_url: &str, source: &str) -> Result<(), CliError> {
    use std::net::{TcpStream, ToSocketAddrs};
    use std::time::Duration;

    let Some(rest) = shown_url
        .strip_prefix("postgres://")
        .or_else(|| shown_url.strip_prefix("postgresql://"))
    else {
        return Ok(());
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, hp)| hp);
    if host_port.is_empty() || host_port.contains(',') || host_port.starts_with('%') {
        return Ok(());
    }
    let with_port = if host_port.ends_with(']') || !host_port.contains(':') {
        format!("{host_port}:5432")
    } else {
        host_port.to_owned()
    };
    let unreachable = |detail: String| {
        CliError::new(
            Code::Unavailable,
            format!(
                "cannot reach PostgreSQL at {}: {detail}; check {source} and that the server is running",
                display::escape(&with_port)
            ),
        )
    };
    let addrs: Vec<_> = match with_port.to_socket_addrs() {
        Ok(addrs) => addrs.collect(),
        Err(e) => return Err(unreachable(e.to_string())),
    };
    let mut last = None;
    for addr in addrs {
        match TcpStream::connect_timeout(&addr, Duration::from_secs(5)) {
            Ok(_) => return Ok(()),
            Err(e) => last = Some(e),
        }
    }
    match last {
        Some(e) => Err(unreachable(e.to_string())),
        None => Err(unreachable("the host name resolves to no address".into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| (*v).to_owned())
        }
    }

    fn at(url: &str, source: &'static str) -> Location {
        Location {
            url: url.to_owned(),
            source,
        }
    }

    #[test]
    fn the_flag_then_durable_db_then_database_url() {
        let both = [("DURABLE_DB", "a.db"), ("DATABASE_URL", "postgres://db/x")];
        let flag = Some("flag.db".to_owned());
        assert_eq!(locate(flag, env(&both)).ok(), Some(at("flag.db", "--db")));
        assert_eq!(
            locate(None, env(&both)).ok(),
            Some(at("a.db", "DURABLE_DB"))
        );
        let url_only = [("DATABASE_URL", "postgres://db/x")];
        assert_eq!(
            locate(None, env(&url_only)).ok(),
            Some(at("postgres://db/x", "DATABASE_URL"))
        );
        // Empty or blank counts as unset, at every level.
        let blank = [("DURABLE_DB", " "), ("DATABASE_URL", "b.db")];
        assert_eq!(
            locate(Some(String::new()), env(&blank)).ok(),
            Some(at("b.db", "DATABASE_URL"))
        );
        let none = locate(None, env(&[("DURABLE_DB", ""), ("DATABASE_URL", "")]));
        let e = none.err().map(|e| (e.code, e.message));
        assert_eq!(
            e,
            Some((
                Code::Usage,
                "no database given: pass --db <sqlite file or postgres URL>, or set DURABLE_DB or DATABASE_URL".to_owned()
            ))
        );
    }
}
