//! Cases: ids a user chooses (session ids, fork targets, owners, app versions) are
//! validated at the store boundary, identically on every backend.

use durable_core::store::{CheckpointStoreExt, Claim};
use std::collections::BTreeSet;
use std::sync::Arc;

use super::{
    LONG_TTL, MAX_ATTEMPTS, checkpoint, create, expect_err, message, new_session, owner, tool_call,
};
use durable_core::error::IdProblem;
use durable_core::error::StoreError;
use durable_core::ids::{MAX_ID_BYTES, SessionId};
use durable_core::store::{
    CallStatus, CheckpointStore, IssueOutcome, NewError, Resolution, ResolveCall, RetargetSession,
    SessionFilter, SessionStatus,
};

/// The ids of every session in the store.
async fn all_ids(store: &dyn CheckpointStore) -> BTreeSet<SessionId> {
    store
        .list_sessions(&SessionFilter::default())
        .await
        .expect("list_sessions")
        .into_iter()
        .map(|s| s.id)
        .collect()
}

/// Ids every store must refuse, with the problem it must report.
fn bad_ids() -> Vec<(&'static str, String, IdProblem)> {
    vec![
        ("NUL", "before\0after".to_owned(), IdProblem::Nul { at: 6 }),
        (
            "1 MB",
            "x".repeat(1 << 20),
            IdProblem::TooLong { len: 1 << 20 },
        ),
        (
            "one byte too long",
            "y".repeat(MAX_ID_BYTES + 1),
            IdProblem::TooLong {
                len: MAX_ID_BYTES + 1,
            },
        ),
        (
            "ESC",
            "run-\u{1b}]0;pwned\u{7}".to_owned(),
            IdProblem::Control { at: 4, code: 0x1b },
        ),
        ("empty", String::new(), IdProblem::Empty),
        ("blank", "   ".to_owned(), IdProblem::Blank),
    ]
}

/// `create_session` and `fork_session` refuse a session id with NUL, over
/// [`MAX_ID_BYTES`], with a control character, empty or blank, with
/// [`StoreError::InvalidId`], and store nothing; `create_session`, `acquire_lease`,
/// `claim_expired` and `fork_session` refuse such an owner the same way. An id of exactly
/// [`MAX_ID_BYTES`] bytes (multi-byte characters included) is accepted.
pub async fn ids_are_validated_before_the_database(store: Arc<dyn CheckpointStore>) {
    let worker = owner("w");
    let (source, lease) = create(&*store, &worker).await;
    store
        .save_checkpoint(lease.fence(), 0, checkpoint("s1", vec![message(2)]))
        .await
        .expect("save_checkpoint");
    let before = all_ids(&*store).await;

    for (name, id, problem) in bad_ids() {
        let mut new = new_session(&worker, LONG_TTL);
        new.id = SessionId::new(id.clone());
        expect_err!(
            store.create_session(new).await,
            StoreError::InvalidId { what: "session id", problem: found }
                => assert_eq!(found, problem, "create_session with a {name} id"),
            "create_session with a {name} session id"
        );
        expect_err!(
            store
                .fork_session(&source.id, 1, &SessionId::new(id.clone()), &worker, LONG_TTL)
                .await,
            StoreError::InvalidId { what: "session id", problem: found }
                => assert_eq!(found, problem, "fork_session to a {name} id"),
            "fork_session to a {name} session id"
        );

        let new = new_session(&id, LONG_TTL);
        expect_err!(
            store.create_session(new).await,
            StoreError::InvalidId { what: "owner", problem: found }
                => assert_eq!(found, problem, "create_session with a {name} owner"),
            "create_session with a {name} owner"
        );
        expect_err!(
            store
                .fork_session(&source.id, 1, &super::session_id(), &id, LONG_TTL)
                .await,
            StoreError::InvalidId { what: "owner", .. },
            "fork_session with a {name} owner"
        );
        expect_err!(
            store
                .acquire_lease(&source.id, &id, LONG_TTL, MAX_ATTEMPTS)
                .await,
            StoreError::InvalidId { what: "owner", .. },
            "acquire_lease with a {name} owner"
        );
        expect_err!(
            store
                .claim_expired(&Claim::new(&id, LONG_TTL, MAX_ATTEMPTS))
                .await,
            StoreError::InvalidId { what: "owner", .. },
            "claim_expired with a {name} owner"
        );
        let mut new = new_session(&worker, LONG_TTL);
        new.app_version = id.clone();
        expect_err!(
            store.create_session(new).await,
            StoreError::InvalidId {
                what: "app version",
                ..
            },
            "create_session with a {name} app version"
        );
    }
    assert_eq!(
        all_ids(&*store).await,
        before,
        "a refused id must store nothing"
    );
    let holder = store.session(&source.id).await.expect("session");
    assert_eq!(
        (holder.lease_owner.as_deref(), holder.fence),
        (Some(worker.as_str()), lease.fence),
        "a refused owner must not touch the lease"
    );

    // The limit is in bytes: 128 two-byte characters fit, and round-trip.
    let longest = SessionId::new("é".repeat(MAX_ID_BYTES / 2));
    let mut new = new_session(&worker, LONG_TTL);
    new.id = longest.clone();
    let (created, _) = store
        .create_session(new)
        .await
        .expect("create_session with a 256-byte id");
    assert_eq!(created.id, longest, "a 256-byte id round-trips");
    let fork = SessionId::new(format!("{} fork", "f".repeat(MAX_ID_BYTES - 5)));
    let (forked, _) = store
        .fork_session(&source.id, 1, &fork, &worker, LONG_TTL)
        .await
        .expect("fork_session to a 256-byte id");
    assert_eq!(forked.id, fork, "a 256-byte fork id round-trips");
}

/// Free text a store is given (a status reason, a resolution's note and resolver, an
/// error's context and message, a migration's versions, step names and author) holding
/// NUL is refused with [`StoreError::InvalidText`] (or [`StoreError::InvalidId`] for the
/// resolver and author) before the database, identically on every backend (PostgreSQL's
/// `text` cannot hold NUL; SQLite's can), and nothing changes. The same texts without
/// NUL, control characters included, are stored and read back.
pub async fn free_text_with_nul_is_refused_before_the_database(store: Arc<dyn CheckpointStore>) {
    let worker = owner("w");
    let (session, lease) = create(&*store, &worker).await;
    let call = match store
        .issue_call(lease.fence(), tool_call(&session.id, 0, "send", "h", 0))
        .await
        .expect("issue_call")
    {
        IssueOutcome::Inserted(r) => r,
        other => panic!("issue_call must insert: {other:?}"),
    };

    expect_err!(
        store
            .set_status(lease.fence(), SessionStatus::Parked, Some("stuck\0here"))
            .await,
        StoreError::InvalidText {
            what: "status reason",
            at: 5
        },
        "set_status with a NUL reason"
    );
    let unchanged = store.session(&session.id).await.expect("session");
    assert_eq!(
        (unchanged.status, unchanged.fence),
        (SessionStatus::Active, lease.fence),
        "a refused reason must change nothing"
    );

    expect_err!(
        store
            .record_error(NewError {
                session: session.id.clone(),
                step: 0,
                context: "model".into(),
                attempt: 0,
                message: "HTTP 500\0".into(),
            })
            .await,
        StoreError::InvalidText {
            what: "error message",
            at: 8
        },
        "record_error with a NUL message"
    );
    expect_err!(
        store
            .record_error(NewError {
                session: session.id.clone(),
                step: 0,
                context: "\0".into(),
                attempt: 0,
                message: "HTTP 500".into(),
            })
            .await,
        StoreError::InvalidText {
            what: "error context",
            at: 0
        },
        "record_error with a NUL context"
    );
    assert!(
        store.errors(&session.id).await.expect("errors").is_empty(),
        "a refused error must store nothing"
    );

    store.release_lease(&lease).await.expect("release");
    let note = ResolveCall {
        call: call.id.clone(),
        resolution: Resolution::DidNotHappen,
        by: "operator".into(),
        note: Some("checked\0".into()),
    };
    expect_err!(
        store.resolve_call(note).await,
        StoreError::InvalidText {
            what: "resolution note",
            at: 7
        },
        "resolve_call with a NUL note"
    );
    let by = ResolveCall {
        call: call.id.clone(),
        resolution: Resolution::DidNotHappen,
        by: "op\0".into(),
        note: None,
    };
    expect_err!(
        store.resolve_call(by).await,
        StoreError::InvalidId {
            what: "resolver",
            ..
        },
        "resolve_call with a NUL resolver"
    );
    assert!(
        store
            .resolutions(&session.id)
            .await
            .expect("resolutions")
            .is_empty(),
        "a refused resolution must store nothing"
    );
    assert_eq!(
        store.call(&call.id).await.expect("call").status,
        CallStatus::Issued,
        "a refused resolution must leave the call in doubt"
    );

    for (name, migrate) in [
        ("to_version", ("v1", "v2\0", "op", ("a", "b"))),
        ("by", ("v1", "v2", "op\0", ("a", "b"))),
        ("step name", ("v1", "v2", "op", ("a", "b\0"))),
    ] {
        let (from, to, by, (old, new)) = migrate;
        let refused = store
            .retarget_session(RetargetSession {
                session: session.id.clone(),
                from_version: from.into(),
                to_version: to.into(),
                step_map: vec![(old.into(), new.into())],
                by: by.into(),
            })
            .await;
        assert!(
            matches!(
                refused,
                Err(StoreError::InvalidText { .. } | StoreError::InvalidId { .. })
            ),
            "retarget_session with a NUL {name}: {refused:?}"
        );
    }
    assert_eq!(
        store
            .session(&session.id)
            .await
            .expect("session")
            .app_version,
        session.app_version,
        "a refused migration must change nothing"
    );

    // Without NUL, anything goes, escapes included: the text is data, shown escaped.
    store
        .record_error(NewError {
            session: session.id.clone(),
            step: 0,
            context: "model".into(),
            attempt: 0,
            message: "\u{1b}[31mHTTP 500\u{7}".into(),
        })
        .await
        .expect("record_error with control characters");
    assert_eq!(
        store.errors(&session.id).await.expect("errors")[0].message,
        "\u{1b}[31mHTTP 500\u{7}",
        "free text round-trips"
    );
}
