//! One session's rows walked as a whole, written once for every backend: the re-seal
//! walk ([`reseal_session`]: every row checked under the key it was sealed with and
//! sealed again under a new one, at a key change or for a fork's copied rows) and the
//! count of a head written before heads counted their issued rows ([`upgrade_heads`]).
//!
//! A backend implements [`SessionTables`]: it reads each table of one session into the
//! sealed rows of [`rows`](super::rows) and writes the seals back, with its own SQL, in
//! the transaction its caller holds. What is checked, in which order, and what is
//! written is decided here.

use async_trait::async_trait;

use super::Keyring;
use super::rows::{
    CheckpointRow, HeadRow, RawApproval, RawCall, RawMessage, RawResolution, Reseal,
    check_approvals, count_issued,
};
use crate::error::StoreError;
use crate::ids::SessionId;

/// A backend's reads and writes of one session's sealed rows, in one transaction (the
/// caller's). Rows are read in the order their seals chain: the journal by position, the
/// transcript by position, checkpoints by version, resolutions and approval events in
/// the order they were written.
#[async_trait]
pub trait SessionTables: Send {
    /// The session's head as stored.
    async fn head(&mut self, session: &SessionId) -> Result<HeadRow, StoreError>;

    /// Checks that the journal holds exactly rows `1..=head.journal_rows`
    /// ([`check_journal_extent`](super::rows::check_journal_extent) over the backend's
    /// count and ends).
    async fn check_journal_complete(&mut self, head: &HeadRow) -> Result<(), StoreError>;

    /// Every journal row, by position.
    async fn calls(&mut self, session: &SessionId) -> Result<Vec<RawCall>, StoreError>;

    /// Every transcript message, by position.
    async fn messages(&mut self, session: &SessionId) -> Result<Vec<RawMessage>, StoreError>;

    /// Every checkpoint, by version, its snapshots resolved to the text they seal.
    async fn checkpoints(&mut self, session: &SessionId) -> Result<Vec<CheckpointRow>, StoreError>;

    /// Every resolution with the backend's row id, in the order written.
    async fn resolutions(
        &mut self,
        session: &SessionId,
    ) -> Result<Vec<(i64, RawResolution)>, StoreError>;

    /// Every approval event with the backend's row id, by position.
    async fn approvals(
        &mut self,
        session: &SessionId,
    ) -> Result<Vec<(i64, RawApproval)>, StoreError>;

    /// Writes the journal rows' seals ([`RawCall::mac`]).
    async fn write_call_seals(&mut self, calls: &[RawCall]) -> Result<(), StoreError>;

    /// Writes messages' seals, by position.
    async fn write_message_seals(
        &mut self,
        session: &SessionId,
        seals: &[(i64, String)],
    ) -> Result<(), StoreError>;

    /// Writes checkpoints' seals, by version.
    async fn write_checkpoint_seals(
        &mut self,
        session: &SessionId,
        seals: &[(i64, String)],
    ) -> Result<(), StoreError>;

    /// Writes resolutions' seals, by row id.
    async fn write_resolution_seals(&mut self, seals: &[(i64, String)]) -> Result<(), StoreError>;

    /// Writes approval events' seals, by row id.
    async fn write_approval_seals(&mut self, seals: &[(i64, String)]) -> Result<(), StoreError>;

    /// Seals the head under `ring` as it now stands and writes it with its counts.
    async fn store_head(&mut self, head: &mut HeadRow, ring: &Keyring) -> Result<(), StoreError>;

    /// The sessions whose head was written before heads counted their issued rows, oldest
    /// first, locked against writers where the database needs it.
    async fn uncounted_heads(&mut self) -> Result<Vec<SessionId>, StoreError>;

    /// Before one session's count: a point [`abandon_upgrade`](Self::abandon_upgrade)
    /// rolls back to (a savepoint), where the database has one.
    async fn begin_upgrade(&mut self) -> Result<(), StoreError> {
        Ok(())
    }

    /// One session's count was refused: undoes what it wrote since
    /// [`begin_upgrade`](Self::begin_upgrade).
    async fn abandon_upgrade(&mut self) -> Result<(), StoreError> {
        Ok(())
    }

    /// One session's head was counted (a backend that lists the heads to count drops it
    /// from its list).
    async fn upgraded(&mut self, session: &SessionId) -> Result<(), StoreError> {
        let _ = session;
        Ok(())
    }
}

/// Re-seals every row of `session` under `to`, after checking it under `from` (`None`:
/// the rows were never sealed, or were copied for a fork, and are sealed as found).
/// The head first (while it names the latest checkpoint's old seal) with the journal's
/// extent, then the journal (a head written before heads counted issued rows gets its
/// count), the transcript and the checkpoints in order (chained), the resolutions, the
/// approval log (checked whole: every event at its position, their number against the
/// head), and last the head over the latest checkpoint's new seal. Returns the rows
/// sealed, the head included.
pub async fn reseal_session<T: SessionTables + ?Sized>(
    tables: &mut T,
    from: Option<&Keyring>,
    to: &Keyring,
    session: &SessionId,
) -> Result<i64, StoreError> {
    let mut head = tables.head(session).await?;
    let mut walk = Reseal::new(from, to, session);
    walk.check_head(&head)?;
    if walk.checks() {
        tables.check_journal_complete(&head).await?;
    }
    let mut sealed = 0usize;
    let mut calls = tables.calls(session).await?;
    walk.calls(&mut head, &mut calls)?;
    if !calls.is_empty() {
        tables.write_call_seals(&calls).await?;
    }
    sealed += calls.len();
    let mut seals = Vec::new();
    for message in tables.messages(session).await? {
        seals.push((message.seq, walk.message(&message)?));
    }
    if !seals.is_empty() {
        tables.write_message_seals(session, &seals).await?;
    }
    sealed += seals.len();
    let mut seals = Vec::new();
    for checkpoint in tables.checkpoints(session).await? {
        let (version, last_seq) = (checkpoint.version, checkpoint.last_seq);
        let seal = walk.checkpoint(&checkpoint, || StoreError::Tampered {
            session: session.clone(),
            what: format!("checkpoint {version}"),
            detail: format!("its transcript ends at message {last_seq}, which is missing"),
        })?;
        seals.push((version, seal));
    }
    if !seals.is_empty() {
        tables.write_checkpoint_seals(session, &seals).await?;
    }
    sealed += seals.len();
    let mut seals = Vec::new();
    for (rowid, resolution) in tables.resolutions(session).await? {
        seals.push((rowid, walk.resolution(&resolution)?));
    }
    if !seals.is_empty() {
        tables.write_resolution_seals(&seals).await?;
    }
    sealed += seals.len();
    let approvals = tables.approvals(session).await?;
    if let Some(from) = from {
        let raws: Vec<RawApproval> = approvals.iter().map(|(_, raw)| raw.clone()).collect();
        check_approvals(from, &head, &raws)?;
    }
    let mut seals = Vec::with_capacity(approvals.len());
    for (rowid, mut raw) in approvals {
        raw.seal(to, session)?;
        seals.push((rowid, raw.seal.unwrap_or_default()));
    }
    if !seals.is_empty() {
        tables.write_approval_seals(&seals).await?;
    }
    sealed += seals.len();
    walk.point_head(&mut head);
    tables.store_head(&mut head, to).await?;
    Ok(i64::try_from(sealed).unwrap_or(i64::MAX).saturating_add(1))
}

/// Counts the issued rows of every session whose head was written before heads counted
/// them, and re-seals that head with the count, in the caller's transaction. Each such
/// session is checked first, under `ring`: its head in the old format, the journal's
/// extent and every journal row's seal, so a status changed behind the store's back
/// before the upgrade is never counted. A session that fails its checks keeps its old
/// head (every read or write of it then fails as [`StoreError::Tampered`]: the head has
/// no count), logged as an error; the others are upgraded. Any other error ends the
/// upgrade.
pub async fn upgrade_heads<T: SessionTables + ?Sized>(
    tables: &mut T,
    ring: &Keyring,
) -> Result<(), StoreError> {
    let sessions = tables.uncounted_heads().await?;
    if sessions.is_empty() {
        return Ok(());
    }
    let mut upgraded = 0usize;
    for session in &sessions {
        tables.begin_upgrade().await?;
        match upgrade_head(tables, ring, session).await {
            Ok(()) => {
                tables.upgraded(session).await?;
                upgraded += 1;
            }
            Err(e @ (StoreError::Tampered { .. } | StoreError::Corrupt { .. })) => {
                tables.abandon_upgrade().await?;
                tracing::error!(%session, error = %e, "session head not upgraded: it failed its checks; reads of it will fail as tampered");
            }
            Err(e) => return Err(e),
        }
    }
    tracing::info!(
        upgraded,
        refused = sessions.len() - upgraded,
        "counted the issued journal rows of the session heads written before schema 4"
    );
    Ok(())
}

/// [`upgrade_heads`] for one session.
async fn upgrade_head<T: SessionTables + ?Sized>(
    tables: &mut T,
    ring: &Keyring,
    session: &SessionId,
) -> Result<(), StoreError> {
    let mut head = tables.head(session).await?;
    head.check_any_format(ring)?;
    tables.check_journal_complete(&head).await?;
    let calls = tables.calls(session).await?;
    count_issued(ring, &mut head, &calls)?;
    tables.store_head(&mut head, ring).await
}
