//! Opening the store `--db` names.
//!
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

/// Opens the store `db` names for a command with `access`.
pub async fn open(db: Option<&str>, access: Access) -> Result<Opened, CliError> {
    let Some(url) = db.filter(|u| !u.trim().is_empty()) else {
        return Err(CliError::new(
            Code::Usage,
            "no database given: pass --db <sqlite file or postgres URL>, or set DURABLE_DB",
        ));
    };
    // Whatever goes wrong from here, its report never shows the URL's password.
    error::hide_password_of(url);
    let keyring = Keyring::from_env()
        .map_err(|e| CliError::new(Code::Usage, format!("{MAC_KEY_ENV}: {e}")))?;
    match target(url) {
        Target::SqliteFile(path) => sqlite(path, access, keyring).await,
        Target::Postgres => postgres(url, access, keyring).await,
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
async fn sqlite(path: &str, access: Access, keyring: Keyring) -> Result<Opened, CliError> {
    use durable::sqlite::{SqliteStore, SqliteStoreOptions};

    if std::fs::symlink_metadata(path).is_err() {
        return Err(CliError::new(
            Code::Unavailable,
            format!(
                "no SQLite database at `{}`; check --db (this tool never creates a database)",
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
        // A durable store a writer upgrades.
        (Access::Write, Err(durable::StoreError::SchemaTooOld { .. })) => {
            SqliteStore::connect_with(options)
                .await
                .map_err(CliError::open)?
        }
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
async fn sqlite(path: &str, _access: Access, _keyring: Keyring) -> Result<Opened, CliError> {
    refused(path).await
}

#[cfg(feature = "postgres")]
async fn postgres(url: &str, access: Access, keyring: Keyring) -> Result<Opened, CliError> {
    use durable::postgres::{PostgresStore, PostgresStoreOptions};

    let shown_url = durable::redact_url(url);
    probe_postgres(&shown_url)?;
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
        (Access::Write, Err(durable::StoreError::SchemaTooOld { .. })) => {
            PostgresStore::connect_with(options)
                .await
                .map_err(CliError::open)?
        }
        (Access::Write, Err(e)) => return Err(CliError::open(e)),
    };
    Ok(Opened {
        shared: Arc::new(store.clone()),
        kind: Kind::Postgres { store, shown_url },
    })
}

#[cfg(not(feature = "postgres"))]
async fn postgres(url: &str, _access: Access, _keyring: Keyring) -> Result<Opened, CliError> {
    refused(url).await
}

/// Fails fast, with the socket error, when a PostgreSQL server named by host and port
/// does not answer: the pool would otherwise wait its whole acquire timeout and report
/// only that it timed out. URLs without a plain host (Unix sockets) are left to the pool.
///
/// Takes the URL with its password already redacted, so that nothing it parses or
/// prints can hold any part of the password, whatever characters that contains.
#[cfg(feature = "postgres")]
fn probe_postgres(shown_url: &str) -> Result<(), CliError> {
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
                "cannot reach PostgreSQL at {}: {detail}; check --db and that the server is running",
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
