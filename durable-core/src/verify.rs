//! Offline verification of a whole store, or one session: every seal, chain and count
//! that the store checks on its reads, walked for every session (`durable verify`).
//!
//! Beside [`integrity`](crate::integrity) rather than inside it: it walks a
//! [`CheckpointStore`], and the store trait names the integrity module's
//! [`Keyring`](crate::integrity::Keyring), so the dependency points one way.

use crate::error::StoreError;
use crate::ids::SessionId;
use crate::store::{CheckpointStore, SessionCursor, SessionFilter};

/// What verification found for one session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionCheck {
    /// The session.
    pub session: SessionId,
    /// Checkpoints read (each with its transcript).
    pub checkpoints: usize,
    /// Journal rows read.
    pub journal_rows: usize,
    /// Resolutions read.
    pub resolutions: usize,
    /// Rows of the approval log read (requests and decisions).
    pub approvals: usize,
    /// The first problem found (a broken seal, a gap, a row that does not decode), or
    /// `None` when everything holds.
    pub problem: Option<String>,
}

impl SessionCheck {
    /// Whether every check held.
    pub fn is_ok(&self) -> bool {
        self.problem.is_none()
    }
}

/// Verifies every session of `store` (or only `session`): each checkpoint with its
/// transcript, the whole journal, the resolutions and the approval log, through the store's own checked
/// reads. A broken seal or a row that does not decode is reported per session; a store
/// that cannot be read at all (or a missing key) is an `Err`.
///
/// Collects every session's check; [`verify_each`] hands them over one by one instead,
/// in memory that does not grow with the store.
pub async fn verify_sessions(
    store: &dyn CheckpointStore,
    session: Option<&SessionId>,
) -> Result<Vec<SessionCheck>, StoreError> {
    let mut out = Vec::new();
    verify_each(store, session, |check| out.push(check)).await?;
    Ok(out)
}

/// Sessions read at a time from the listing, and journal rows from a journal.
const PAGE: i64 = 500;

/// Like [`verify_sessions`], handing each session's check to `found` as soon as it is
/// made. The sessions are read a page at a time (keyset pages of
/// [`list_sessions`](crate::store::SessionStore::list_sessions)) and each journal a page at a time
/// ([`calls_page`](crate::store::JournalStore::calls_page)), so memory stays bounded by a page and
/// one checkpoint, whatever the store holds.
pub async fn verify_each(
    store: &dyn CheckpointStore,
    session: Option<&SessionId>,
    mut found: impl FnMut(SessionCheck),
) -> Result<(), StoreError> {
    if let Some(id) = session {
        let id = store.session(id).await?.id;
        found(check_one(store, id).await?);
        return Ok(());
    }
    let mut cursor: Option<SessionCursor> = None;
    loop {
        let mut filter = SessionFilter::default().with_limit(PAGE);
        if let Some(after) = cursor.take() {
            filter = filter.with_after(after);
        }
        let page = store.list_sessions(&filter).await?;
        let full = page.len() == usize::try_from(PAGE).unwrap_or(usize::MAX);
        cursor = page.last().map(SessionCursor::after);
        for record in page {
            found(check_one(store, record.id).await?);
        }
        if !full {
            return Ok(());
        }
    }
}

/// One session's check: a broken seal is its problem, anything else the store's.
async fn check_one(store: &dyn CheckpointStore, id: SessionId) -> Result<SessionCheck, StoreError> {
    let mut check = SessionCheck {
        session: id.clone(),
        checkpoints: 0,
        journal_rows: 0,
        resolutions: 0,
        approvals: 0,
        problem: None,
    };
    match verify_one(store, &id, &mut check).await {
        Ok(()) => {}
        Err(e @ (StoreError::Tampered { .. } | StoreError::Corrupt { .. })) => {
            check.problem = Some(e.to_string());
        }
        Err(e) => return Err(e),
    }
    Ok(check)
}

async fn verify_one(
    store: &dyn CheckpointStore,
    id: &SessionId,
    check: &mut SessionCheck,
) -> Result<(), StoreError> {
    let versions = store.list_checkpoints(id).await?;
    let latest = store.session(id).await?.latest_version;
    for (expected, meta) in (0..).zip(&versions) {
        if meta.version != expected {
            return Err(StoreError::Tampered {
                session: id.clone(),
                what: format!("checkpoint {expected}"),
                detail: "it is missing".to_owned(),
            });
        }
        // Loading checks the seals; the messages are stored text, parsed here so that one
        // that is not JSON is reported too.
        store
            .load_checkpoint(id, Some(meta.version))
            .await?
            .message_values()?;
        check.checkpoints += 1;
    }
    if i64::try_from(versions.len()).ok() != latest.checked_add(1) {
        return Err(StoreError::Tampered {
            session: id.clone(),
            what: "the checkpoints".to_owned(),
            detail: format!(
                "the session's latest version is {latest} but {} checkpoints exist",
                versions.len()
            ),
        });
    }
    // The latest checkpoint through the head, as a resume reads it.
    store.load_checkpoint(id, None).await?;
    // The journal a page at a time: each page checks the head, the journal's count
    // against it and every row's seal; the issued rows against the head's count of them.
    let mut position = 0;
    loop {
        let page = store.calls_page(id, position, PAGE).await?.len();
        check.journal_rows += page;
        position += i64::try_from(page).unwrap_or(i64::MAX);
        if i64::try_from(page).unwrap_or(i64::MAX) < PAGE {
            break;
        }
    }
    store.issued_calls(id).await?;
    check.resolutions = store.resolutions(id).await?.len();
    check.approvals = store.approvals(id).await?.len();
    Ok(())
}
