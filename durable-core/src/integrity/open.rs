//! What a writer does with a store's keys when it opens it: [`OpenFacts`] (what it
//! found) and [`KeyAction`] (the plan), decided by [`Keyring::on_open`] for every backend.

use super::{Keyring, MAC_KEY_ENV, PREVIOUS_MAC_KEYS_ENV, unverified_writer};
use crate::error::StoreError;

/// What a writer found when it opened a store: the facts [`Keyring::on_open`] decides on.
/// Each backend gathers them in the transaction that sets the keys up.
///
/// # Why "the seals migration ran in this open" is the witness for adoption
///
/// Sealing rows *as found* (adoption) is only safe for rows written before seals
/// existed. The database itself cannot prove that: an attacker with write access can
/// null every seal, every head and delete both `durable_meta` rows, and the store then
/// looks exactly like one written before seals. What the attacker cannot produce from
/// outside is the opener's own observation that the migration which introduced seals
/// (schema version 2) was applied by this very open, in the same transaction as the
/// key setup: rolling the tracking table back makes the migration run again, which fails
/// on the tables it creates. So adoption needs [`seals_migrated_now`](Self::seals_migrated_now),
/// or a store with no session at all (nothing to seal). Everything else that lacks its
/// `signing_key` row is refused, or recovered by checking every row under a key this
/// process holds ([`KeyAction::Restore`]). An attacker who rebuilds the whole database
/// (schema, tracking table and rows) is outside what seals in the database can detect.
#[derive(Debug, Clone, Copy, Default)]
#[non_exhaustive]
pub struct OpenFacts<'a> {
    /// `durable_meta.signing_key`: the id of the key the store is sealed with.
    pub signing_key: Option<&'a str>,
    /// The migration that introduced seals was applied by this open, in the transaction
    /// that sets the keys up: the store's rows genuinely predate seals.
    pub seals_migrated_now: bool,
    /// Sessions in the store.
    pub sessions: i64,
    /// The key id of a seal found on a session head (`None` when no head carries one).
    pub sealed_with: Option<&'a str>,
}

impl<'a> OpenFacts<'a> {
    /// The facts of a store whose `durable_meta.signing_key` is `signing_key` (the other
    /// facts matter only when it is missing).
    pub fn signed(signing_key: Option<&'a str>) -> Self {
        OpenFacts {
            signing_key,
            ..OpenFacts::default()
        }
    }

    /// Sets [`seals_migrated_now`](Self::seals_migrated_now).
    pub fn migrated_now(mut self, yes: bool) -> Self {
        self.seals_migrated_now = yes;
        self
    }

    /// Sets [`sessions`](Self::sessions) and [`sealed_with`](Self::sealed_with).
    pub fn holding(mut self, sessions: i64, sealed_with: Option<&'a str>) -> Self {
        self.sessions = sessions;
        self.sealed_with = sealed_with;
        self
    }

    /// Whether a missing `durable_meta.store_key` may be created afresh: only when the
    /// store's rows predate seals or there are none. A new store key for a store that
    /// holds sealed sessions would make every seal fail (or, with an application key,
    /// change the digests of secret arguments and so the identities of recorded calls).
    pub fn may_create_store_key(&self) -> bool {
        self.seals_migrated_now || (self.sessions == 0 && self.signing_key.is_none())
    }

    /// The refusal for a store whose own key (`durable_meta.store_key`) is missing while
    /// it holds sealed sessions.
    pub fn store_key_missing(&self) -> StoreError {
        let sealed = self
            .signing_key
            .or(self.sealed_with)
            .unwrap_or("an unknown key");
        StoreError::KeyMissing {
            key: "store".into(),
            detail: format!(
                "the store's own key (the `store_key` row of `durable_meta`) is missing, \
                 while the store holds {} session(s) sealed with `{sealed}`; durable never \
                 makes a new one for a store in use (the rows could no longer be checked, \
                 and calls with secret arguments would change identity and run again). \
                 Restore the `durable_meta` rows from a backup of this store (`durable \
                 backup` copies them), or copy them back from a replica; to look at the \
                 sessions meanwhile, use the CLI's read-only `--unverified` flag",
                self.sessions
            ),
        }
    }
}

/// What opening a store means for a [`Keyring`] (its store key bound). One rule for
/// every backend ([`Keyring::on_open`]).
#[derive(Debug, Clone)]
pub enum KeyAction {
    /// The store is sealed with the ring's signing key: nothing to do.
    Keep,
    /// The store was never sealed (its sealing migration ran in this open) or holds no
    /// session: seal every row as found (audited as `adopt`).
    Adopt,
    /// The store is sealed with another key this ring can check (the store's own key
    /// when an application key is turned on, or a previous application key): check
    /// every row under `from`, re-seal under the signing key (audited as `rekey`).
    Rekey {
        /// The key the store is sealed with now.
        from_id: String,
        /// A ring that checks rows sealed with it.
        from: Keyring,
    },
    /// The `signing_key` row of `durable_meta` is missing, but the rows carry seals of a
    /// key this ring holds (`from_id`, read from a session head and trusted for nothing):
    /// check every row of every session under `from`, re-seal under the signing key and
    /// write the `signing_key` row back (audited as `restore`). A row that fails is
    /// [`StoreError::Tampered`], naming it; nothing is sealed as found.
    Restore {
        /// The key the rows' seals name.
        from_id: String,
        /// A ring that checks rows sealed with it.
        from: Keyring,
    },
}

impl Keyring {
    /// The plan for a writer opening a store, given what it found there; `Err`
    /// ([`StoreError::KeyMissing`], naming the key and the way out) when this ring cannot
    /// take the store over.
    pub fn on_open(&self, facts: &OpenFacts<'_>) -> Result<KeyAction, StoreError> {
        if self.unverified {
            return Err(unverified_writer());
        }
        if let Some(current) = facts.signing_key {
            return self.plan_for(current);
        }
        if facts.seals_migrated_now || facts.sessions == 0 {
            return Ok(KeyAction::Adopt);
        }
        let Some(sealed) = facts.sealed_with else {
            return Err(StoreError::KeyMissing {
                key: "signing_key".into(),
                detail: format!(
                    "the `signing_key` row of `durable_meta` is missing and none of the \
                     store's {} session head(s) carries a seal, while the store's schema \
                     was not upgraded from before seals by this open: its seals were \
                     removed outside durable, and durable never seals rows as found in a \
                     store that had seals. Restore the store from a backup, or inspect it \
                     with the CLI's read-only `--unverified` flag",
                    facts.sessions
                ),
            });
        };
        let restore_advice = |detail: String| {
            format!(
                "the `signing_key` row of `durable_meta` is missing, and the rows' seals \
                 name `{sealed}`: {detail}; with that key configured, a writer checks \
                 every row under it and writes the row back"
            )
        };
        match self.plan_for(sealed) {
            Ok(KeyAction::Keep) => Ok(KeyAction::Restore {
                from_id: sealed.to_owned(),
                from: self.clone(),
            }),
            Ok(KeyAction::Rekey { from_id, from }) => Ok(KeyAction::Restore { from_id, from }),
            Ok(other) => Ok(other),
            Err(StoreError::KeyMissing { key, detail }) => Err(StoreError::KeyMissing {
                key,
                detail: restore_advice(detail),
            }),
            Err(other) => Err(other),
        }
    }

    /// The plan for a store whose `signing_key` row names `current`.
    fn plan_for(&self, current: &str) -> Result<KeyAction, StoreError> {
        let signing = self.signing_id();
        if current == signing {
            return Ok(KeyAction::Keep);
        }
        let missing = |detail: String| StoreError::KeyMissing {
            key: current.to_owned(),
            detail,
        };
        if current.starts_with("app-") && !self.has_app_key() {
            return Err(missing(format!(
                "this process has no application key and cannot sign; set `{MAC_KEY_ENV}` \
                 (or the store options' key ring) to that key. If it is lost, the rows \
                 cannot be authenticated any more: inspect them with the CLI's read-only \
                 `--unverified` flag and restore a backup whose key you hold"
            )));
        }
        let from = match (&self.store, self.only(current)) {
            (Some(store), _) if store.id == current => Keyring {
                app: None,
                previous: Vec::new(),
                store: Some(store.clone()),
                unverified: false,
            },
            (_, Some(only)) => Keyring {
                store: self.store.clone(),
                ..only
            },
            _ if current.starts_with("store-") => {
                return Err(missing(format!(
                    "the store is sealed with its own key `{current}`, but the `store_key` \
                     row of `durable_meta` holds `{}`: the row was changed or replaced. \
                     A previous-key list cannot help (`{PREVIOUS_MAC_KEYS_ENV}` takes \
                     application keys). Put the original `store_key` row back from a \
                     backup of this store (`durable backup` copies it); to look at the \
                     sessions meanwhile, use the CLI's read-only `--unverified` flag",
                    self.store_key_id().unwrap_or("none")
                )));
            }
            _ => {
                return Err(missing(format!(
                    "this process signs with `{signing}`. To rotate from `{current}`, set \
                     `{MAC_KEY_ENV}` to the new key and `{PREVIOUS_MAC_KEYS_ENV}` to the \
                     old one, with the fleet stopped; if `{current}` is lost, the rows \
                     cannot be authenticated any more: inspect them with the CLI's \
                     read-only `--unverified` flag and restore a backup whose key you hold"
                )));
            }
        };
        Ok(KeyAction::Rekey {
            from_id: current.to_owned(),
            from,
        })
    }

    /// For a reader, which re-seals nothing: `Ok` only when the store is sealed with this
    /// ring's signing key (or names no key: its rows are then checked under this ring as
    /// they are read, and fail if they do not hold); otherwise [`StoreError::KeyMissing`],
    /// so a wrong key is one clear line, never a `Tampered` on every read.
    pub fn readable(&self, current: Option<&str>) -> Result<(), StoreError> {
        if self.unverified {
            return Ok(());
        }
        let Some(current) = current else {
            return Ok(());
        };
        match self.plan_for(current)? {
            KeyAction::Keep | KeyAction::Adopt | KeyAction::Restore { .. } => Ok(()),
            KeyAction::Rekey { from_id, .. } => Err(StoreError::KeyMissing {
                detail: format!(
                    "this process has key `{}`, and a read-only open re-seals nothing; open the store once with a writer (the fleet stopped) to move it to that key, or read it with `{from_id}`",
                    self.signing_id()
                ),
                key: from_id,
            }),
        }
    }
}
