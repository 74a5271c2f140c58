//! The store's keys at open, written once for every backend: loading (or creating) the
//! store's own key, sealing a database that was never sealed, re-sealing one under a new
//! key, restoring a missing `signing_key` row, and the sealed integrity log that audits
//! each of them. A backend supplies its tables through [`KeyTables`] (its SQL, inside the
//! transaction that migrated the schema) and calls [`setup_keys`].

use async_trait::async_trait;

use super::{INTEGRITY_LOG_SEAL, IntegrityEvent, IntegrityLog, KeyAction, Keyring, OpenFacts};
use crate::error::StoreError;
use crate::ids::SessionId;

/// What the key setup reads and writes, one method a statement or a walk, all inside the
/// transaction that opens the store (a backend implements it over its connection).
#[async_trait]
pub trait KeyTables: Send {
    /// A `durable_meta` value.
    async fn meta(&mut self, name: &str) -> Result<Option<String>, StoreError>;

    /// Sets a `durable_meta` value (insert or update).
    async fn set_meta(&mut self, name: &str, value: &str) -> Result<(), StoreError>;

    /// The database clock (ms since the epoch).
    async fn now(&mut self) -> Result<i64, StoreError>;

    /// How many sessions the database holds, and the head seal of the oldest session
    /// whose head is sealed (its key id says which key sealed the database).
    async fn sealed_with(&mut self) -> Result<(i64, Option<String>), StoreError>;

    /// Every session's id, oldest first (locked against writers where the database
    /// needs it).
    async fn session_ids(&mut self) -> Result<Vec<SessionId>, StoreError>;

    /// Re-seals every row of one session under `to`, after checking it under `from`
    /// (`None`: sealed as found), with [`Reseal`](super::rows::Reseal). Returns the rows
    /// sealed.
    async fn reseal_session(
        &mut self,
        from: Option<&Keyring>,
        to: &Keyring,
        session: &SessionId,
    ) -> Result<i64, StoreError>;

    /// Counts the issued rows of every session head written before heads counted them,
    /// checked under `ring` ([`rows::count_issued`](super::rows::count_issued)).
    async fn upgrade_heads(&mut self, ring: &Keyring) -> Result<(), StoreError>;

    /// Every event of the integrity log, oldest first.
    async fn log_events(&mut self) -> Result<Vec<IntegrityEvent>, StoreError>;

    /// Appends one event to the integrity log (not sealed here: [`append_log`] re-seals
    /// the whole log after it).
    async fn insert_log_event(&mut self, event: &LogEvent<'_>, now: i64) -> Result<(), StoreError>;
}

/// An event of the integrity log, to append.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogEvent<'a> {
    /// `rekey`, `restore`, `adopt`, `seal_log` or an operator's event.
    pub event: &'a str,
    /// The key id the rows were sealed with, if any.
    pub from: Option<&'a str>,
    /// The key id they are sealed with now (`-`: none).
    pub to: &'a str,
    /// Rows re-sealed.
    pub rows: i64,
    /// What happened, for the operator.
    pub detail: &'a str,
}

/// Loads (or creates) the store's own key, binds it into `ring`, and makes sure every
/// row is sealed with `ring`'s signing key: seals a database whose rows predate seals,
/// re-seals one sealed with a key `ring` can check (an application key turned on, or
/// rotated), restores a missing `signing_key` row after checking every row, and refuses
/// the rest ([`Keyring::on_open`]). Runs inside the open's transaction (the one that
/// migrated the schema), so concurrent openers do this once, and `seals_migrated_now`
/// (the sealing migration ran in this transaction) is the witness that the rows genuinely
/// predate seals.
pub async fn setup_keys<T: KeyTables + ?Sized>(
    tables: &mut T,
    ring: Keyring,
    seals_migrated_now: bool,
) -> Result<Keyring, StoreError> {
    let current = tables.meta("signing_key").await?;
    let (sessions, head) = tables.sealed_with().await?;
    let sealed_with = head
        .as_deref()
        .and_then(|seal| seal.split_once(':'))
        .map(|(id, _)| id);
    let facts = OpenFacts::signed(current.as_deref())
        .migrated_now(seals_migrated_now)
        .holding(sessions, sealed_with);
    let store_key = match tables.meta("store_key").await? {
        Some(hex) => Keyring::store_key_from_hex(&hex)?,
        None if facts.may_create_store_key() => {
            let key = super::random_key()?;
            tables.set_meta("store_key", &super::hex(&key)).await?;
            key
        }
        None => return Err(facts.store_key_missing()),
    };
    let ring = ring.bind_store_key(store_key);
    let now = tables.now().await?;
    let signing = ring.signing_id().to_owned();
    match ring.on_open(&facts)? {
        KeyAction::Keep => {
            tables.upgrade_heads(&ring).await?;
            seal_legacy_log(tables, &ring, now).await?;
            return Ok(ring);
        }
        KeyAction::Rekey { from_id, from } => {
            let rows = reseal_all(tables, Some(&from), &ring).await?;
            let entry = LogEvent {
                event: "rekey",
                from: Some(&from_id),
                to: &signing,
                rows,
                detail: "every row was checked under the old key, then re-sealed under the new one",
            };
            append(tables, &entry, &from, &ring, now).await?;
            tracing::warn!(from = %from_id, to = %signing, rows, "re-sealed the store under a new key");
        }
        KeyAction::Restore { from_id, from } => {
            let rows = reseal_all(tables, Some(&from), &ring).await?;
            let entry = LogEvent {
                event: "restore",
                from: Some(&from_id),
                to: &signing,
                rows,
                detail: "the `signing_key` row of `durable_meta` was missing: every row was checked under the key its seals name, re-sealed under the signing key, and the row written back",
            };
            append(tables, &entry, &from, &ring, now).await?;
            tracing::warn!(from = %from_id, to = %signing, rows, "restored the missing signing_key row after checking every row");
        }
        KeyAction::Adopt => {
            let rows = reseal_all(tables, None, &ring).await?;
            if rows > 0 {
                let entry = LogEvent {
                    event: "adopt",
                    from: None,
                    to: &signing,
                    rows,
                    detail: "rows written before tamper evidence (schema version 1) were sealed as found; their content before this point is not authenticated",
                };
                append(tables, &entry, &ring, &ring, now).await?;
                tracing::warn!(to = %signing, rows, "sealed a store written without seals");
            }
        }
    }
    tables.set_meta("signing_key", &signing).await?;
    Ok(ring)
}

/// Re-seals every session, oldest first.
async fn reseal_all<T: KeyTables + ?Sized>(
    tables: &mut T,
    from: Option<&Keyring>,
    to: &Keyring,
) -> Result<i64, StoreError> {
    let mut rows = 0;
    for session in tables.session_ids().await? {
        rows += tables.reseal_session(from, to, &session).await?;
    }
    Ok(rows)
}

/// Appends an operator's event (a rollback acknowledged) to the sealed integrity log,
/// checking the log as it stands and re-sealing it under `ring`.
pub async fn append_log<T: KeyTables + ?Sized>(
    tables: &mut T,
    ring: &Keyring,
    event: &LogEvent<'_>,
    now: i64,
) -> Result<(), StoreError> {
    append(tables, event, ring, ring, now).await
}

/// Appends `event` and re-seals the whole log under `to`, after checking the log as it
/// stands under `check` (the key that sealed it). A log that does not hold is refused;
/// one written before the log was sealed is sealed as found first, audited as
/// `seal_log`.
async fn append<T: KeyTables + ?Sized>(
    tables: &mut T,
    event: &LogEvent<'_>,
    check: &Keyring,
    to: &Keyring,
    now: i64,
) -> Result<(), StoreError> {
    let log = read_log(tables, check).await?;
    if let Some(refused) = log.refused() {
        if tables.meta(INTEGRITY_LOG_SEAL).await?.is_some() {
            return Err(refused);
        }
        let events = log.events.len();
        tables
            .insert_log_event(&seal_log_event(events), now)
            .await?;
    }
    tables.insert_log_event(event, now).await?;
    reseal_log(tables, to).await
}

/// The event that records sealing a log written before logs were sealed.
fn seal_log_event(events: usize) -> LogEvent<'static> {
    LogEvent {
        event: "seal_log",
        from: None,
        to: "-",
        rows: i64::try_from(events).unwrap_or(i64::MAX),
        detail: "the events above were written before this log was sealed: they were sealed as found, and are not authenticated",
    }
}

/// Seals, as found and audited, a non-empty integrity log that has no seal (written
/// before logs were sealed). A log whose seal does not hold is left as found: it decides
/// nothing, and `durable verify` reports it.
async fn seal_legacy_log<T: KeyTables + ?Sized>(
    tables: &mut T,
    ring: &Keyring,
    now: i64,
) -> Result<(), StoreError> {
    if tables.meta(INTEGRITY_LOG_SEAL).await?.is_some() {
        return Ok(());
    }
    let log = read_log(tables, ring).await?;
    if log.events.is_empty() {
        return Ok(());
    }
    let events = log.events.len();
    tables
        .insert_log_event(&seal_log_event(events), now)
        .await?;
    reseal_log(tables, ring).await
}

/// Seals the integrity log as it now stands under `to`.
async fn reseal_log<T: KeyTables + ?Sized>(tables: &mut T, to: &Keyring) -> Result<(), StoreError> {
    let events = tables.log_events().await?;
    let seal = to.seal(&super::integrity_log_fields(&events))?;
    tables.set_meta(INTEGRITY_LOG_SEAL, &seal).await
}

/// The integrity log with the check of its seal under `ring`.
pub async fn read_log<T: KeyTables + ?Sized>(
    tables: &mut T,
    ring: &Keyring,
) -> Result<IntegrityLog, StoreError> {
    let events = tables.log_events().await?;
    let seal = tables.meta(INTEGRITY_LOG_SEAL).await?;
    Ok(IntegrityLog::check(ring, events, seal.as_deref()))
}
