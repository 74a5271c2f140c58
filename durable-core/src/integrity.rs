//! Tamper evidence: seals (HMAC-SHA256) over every row that decides what happens on replay.
//!
//! The journal decides what runs again, so a row changed behind the framework's back
//! could make an effect run twice (a completed call set back to `not_happened`, or
//! deleted) or make the agent act on a forged result. Every backend therefore seals, in
//! the same transaction as the write:
//!
//! - each **journal row** over its identity, class, status, arguments, key, schema
//!   fingerprint, outcome, spend, attempt and its position `seq` in the session;
//! - each **message** over its session, position and content, chained to the previous
//!   message's seal;
//! - each **checkpoint** over its version, transcript end (the last message's seal),
//!   plan, budget, state and app version, chained to the previous checkpoint's seal;
//! - each **resolution** audit row over its decision and result, with its position
//!   (the session head counts them, so a deleted one is detected);
//! - the **session head**: how many journal rows, messages, checkpoints and resolutions
//!   the session has, so that deleting the newest row of any of them shows, and how many
//!   of its journal rows are `issued` (in doubt after a crash), so that a resume can read
//!   only those rows: a row whose status was changed to or from `issued` behind the
//!   store's back changes that count (or is returned, and fails its own seal).
//!
//! Not sealed: the session row's status, lease, fencing token and app version (they
//! change on every renewal; editing them can stop, restart or re-version a session, never
//! replay a forged outcome), the retry history and the app-version audit rows.
//!
//! A reader checks the seal of every row it returns and the head of the session it reads,
//! and fails with [`StoreError::Tampered`] naming the session and the row.
//!
//! # Keys
//!
//! - **Without an application key** the store seals with a random key it created for
//!   itself and keeps in its own database (`durable_meta`). This catches corruption and
//!   naive edits (a changed status, a re-pointed hash, a deleted row), but not a forger
//!   who can read that key from the database: anyone with write access to the database
//!   usually has read access too.
//! - **With an application key** ([`Keyring::with_app_key`], or `DURABLE_MAC_KEY` through
//!   [`Keyring::from_env`]) the store seals with it, and a forger without the key is
//!   caught. The key never reaches the database; rows carry its id ([`key_id`]).
//!
//! A store records which key signs it. A writer that cannot sign with that key is
//! refused when it opens the store ([`StoreError::KeyMissing`]), so it cannot write rows
//! that would wedge a session. Turning an application key on for a store sealed with its
//! own key, or rotating to a new application key (the old one passed as a
//! [`previous`](Keyring::previous_app_key) key), re-seals every row under the new key once,
//! in one transaction, after checking every row under the old one, and writes an audit
//! row (`durable_integrity_log`). Keys can only be dropped this way, never silently.
//!
//! A missing key row never reads as "no seals yet" ([`Keyring::on_open`], [`OpenFacts`]):
//! rows are sealed as found only in the transaction whose migration introduced seals; a
//! missing `signing_key` row is written back only after every row checks under the key
//! the seals name ([`KeyAction::Restore`]); a missing or changed `store_key` row is
//! refused. The integrity log is sealed as a whole ([`IntegrityLog`]). A read-only open
//! of a store whose key is lost can skip every check ([`Keyring::dangerous_unverified`]),
//! and says so.
//!
//! The keyed digests of secret arguments ([`Keyring::digest`]) use the store's own key,
//! which never rotates, so call identities stay stable across application-key rotation.

use std::fmt;

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

use crate::error::StoreError;
use crate::ids::SessionId;

mod log;
mod open;
pub mod rows;
pub mod setup;
pub mod walk;

pub use log::{INTEGRITY_LOG_SEAL, IntegrityEvent, IntegrityLog, integrity_log_fields};
pub use open::{KeyAction, OpenFacts};

type HmacSha256 = Hmac<Sha256>;

/// The environment variable holding the application key (see [`Keyring::from_env`]).
pub const MAC_KEY_ENV: &str = "DURABLE_MAC_KEY";

/// The environment variable holding previous application keys, comma separated, kept for
/// verification during a rotation.
pub const PREVIOUS_MAC_KEYS_ENV: &str = "DURABLE_PREVIOUS_MAC_KEYS";

/// Shortest application key accepted (bytes): 16 bytes, 128 bits.
pub const MIN_KEY_LEN: usize = 16;

/// A secret key with its public id.
#[derive(Clone)]
struct Key {
    id: String,
    secret: Vec<u8>,
}

impl Key {
    fn new(prefix: &str, secret: Vec<u8>) -> Self {
        Key {
            id: key_id_with(prefix, &secret),
            secret,
        }
    }

    fn mac(&self) -> HmacSha256 {
        // HMAC accepts keys of any length; `new_from_slice` cannot fail for it.
        <HmacSha256 as KeyInit>::new_from_slice(&self.secret)
            .unwrap_or_else(|_| unreachable!("HMAC takes keys of any length"))
    }
}

/// The public id of an application key: `app-` and 8 hex digits of an HMAC of a fixed
/// label under the key. It names the key in rows and errors without revealing it.
pub fn key_id(secret: &[u8]) -> String {
    key_id_with("app", secret)
}

fn key_id_with(prefix: &str, secret: &[u8]) -> String {
    let mut mac = <HmacSha256 as KeyInit>::new_from_slice(secret)
        .unwrap_or_else(|_| unreachable!("HMAC takes keys of any length"));
    mac.update(b"durable key id v1");
    let tag = mac.finalize().into_bytes();
    format!("{prefix}-{}", hex(&tag[..4]))
}

/// The keys a store seals and checks with.
///
/// Built by the application ([`Keyring::none`], [`Keyring::with_app_key`],
/// [`Keyring::from_env`]) and handed to the store's open options; the store completes it
/// with its own random key when it opens ([`Keyring::bind_store_key`]).
#[derive(Clone, Default)]
pub struct Keyring {
    app: Option<Key>,
    previous: Vec<Key>,
    store: Option<Key>,
    /// Checks nothing and signs nothing ([`Keyring::dangerous_unverified`]).
    unverified: bool,
}

impl fmt::Debug for Keyring {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Keyring")
            .field("app", &self.app.as_ref().map(|k| &k.id))
            .field(
                "previous",
                &self.previous.iter().map(|k| &k.id).collect::<Vec<_>>(),
            )
            .field("store", &self.store.as_ref().map(|k| &k.id))
            .field("unverified", &self.unverified)
            .finish()
    }
}

/// An application key that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    /// Shorter than [`MIN_KEY_LEN`].
    #[error(
        "the application key is {len} bytes; use at least {MIN_KEY_LEN} random bytes (e.g. `openssl rand -hex 32`)"
    )]
    TooShort {
        /// Its length.
        len: usize,
    },
}

impl Keyring {
    /// No application key: the store seals with its own random key.
    pub fn none() -> Self {
        Keyring::default()
    }

    /// Seals with `key` (at least [`MIN_KEY_LEN`] bytes).
    pub fn with_app_key(key: impl Into<Vec<u8>>) -> Result<Self, KeyError> {
        Keyring::none().app_key(key)
    }

    /// Sets the signing application key.
    pub fn app_key(mut self, key: impl Into<Vec<u8>>) -> Result<Self, KeyError> {
        let key = checked(key.into())?;
        self.app = Some(Key::new("app", key));
        Ok(self)
    }

    /// Adds a previous application key, accepted for checking rows (never for signing):
    /// the store re-seals rows signed with it under the current key when it opens.
    pub fn previous_app_key(mut self, key: impl Into<Vec<u8>>) -> Result<Self, KeyError> {
        let key = checked(key.into())?;
        self.previous.push(Key::new("app", key));
        Ok(self)
    }

    /// The application key from `DURABLE_MAC_KEY` (and previous keys from
    /// `DURABLE_PREVIOUS_MAC_KEYS`, comma separated), or [`Keyring::none`] when unset.
    pub fn from_env() -> Result<Self, KeyError> {
        let mut ring = Keyring::none();
        if let Some(key) = std::env::var_os(MAC_KEY_ENV).filter(|k| !k.is_empty()) {
            ring = ring.app_key(key.into_encoded_bytes())?;
        }
        if let Ok(previous) = std::env::var(PREVIOUS_MAC_KEYS_ENV) {
            for key in previous.split(',').filter(|k| !k.is_empty()) {
                ring = ring.previous_app_key(key.as_bytes().to_vec())?;
            }
        }
        Ok(ring)
    }

    /// A ring that accepts every row without checking its seal, and cannot sign: for a
    /// **read-only** open of a store whose key is lost, to inspect what it holds. Nothing
    /// read through it is authenticated (a forged row reads like a real one), so a tool
    /// that shows it must say so. A writer refuses it ([`StoreError::KeyMissing`]).
    pub fn dangerous_unverified(mut self) -> Self {
        self.unverified = true;
        self
    }

    /// Whether this ring checks nothing ([`dangerous_unverified`](Self::dangerous_unverified)).
    pub fn is_unverified(&self) -> bool {
        self.unverified
    }

    /// Whether an application key signs.
    pub fn has_app_key(&self) -> bool {
        self.app.is_some()
    }

    /// The id of the key new seals are made with (`app-…` or `store-…`).
    ///
    /// # Panics
    /// Never once the store bound its key; before that, the id is `unbound`.
    pub fn signing_id(&self) -> &str {
        match (&self.app, &self.store) {
            (Some(app), _) => &app.id,
            (None, Some(store)) => &store.id,
            (None, None) => "unbound",
        }
    }

    /// The ids of every key this ring can check with.
    pub fn known_ids(&self) -> Vec<String> {
        self.app
            .iter()
            .chain(&self.previous)
            .chain(&self.store)
            .map(|k| k.id.clone())
            .collect()
    }

    /// Completes the ring with the store's own random key (read from, or created in, the
    /// store's `durable_meta` table by the backend).
    pub fn bind_store_key(mut self, secret: Vec<u8>) -> Self {
        self.store = Some(Key::new("store", secret));
        self
    }

    /// A ring holding only the application key `id` (current or previous), if this ring
    /// has it: what checks rows sealed with that key during a rotation.
    pub fn only(&self, id: &str) -> Option<Keyring> {
        let key = self.app.iter().chain(&self.previous).find(|k| k.id == id)?;
        Some(Keyring {
            app: Some(key.clone()),
            previous: Vec::new(),
            store: None,
            unverified: false,
        })
    }

    /// The id of the store's own key, once bound.
    pub fn store_key_id(&self) -> Option<&str> {
        self.store.as_ref().map(|k| k.id.as_str())
    }

    fn signing(&self) -> Result<&Key, StoreError> {
        if self.unverified {
            return Err(unverified_writer());
        }
        self.app
            .as_ref()
            .or(self.store.as_ref())
            .ok_or_else(|| StoreError::KeyMissing {
                key: "store".into(),
                detail: "the store's own key was never loaded (a bug in the backend)".into(),
            })
    }

    fn find(&self, id: &str) -> Option<&Key> {
        let app_keyed = self.app.is_some();
        self.app
            .iter()
            .chain(&self.previous)
            // Once an application key is configured, a row sealed with the store's own
            // key (readable from the database) proves nothing: only app keys count.
            .chain(self.store.iter().filter(|_| !app_keyed))
            .find(|k| k.id == id)
    }

    /// Seals `fields` under the signing key: `"<key id>:<hex tag>"`.
    pub fn seal(&self, fields: &Fields) -> Result<String, StoreError> {
        let key = self.signing()?;
        let mut mac = key.mac();
        mac.update(&fields.buf);
        Ok(format!("{}:{}", key.id, hex(&mac.finalize().into_bytes())))
    }

    /// Checks a seal over `fields`; `Err` says why it does not hold.
    pub fn check(&self, fields: &Fields, seal: Option<&str>) -> Result<(), Broken> {
        if self.unverified {
            return Ok(());
        }
        let seal = seal.ok_or(Broken::Missing)?;
        let (id, tag) = seal.split_once(':').ok_or(Broken::Malformed)?;
        let key = self
            .find(id)
            .ok_or_else(|| Broken::UnknownKey(id.to_owned()))?;
        let tag = unhex(tag).ok_or(Broken::Malformed)?;
        let mut mac = key.mac();
        mac.update(&fields.buf);
        mac.verify_slice(&tag).map_err(|_| Broken::Mismatch)
    }

    /// Checks a seal, mapping a broken one to [`StoreError::Tampered`] naming `what`.
    pub fn verify(
        &self,
        session: &SessionId,
        what: impl FnOnce() -> String,
        fields: &Fields,
        seal: Option<&str>,
    ) -> Result<(), StoreError> {
        self.check(fields, seal).map_err(|broken| match broken {
            Broken::UnknownKey(id) if id.starts_with("app-") && !self.has_app_key() => {
                StoreError::KeyMissing {
                    detail: format!(
                        "{} of session `{session}` is sealed with it; set `{MAC_KEY_ENV}` \
                         (or the store options' key ring) to that key",
                        what()
                    ),
                    key: id,
                }
            }
            broken => StoreError::Tampered {
                session: session.clone(),
                what: what(),
                detail: broken.to_string(),
            },
        })
    }

    /// A keyed digest (HMAC under the store's own key) of `bytes` in `domain`, as
    /// `"k1:<hex>"`. Used for secret arguments, so that a dictionary over the stored
    /// digests is useless without the store.
    pub fn digest(&self, domain: &str, bytes: &[u8]) -> Result<String, StoreError> {
        let key =
            self.store
                .as_ref()
                .or(self.app.as_ref())
                .ok_or_else(|| StoreError::KeyMissing {
                    key: "store".into(),
                    detail: "the store's own key was never loaded (a bug in the backend)".into(),
                })?;
        let mut mac = key.mac();
        mac.update(b"durable digest v1\0");
        mac.update(domain.as_bytes());
        mac.update(b"\0");
        mac.update(bytes);
        Ok(format!("k1:{}", hex(&mac.finalize().into_bytes())))
    }
}

impl Keyring {
    /// Decodes the store's own key as kept in `durable_meta` (hex).
    pub fn store_key_from_hex(hex: &str) -> Result<Vec<u8>, StoreError> {
        unhex(hex).ok_or_else(|| StoreError::KeyMissing {
            key: "store".into(),
            detail: "the store's own key in `durable_meta` is not hex; the table was edited".into(),
        })
    }
}

fn unverified_writer() -> StoreError {
    StoreError::KeyMissing {
        key: "unverified".into(),
        detail: "an unverified key ring (`dangerous_unverified`) only reads, and only in a \
                 read-only open; configure the store's key to write"
            .into(),
    }
}

fn checked(key: Vec<u8>) -> Result<Vec<u8>, KeyError> {
    if key.len() < MIN_KEY_LEN {
        return Err(KeyError::TooShort { len: key.len() });
    }
    Ok(key)
}

/// Why a seal does not hold.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Broken {
    /// The row has no seal.
    #[error("it has no seal")]
    Missing,
    /// The seal is not `<key id>:<hex>`.
    #[error("its seal is malformed")]
    Malformed,
    /// Sealed with a key this ring does not hold.
    #[error("it is sealed with key `{0}`, which this store does not accept")]
    UnknownKey(String),
    /// The seal does not match the row's content.
    #[error("its content does not match its seal")]
    Mismatch,
}

/// The bytes a seal covers: a domain label, then length-prefixed fields, so that no two
/// different rows encode alike.
#[derive(Debug, Clone)]
pub struct Fields {
    buf: Vec<u8>,
}

impl Fields {
    /// Starts the fields of a row of `kind` (`"call"`, `"message"`, …).
    pub fn new(kind: &str) -> Self {
        let mut fields = Fields {
            buf: Vec::with_capacity(256),
        };
        fields.buf.extend_from_slice(b"durable seal v1\0");
        fields.str(kind)
    }

    /// Adds a string.
    pub fn str(mut self, value: &str) -> Self {
        self.bytes(value.as_bytes());
        self
    }

    /// Adds an optional string (`None` differs from every string).
    pub fn opt(mut self, value: Option<&str>) -> Self {
        match value {
            None => self.buf.push(0),
            Some(v) => {
                self.buf.push(1);
                self.bytes(v.as_bytes());
            }
        }
        self
    }

    /// Adds an integer.
    pub fn int(mut self, value: i64) -> Self {
        self.buf.push(b'i');
        self.buf.extend_from_slice(&value.to_be_bytes());
        self
    }

    fn bytes(&mut self, bytes: &[u8]) {
        self.buf.push(b's');
        self.buf
            .extend_from_slice(&(bytes.len() as u64).to_be_bytes());
        self.buf.extend_from_slice(bytes);
    }
}

/// What a journal row's seal covers, as stored (JSON columns as their stored text).
#[derive(Debug, Clone, Copy)]
pub struct CallFields<'a> {
    /// Row id.
    pub id: &'a str,
    /// Session id.
    pub session: &'a str,
    /// `tool` or `model`.
    pub kind: &'a str,
    /// Step.
    pub step: i64,
    /// Tool name.
    pub tool: &'a str,
    /// Input hash.
    pub input_hash: &'a str,
    /// Ordinal.
    pub ordinal: i64,
    /// Replay class.
    pub class: &'a str,
    /// Status.
    pub status: &'a str,
    /// Arguments (stored text).
    pub args: &'a str,
    /// Idempotency key.
    pub key: Option<&'a str>,
    /// Schema fingerprint.
    pub schema_hash: &'a str,
    /// Result (stored text).
    pub result: Option<&'a str>,
    /// Error (stored text).
    pub error: Option<&'a str>,
    /// Spend (stored text).
    pub spend: Option<&'a str>,
    /// Attempt.
    pub attempt: i64,
    /// Position in the session's journal (1, 2, …).
    pub seq: i64,
    /// The call's approval (stored JSON text of [`Approval`](crate::store::Approval)),
    /// for a call that needed one. Sealed after the other fields only when present, so
    /// that rows without one keep the seals they were written with.
    pub approval: Option<&'a str>,
}

impl CallFields<'_> {
    /// The sealed bytes.
    pub fn fields(&self) -> Fields {
        let fields = Fields::new("call")
            .str(self.id)
            .str(self.session)
            .str(self.kind)
            .int(self.step)
            .str(self.tool)
            .str(self.input_hash)
            .int(self.ordinal)
            .str(self.class)
            .str(self.status)
            .str(self.args)
            .opt(self.key)
            .str(self.schema_hash)
            .opt(self.result)
            .opt(self.error)
            .opt(self.spend)
            .int(self.attempt)
            .int(self.seq);
        match self.approval {
            Some(approval) => fields.str("approval").str(approval),
            None => fields,
        }
    }
}

/// The sealed bytes of message `seq` of a session, chained to the previous message's
/// seal (`""` for the first).
pub fn message_fields(session: &str, seq: i64, message: &str, previous: &str) -> Fields {
    Fields::new("message")
        .str(session)
        .int(seq)
        .str(message)
        .str(previous)
}

/// What a checkpoint's seal covers, as stored.
#[derive(Debug, Clone, Copy)]
pub struct CheckpointFields<'a> {
    /// Session id.
    pub session: &'a str,
    /// Version.
    pub version: i64,
    /// The transcript's last message position.
    pub last_seq: i64,
    /// Messages in the transcript.
    pub message_count: i64,
    /// The seal of the transcript's last message (`""` when empty).
    pub last_message_seal: &'a str,
    /// Plan (stored text, after reference resolution).
    pub plan: &'a str,
    /// Budget (stored text, after reference resolution).
    pub budget: &'a str,
    /// State (stored text, after reference resolution).
    pub state: &'a str,
    /// App version.
    pub app_version: &'a str,
    /// The previous version's seal (`""` for version 0).
    pub previous: &'a str,
}

impl CheckpointFields<'_> {
    /// The sealed bytes.
    pub fn fields(&self) -> Fields {
        Fields::new("checkpoint")
            .str(self.session)
            .int(self.version)
            .int(self.last_seq)
            .int(self.message_count)
            .str(self.last_message_seal)
            .str(self.plan)
            .str(self.budget)
            .str(self.state)
            .str(self.app_version)
            .str(self.previous)
    }
}

/// What a resolution audit row's seal covers.
#[derive(Debug, Clone, Copy)]
pub struct ResolutionFields<'a> {
    /// The resolved call.
    pub call: &'a str,
    /// Session id.
    pub session: &'a str,
    /// Position among the session's resolutions (1, 2, …).
    pub position: i64,
    /// `happened` or `did_not_happen`.
    pub decision: &'a str,
    /// Result (stored text).
    pub result: Option<&'a str>,
    /// Who resolved.
    pub by: &'a str,
    /// Note.
    pub note: Option<&'a str>,
}

impl ResolutionFields<'_> {
    /// The sealed bytes.
    pub fn fields(&self) -> Fields {
        Fields::new("resolution")
            .str(self.call)
            .str(self.session)
            .int(self.position)
            .str(self.decision)
            .opt(self.result)
            .str(self.by)
            .opt(self.note)
    }
}

/// What an approval audit row's seal covers (see
/// [`ApprovalRecord`](crate::store::ApprovalRecord)).
#[derive(Debug, Clone, Copy)]
pub struct ApprovalFields<'a> {
    /// The call.
    pub call: &'a str,
    /// Session id.
    pub session: &'a str,
    /// Position in the session's approval log (1, 2, …).
    pub position: i64,
    /// `requested`, `approved`, `denied` or `expired`.
    pub event: &'a str,
    /// Who asked or decided.
    pub actor: &'a str,
    /// Reasoning, reason or note.
    pub note: Option<&'a str>,
    /// Arguments before an edit (stored text).
    pub args_before: Option<&'a str>,
    /// Arguments approved by an edit (stored text).
    pub args_after: Option<&'a str>,
}

impl ApprovalFields<'_> {
    /// The sealed bytes.
    pub fn fields(&self) -> Fields {
        Fields::new("approval")
            .str(self.call)
            .str(self.session)
            .int(self.position)
            .str(self.event)
            .str(self.actor)
            .opt(self.note)
            .opt(self.args_before)
            .opt(self.args_after)
    }
}

/// The session head: how much of each log the session has. Deleting the newest row of
/// any log (which leaves no gap) changes a count and breaks this seal.
///
/// `issued_rows` counts the journal rows whose status is `issued`. A reader of the issued
/// rows alone (a resume, [`issued_calls`](crate::store::JournalStore::issued_calls)) checks
/// that it found exactly that many, each under its own seal: a row set to `issued`
/// behind the store's back is returned and fails its seal, and a row set from `issued`
/// to anything else (or deleted) leaves one fewer than the head says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Head<'a> {
    /// Session id.
    pub session: &'a str,
    /// Journal rows (the highest `seq`).
    pub journal_rows: i64,
    /// Latest checkpoint version.
    pub latest_version: i64,
    /// The latest checkpoint's seal.
    pub checkpoint_seal: &'a str,
    /// Resolutions recorded.
    pub resolutions: i64,
    /// Journal rows whose status is `issued`.
    pub issued_rows: i64,
    /// Rows of the session's approval log (requests and decisions). Sealed after the
    /// other fields only when not 0, so that heads of sessions without approvals keep
    /// the seals they were written with.
    pub approvals: i64,
}

impl Head<'_> {
    /// The sealed bytes.
    pub fn fields(&self) -> Fields {
        let fields = self.legacy_fields().int(self.issued_rows);
        match self.approvals {
            0 => fields,
            n => fields.str("approvals").int(n),
        }
    }

    /// The sealed bytes of a head written before it counted its issued rows (store
    /// schema 3 and earlier): `issued_rows` is left out. A store checks an old head this
    /// way once, when it upgrades the head to [`fields`](Self::fields).
    pub fn legacy_fields(&self) -> Fields {
        Fields::new("head")
            .str(self.session)
            .int(self.journal_rows)
            .int(self.latest_version)
            .str(self.checkpoint_seal)
            .int(self.resolutions)
    }
}

/// The session head's count of issued rows, as a backend stores it: `None` on a head
/// written before the count existed (store schema 3 and earlier), which a writer counts
/// once when it upgrades the database. Shared by both backends' head rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IssuedCount(pub Option<i64>);

impl IssuedCount {
    /// The head's sealed bytes: [`Head::fields`] with the count, [`Head::legacy_fields`]
    /// without (`head.issued_rows` is ignored).
    pub fn fields(self, head: Head<'_>) -> Fields {
        match self.0 {
            Some(issued_rows) => Head {
                issued_rows,
                ..head
            }
            .fields(),
            None => head.legacy_fields(),
        }
    }

    /// The count after a row was issued (`+1`) or left `issued` (`−1`); a head without
    /// its count cannot be written ([`uncounted`](Self::uncounted)).
    pub fn add(self, session: &SessionId, delta: i64) -> Result<Self, StoreError> {
        match self.0 {
            Some(count) => Ok(IssuedCount(Some(count + delta))),
            None => Err(Self::uncounted(session)),
        }
    }

    /// Checks that a read of the session's issued rows found as many as the head counts:
    /// a row set to or from `issued` behind the store's back, or a deleted issued row,
    /// leaves a different number (a row set to `issued` also fails its own seal).
    pub fn check(self, session: &SessionId, found: usize) -> Result<(), StoreError> {
        let found = i64::try_from(found).unwrap_or(i64::MAX);
        match self.0 {
            Some(count) if count == found => Ok(()),
            Some(count) => Err(StoreError::Tampered {
                session: session.clone(),
                what: "the journal's issued rows".to_owned(),
                detail: format!(
                    "the session head counts {count} issued rows, the journal holds \
                     {found}: a row's status was changed, or an issued row deleted"
                ),
            }),
            None => Err(Self::uncounted(session)),
        }
    }

    /// A head still without its count: when a writer upgraded the database, the session
    /// failed its checks, so it was left as found and is refused on every read and write.
    pub fn uncounted(session: &SessionId) -> StoreError {
        StoreError::Tampered {
            session: session.clone(),
            what: "the session head".to_owned(),
            detail: "it does not count its issued rows: when the store upgraded this \
                     database (schema 4) the session failed its checks (its head, its \
                     journal's completeness or a row's seal), so it was left as found; \
                     inspect it with `durable verify`"
                .to_owned(),
        }
    }
}

/// Fresh random bytes for a store's own key (32, from the operating system).
pub fn random_key() -> Result<Vec<u8>, StoreError> {
    let mut key = vec![0u8; 32];
    getrandom::fill(&mut key).map_err(|e| StoreError::KeyMissing {
        key: "store".into(),
        detail: format!("the operating system gave no random bytes for a new store key: {e}"),
    })?;
    Ok(key)
}

/// Lower-case hex.
pub fn hex(bytes: &[u8]) -> String {
    use fmt::Write;
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(out, "{b:02x}");
    }
    out
}

/// Parses lower- or upper-case hex.
pub fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ring() -> Keyring {
        Keyring::none().bind_store_key(vec![7; 32])
    }

    #[test]
    fn a_seal_holds_only_for_the_same_fields_and_key() {
        let r = ring();
        let f = Fields::new("call").str("a").int(1);
        let seal = r.seal(&f).expect("test");
        assert!(seal.starts_with("store-"));
        r.check(&f, Some(&seal)).expect("test");
        assert_eq!(
            r.check(&Fields::new("call").str("a").int(2), Some(&seal)),
            Err(Broken::Mismatch)
        );
        assert_eq!(r.check(&f, None), Err(Broken::Missing));
        assert_eq!(r.check(&f, Some("nonsense")), Err(Broken::Malformed));
        let other = Keyring::none().bind_store_key(vec![8; 32]);
        assert!(matches!(
            other.check(&f, Some(&seal)),
            Err(Broken::UnknownKey(_))
        ));
    }

    #[test]
    fn fields_are_unambiguous() {
        let a = Fields::new("x").str("ab").str("c");
        let b = Fields::new("x").str("a").str("bc");
        assert_ne!(a.buf, b.buf);
        assert_ne!(
            Fields::new("x").opt(None).buf,
            Fields::new("x").opt(Some("")).buf
        );
    }

    #[test]
    fn an_app_key_refuses_store_key_seals() {
        let store_only = ring();
        let f = Fields::new("call").str("a");
        let seal = store_only.seal(&f).expect("test");
        let app = ring().app_key(vec![1; 32]).expect("test");
        assert!(matches!(
            app.check(&f, Some(&seal)),
            Err(Broken::UnknownKey(_))
        ));
        let app_seal = app.seal(&f).expect("test");
        assert!(app_seal.starts_with("app-"));
        app.check(&f, Some(&app_seal)).expect("test");
        // Rotation: the new ring checks the old key's seals.
        let rotated = ring()
            .app_key(vec![2; 32])
            .expect("test")
            .previous_app_key(vec![1; 32])
            .expect("test");
        rotated.check(&f, Some(&app_seal)).expect("test");
        assert_ne!(rotated.signing_id(), app.signing_id());
    }

    #[test]
    fn short_app_keys_are_refused() {
        assert_eq!(
            Keyring::with_app_key(b"short".to_vec()).expect_err("test"),
            KeyError::TooShort { len: 5 }
        );
    }

    #[test]
    fn digests_use_the_store_key_and_ignore_the_app_key() {
        let a = ring().digest("secret", b"hunter2").expect("test");
        let b = ring()
            .app_key(vec![3; 32])
            .expect("test")
            .digest("secret", b"hunter2")
            .expect("test");
        assert_eq!(a, b);
        let other = Keyring::none()
            .bind_store_key(vec![9; 32])
            .digest("secret", b"hunter2")
            .expect("test");
        assert_ne!(a, other);
    }

    #[test]
    fn one_plan_for_every_opener() {
        let store = ring();
        let signed = |id| OpenFacts::signed(Some(id));
        // A new store, or one whose sealing migration ran in this open: adopted.
        assert!(matches!(
            store.on_open(&OpenFacts::signed(None)),
            Ok(KeyAction::Adopt)
        ));
        assert!(matches!(
            store.on_open(&OpenFacts::signed(None).migrated_now(true).holding(3, None)),
            Ok(KeyAction::Adopt)
        ));
        assert!(matches!(
            store.on_open(&signed(store.signing_id())),
            Ok(KeyAction::Keep)
        ));
        let app1 = ring().app_key(vec![1; 32]).expect("key");
        // Turning the key on: the store key's seals are checked, then re-sealed.
        assert!(matches!(
            app1.on_open(&signed(store.signing_id())),
            Ok(KeyAction::Rekey { .. })
        ));
        // Without the app key, a sealed store is refused, naming the key.
        let err = store
            .on_open(&signed(app1.signing_id()))
            .expect_err("no key");
        assert!(matches!(&err, StoreError::KeyMissing { key, .. } if key == app1.signing_id()));
        // Another app key without the old one as previous: refused; with it: rotation.
        let app2 = ring().app_key(vec![2; 32]).expect("key");
        assert!(app2.on_open(&signed(app1.signing_id())).is_err());
        let rotating = app2.clone().previous_app_key(vec![1; 32]).expect("key");
        let Ok(KeyAction::Rekey { from, .. }) = rotating.on_open(&signed(app1.signing_id())) else {
            panic!("rotation is a rekey");
        };
        let f = Fields::new("x").str("y");
        from.check(&f, Some(&app1.seal(&f).expect("seal")))
            .expect("the old key checks");
        // A reader re-seals nothing: only its own key is readable.
        assert!(app2.readable(Some(app2.signing_id())).is_ok());
        assert!(rotating.readable(Some(app1.signing_id())).is_err());
        assert!(app1.readable(Some(store.signing_id())).is_err());
    }

    #[test]
    fn a_store_with_sessions_and_no_signing_key_is_never_adopted() {
        let app1 = ring().app_key(vec![1; 32]).expect("key");
        // Seals removed everywhere: refused, naming the missing row.
        let err = app1
            .on_open(&OpenFacts::signed(None).holding(2, None))
            .expect_err("never sealed as found");
        assert!(matches!(&err, StoreError::KeyMissing { key, .. } if key == "signing_key"));
        // The rows name a key this process holds: every row is checked, then restored.
        assert!(matches!(
            app1.on_open(&OpenFacts::signed(None).holding(2, Some(app1.signing_id()))),
            Ok(KeyAction::Restore { .. })
        ));
        // ... or one it does not: refused, naming it.
        let store = ring();
        let err = store
            .on_open(&OpenFacts::signed(None).holding(2, Some(app1.signing_id())))
            .expect_err("no key");
        assert!(matches!(&err, StoreError::KeyMissing { key, .. } if key == app1.signing_id()));
        assert!(err.to_string().contains("signing_key"), "{err}");
        // A missing store key is created only when nothing is sealed yet.
        assert!(OpenFacts::signed(None).may_create_store_key());
        assert!(
            !OpenFacts::signed(None)
                .holding(1, None)
                .may_create_store_key()
        );
        assert!(!OpenFacts::signed(Some("app-1")).may_create_store_key());
    }

    #[test]
    fn a_changed_store_key_gives_advice_that_works() {
        let old = ring();
        let new = Keyring::none().bind_store_key(vec![8; 32]);
        let err = new
            .on_open(&OpenFacts::signed(Some(old.signing_id())))
            .expect_err("another store key");
        let text = err.to_string();
        assert!(text.contains("`store_key` row"), "{text}");
        assert!(!text.contains("as a previous key"), "{text}");
    }

    #[test]
    fn the_integrity_log_seal_shows_an_edit_or_a_deletion() {
        let r = ring();
        let events: Vec<_> = (1..=2)
            .map(|i| IntegrityEvent::new(i, "rekey".into(), None, "k".into(), 3, "d".into(), 5))
            .collect();
        let seal = r.seal(&integrity_log_fields(&events)).expect("seal");
        assert!(IntegrityLog::check(&r, events.clone(), Some(&seal)).is_ok());
        let mut edited = events.clone();
        edited[0].rows = 4;
        assert!(!IntegrityLog::check(&r, edited, Some(&seal)).is_ok());
        assert!(!IntegrityLog::check(&r, events[..1].to_vec(), Some(&seal)).is_ok());
        assert!(!IntegrityLog::check(&r, events, None).is_ok());
        assert!(IntegrityLog::check(&r, Vec::new(), None).is_ok());
    }

    #[test]
    fn debug_shows_key_ids_only() {
        let r = ring()
            .app_key(b"0123456789abcdef-secret".to_vec())
            .expect("test");
        let shown = format!("{r:?}");
        assert!(!shown.contains("secret"), "{shown}");
        assert!(shown.contains("app-"), "{shown}");
    }
}
