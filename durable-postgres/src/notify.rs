//! Waking idle worker pools on other connections, processes and machines: `NOTIFY` in
//! the writes that can make a session claimable, and one `LISTEN` connection per store
//! that passes each notification on to the store's [`WorkNotifier`].
//!
//! # The writes
//! Each write that can make a session claimable sends `pg_notify('durable_work', '')`
//! inside its own transaction (folded into a statement it sends anyway, so no write
//! takes a round trip more): PostgreSQL delivers it only when that transaction commits,
//! and never when it rolls back. They are: a session created, a lease released
//! (`release_lease`, and `set_status` when it releases), an approval decided that sends
//! the session back to work, a resolution recorded, a session unparked or woken, a queue
//! limit set or lifted. The journal and checkpoint writes never notify: a transaction
//! that notified takes a database-wide lock at commit, which would serialize every turn
//! of every session. A sleeper coming due is no write at all: a pool that woke for the
//! release after its sleep was checkpointed reads the next wake-up time
//! (`next_wake_at`) and waits no longer than that.
//!
//! # The listener
//! [`Listener::subscribe`] (behind `CheckpointStore::work_events`) starts, once per store
//! and shared by its clones, a task with a connection of its own (its own one-connection
//! pool with the store's connect options: never one of the store's connections, which a
//! `LISTEN` would hold for good) that runs `LISTEN durable_work` and bumps the store's
//! [`WorkNotifier`] on each notification. On any error it drops the connection, waits
//! (100 ms, doubling up to 1 s) and connects again; once it listens again (and once
//! after the first `LISTEN`) it bumps the notifier, since a notification sent meanwhile
//! was lost. The task is aborted when the last clone of the store is dropped. Pools poll
//! as well, so a lost notification only costs latency.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use durable_core::store::{WorkEvents, WorkNotifier};
use sqlx::postgres::{PgConnectOptions, PgListener, PgPoolOptions};
use tokio::task::AbortHandle;

/// The channel every store notifies and listens on.
pub(crate) const CHANNEL: &str = "durable_work";

/// `pg_notify` on [`CHANNEL`], for a statement's select list.
macro_rules! pg_notify {
    () => {
        "pg_notify('durable_work', '')"
    };
}
pub(crate) use pg_notify;

/// The first pause before connecting again after an error, and the longest: a second,
/// so that a server back from a restart is heard again within about a second (a refused
/// connection attempt costs next to nothing).
const BACKOFF: (Duration, Duration) = (Duration::from_millis(100), Duration::from_secs(1));

/// How long one attempt to connect may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// A store's in-process notifier and, started on first use, its `LISTEN` task.
pub(crate) struct Listener {
    work: WorkNotifier,
    /// How the task connects; `None`: never listen (read-only stores, or turned off).
    connect: Option<PgConnectOptions>,
    task: Mutex<Option<AbortHandle>>,
}

impl std::fmt::Debug for Listener {
    // Not the connect options: they hold the password.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Listener")
            .field("listens", &self.connect.is_some())
            .finish_non_exhaustive()
    }
}

impl Listener {
    /// A listener that connects with `connect` once someone subscribes (never, if `None`).
    pub(crate) fn new(connect: Option<PgConnectOptions>) -> Arc<Self> {
        Arc::new(Listener {
            work: WorkNotifier::new(),
            connect,
            task: Mutex::new(None),
        })
    }

    /// Tells this process's idle pools that a write made work available.
    pub(crate) fn notify(&self) {
        self.work.notify();
    }

    /// A subscription to the notifier, with the `LISTEN` task started first if it is not
    /// running and a tokio runtime is at hand (without one, in-process events only).
    pub(crate) fn subscribe(&self) -> WorkEvents {
        let events = self.work.subscribe();
        if let Some(connect) = &self.connect
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            let mut task = self.task.lock().unwrap_or_else(|e| e.into_inner());
            // Finished: its runtime was shut down (a store kept beyond it); start again.
            if task.as_ref().is_none_or(AbortHandle::is_finished) {
                let handle = runtime.spawn(listen(connect.clone(), self.work.clone()));
                *task = Some(handle.abort_handle());
            }
        }
        events
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        let task = self.task.get_mut().unwrap_or_else(|e| e.into_inner());
        if let Some(task) = task.take() {
            task.abort();
        }
    }
}

/// The `LISTEN` task: listens until an error, then connects again after a pause, for as
/// long as it is not aborted.
async fn listen(connect: PgConnectOptions, work: WorkNotifier) {
    let mut pause = BACKOFF.0;
    loop {
        let error = match listen_once(&connect, &work, &mut pause).await {
            Ok(never) => match never {},
            Err(e) => e,
        };
        tracing::warn!(error = %error, retry_in = ?pause, "LISTEN {CHANNEL} failed; idle pools poll until it is back");
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(BACKOFF.1);
    }
}

/// One connection: `LISTEN`, then a bump per notification until an error. Resets `pause`
/// once listening.
async fn listen_once(
    connect: &PgConnectOptions,
    work: &WorkNotifier,
    pause: &mut Duration,
) -> Result<std::convert::Infallible, sqlx::Error> {
    // A pool of one connection of its own, as `PgListener::connect` makes; it only serves
    // to connect (and reconnect, below) with the store's options.
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .max_lifetime(None)
        .idle_timeout(None)
        .acquire_timeout(CONNECT_TIMEOUT)
        .connect_with(connect.clone())
        .await?;
    let mut listener = PgListener::connect_with(&pool).await?;
    listener.listen(CHANNEL).await?;
    tracing::debug!("LISTEN {CHANNEL}");
    *pause = BACKOFF.0;
    // Anything committed before the `LISTEN` was not heard.
    work.notify();
    loop {
        match listener.try_recv().await? {
            Some(_) => work.notify(),
            // The connection was lost and made again (`eager_reconnect`, the default),
            // `LISTEN` included: whatever was sent in between was lost.
            None => {
                tracing::debug!("LISTEN {CHANNEL}: connection lost and made again");
                work.notify();
            }
        }
    }
}
