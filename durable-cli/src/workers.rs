//! The worker pools' side of the store: `workers` (queues, tenants, who holds which
//! lease, sleeping sessions), `wake`, `queue-limit` and `tenant-limit`.

use std::collections::BTreeMap;

use clap::Args;
use durable::store::{QueueInfo, SessionFilter, SessionRecord, SessionStatus, TenantInfo};
use durable::{CheckpointStore, SessionId};
use serde::Serialize;
use serde_json::json;

use crate::display::{ID, NAME, clip};
use crate::error::{CliError, Code};
use crate::render::{self, age, table};

pub const WORKERS_HELP: &str = "\
Four sections, every time relative to the store's clock:

  Queues    one row per queue with a session that is not terminal, or with a limit: its
            fleet-wide limit (`-` for none), the sessions running (a live lease), ready
            (a claim would take them now), sleeping, awaiting approval and parked, and
            when its next sleeper wakes up
  Tenants   one row per tenant with a limit or an active session: its fleet-wide limit
            (`durable tenant-limit`), its active sessions running (a live lease) and
            queued (not leased: ready, asleep or waiting); shown when there is one
  Workers   each owner holding live leases: how many sessions, its oldest last renewal
            (a worker that stopped renewing shows here first), and each session with its
            queue, last renewal and lease expiry
  Sleeping  active sessions asleep (their wake-up time is still to come), lease free:
            queue and due time; `durable wake <session>` ends a sleep now

--json prints `{\"now\": ms, \"queues\": […], \"tenants\": […], \"workers\": […],
\"sleeping\": […]}`.";

#[derive(Debug, Args)]
pub struct WorkersArgs {}

pub const WAKE_HELP: &str = "\
A session asleep (`Session::sleep_until`, or submitted with a start time) is claimed by no
worker before its wake-up time. `wake` moves that time to now: the next claim of a pool
serving its queue takes it. A session that is not asleep is left unchanged (exit 0); one
that is not active is refused (exit 4).";

#[derive(Debug, Args)]
pub struct WakeArgs {
    /// The sleeping session.
    pub session: String,
}

pub const QUEUE_LIMIT_HELP: &str = "\
At most N sessions of the queue hold a lease at once, across every worker of the store:
claims stop while N run (a session started, or resumed by id, is not refused, and counts
toward the limit). 0 pauses the queue's claims. Lowering a limit below the sessions running
stops new claims until enough of them finish. --remove lifts the limit. Prints the queue's
row afterwards, as `durable workers` shows it.";

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("limit_or_remove").required(true).args(["limit", "remove"])))]
pub struct QueueLimitArgs {
    /// The queue (sessions start in `default` unless given another).
    pub queue: String,
    /// At most this many of its sessions running at once.
    #[arg(value_name = "N")]
    pub limit: Option<u32>,
    /// Remove the queue's limit.
    #[arg(long, conflicts_with = "limit")]
    pub remove: bool,
}

pub const TENANT_LIMIT_HELP: &str = "\
At most N sessions of the tenant (started with `StartOptions::with_tenant`) hold a lease at
once, across every queue and worker of the store: claims pass its other sessions by while N
run. 0 pauses the tenant's claims. --remove lifts the limit. Prints the tenant's row
afterwards, as `durable workers` shows it.";

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("limit_or_remove").required(true).args(["limit", "remove"])))]
pub struct TenantLimitArgs {
    /// The tenant.
    pub tenant: String,
    /// At most this many of its sessions running at once.
    #[arg(value_name = "N")]
    pub limit: Option<u32>,
    /// Remove the tenant's limit.
    #[arg(long, conflicts_with = "limit")]
    pub remove: bool,
}

/// A session held under a live lease.
#[derive(Serialize)]
struct Held {
    session: SessionId,
    queue: String,
    lease_expires_at: Option<i64>,
    lease_renewed_at: Option<i64>,
}

/// An owner and the live leases it holds.
#[derive(Serialize)]
struct Owner {
    owner: String,
    /// The oldest last renewal among its leases (ms).
    oldest_renewal_at: Option<i64>,
    sessions: Vec<Held>,
}

/// A session asleep, lease free.
#[derive(Serialize)]
struct Sleeper {
    session: SessionId,
    queue: String,
    app_version: String,
    wake_at: i64,
}

/// Whether `s` holds a lease that has not expired at `now`.
fn lease_live(s: &SessionRecord, now: i64) -> bool {
    s.lease_owner.is_some() && s.lease_expires_at.is_some_and(|t| t > now)
}

/// Whether `s` is asleep at `now`: its wake-up time to come, its lease free.
pub fn asleep(s: &SessionRecord, now: i64) -> bool {
    s.status == SessionStatus::Active && s.wake_at.is_some_and(|t| t > now) && !lease_live(s, now)
}

pub async fn workers(
    store: &dyn CheckpointStore,
    json: bool,
    _args: WorkersArgs,
) -> Result<(), CliError> {
    let now = store.now().await?;
    let queues = store.queues().await?;
    let tenants = store.tenants().await?;
    let active = store
        .list_sessions(&SessionFilter::new().with_statuses(vec![SessionStatus::Active]))
        .await?;

    let mut owners: BTreeMap<String, Vec<Held>> = BTreeMap::new();
    for s in active.iter().filter(|s| lease_live(s, now)) {
        let owner = s.lease_owner.clone().unwrap_or_default();
        owners.entry(owner).or_default().push(Held {
            session: s.id.clone(),
            queue: s.queue.clone(),
            lease_expires_at: s.lease_expires_at,
            lease_renewed_at: s.lease_renewed_at,
        });
    }
    let owners: Vec<Owner> = owners
        .into_iter()
        .map(|(owner, mut sessions)| {
            sessions.sort_by(|a, b| a.session.as_str().cmp(b.session.as_str()));
            Owner {
                oldest_renewal_at: sessions.iter().filter_map(|h| h.lease_renewed_at).min(),
                owner,
                sessions,
            }
        })
        .collect();
    let mut sleeping: Vec<Sleeper> = active
        .iter()
        .filter(|s| asleep(s, now))
        .map(|s| Sleeper {
            session: s.id.clone(),
            queue: s.queue.clone(),
            app_version: s.app_version.clone(),
            wake_at: s.wake_at.unwrap_or_default(),
        })
        .collect();
    sleeping.sort_by(|a, b| (a.wake_at, a.session.as_str()).cmp(&(b.wake_at, b.session.as_str())));

    if json {
        return render::print_json(&json!({
            "now": now,
            "queues": queues,
            "tenants": tenants,
            "workers": owners,
            "sleeping": sleeping,
        }));
    }

    outln!("Queues");
    if queues.is_empty() {
        outln!("  no queue has a session or a limit");
    } else {
        print_queues(&queues, now);
    }
    if !tenants.is_empty() {
        outln!();
        outln!("Tenants");
        print_tenants(&tenants);
    }

    outln!();
    outln!("Workers");
    if owners.is_empty() {
        outln!("  no worker holds a live lease");
    } else {
        let mut t = table([
            "OWNER",
            "SESSIONS",
            "OLDEST RENEWAL",
            "SESSION",
            "QUEUE",
            "RENEWED",
            "LEASE EXPIRES",
        ]);
        let when = |at: Option<i64>| at.map_or_else(|| "-".to_owned(), |at| age(at, now));
        for o in &owners {
            for (i, h) in o.sessions.iter().enumerate() {
                let (owner, count, oldest) = if i == 0 {
                    (
                        clip(&o.owner, NAME),
                        o.sessions.len().to_string(),
                        when(o.oldest_renewal_at),
                    )
                } else {
                    (String::new(), String::new(), String::new())
                };
                t.add_row(vec![
                    owner,
                    count,
                    oldest,
                    clip(h.session.as_str(), ID),
                    clip(&h.queue, NAME),
                    when(h.lease_renewed_at),
                    when(h.lease_expires_at),
                ]);
            }
        }
        render::print_table(&t);
    }

    outln!();
    outln!("Sleeping");
    if sleeping.is_empty() {
        outln!("  no session is asleep");
    } else {
        let mut t = table(["SESSION", "QUEUE", "DUE", "AT"]);
        for s in &sleeping {
            t.add_row(vec![
                clip(s.session.as_str(), ID),
                clip(&s.queue, NAME),
                age(s.wake_at, now),
                render::time(s.wake_at),
            ]);
        }
        render::print_table(&t);
    }
    Ok(())
}

pub async fn tenant_limit(
    store: &dyn CheckpointStore,
    json: bool,
    args: TenantLimitArgs,
) -> Result<(), CliError> {
    let limit = if args.remove { None } else { args.limit };
    store.set_tenant_limit(&args.tenant, limit).await?;
    let row = store
        .tenants()
        .await?
        .into_iter()
        .find(|t| t.name == args.tenant)
        .unwrap_or_else(|| TenantInfo::new(args.tenant.clone(), None, 0, 0));
    if json {
        return render::print_json(&row);
    }
    let tenant = clip(&args.tenant, NAME);
    match limit {
        Some(0) => outln!("tenant `{tenant}` paused: no worker claims its sessions (limit 0)"),
        Some(n) => outln!(
            "tenant `{tenant}` limited to {n} session{} running at once across every queue and worker",
            if n == 1 { "" } else { "s" }
        ),
        None => outln!("tenant `{tenant}` has no limit any more"),
    }
    outln!();
    print_tenants(std::slice::from_ref(&row));
    Ok(())
}

/// The tenants table of `workers` and `tenant-limit`.
fn print_tenants(tenants: &[TenantInfo]) {
    let mut t = table(["TENANT", "LIMIT", "RUNNING", "QUEUED"]);
    for tenant in tenants {
        t.add_row(vec![
            clip(&tenant.name, NAME),
            tenant
                .max_running
                .map_or_else(|| "-".to_owned(), |n| n.to_string()),
            tenant.running.to_string(),
            tenant.queued.to_string(),
        ]);
    }
    render::print_table(&t);
}

/// The queues table of `workers` and `queue-limit`.
fn print_queues(queues: &[QueueInfo], now: i64) {
    let mut t = table([
        "QUEUE",
        "LIMIT",
        "RUNNING",
        "READY",
        "SLEEPING",
        "WAITING",
        "AWAITING APPROVAL",
        "PARKED",
        "NEXT WAKE-UP",
    ]);
    for q in queues {
        t.add_row(vec![
            clip(&q.name, NAME),
            q.max_running
                .map_or_else(|| "-".to_owned(), |n| n.to_string()),
            q.running.to_string(),
            q.ready.to_string(),
            q.sleeping.to_string(),
            q.waiting.to_string(),
            q.awaiting_approval.to_string(),
            q.parked.to_string(),
            q.next_wake_at
                .map_or_else(|| "-".to_owned(), |at| age(at, now)),
        ]);
    }
    render::print_table(&t);
}

pub async fn wake(store: &dyn CheckpointStore, json: bool, args: WakeArgs) -> Result<(), CliError> {
    let id = SessionId::new(args.session);
    let before = store.session(&id).await?;
    let shown = clip(id.as_str(), ID);
    if before.status != SessionStatus::Active {
        return Err(CliError::new(
            Code::Refused,
            format!(
                "session `{shown}` is {}, not active: only an active session sleeps; nothing was changed",
                before.status.as_str()
            ),
        ));
    }
    let now = store.now().await?;
    let was_asleep = asleep(&before, now);
    let record = if was_asleep {
        store.wake_session(&id).await?
    } else {
        before.clone()
    };
    if json {
        return render::print_json(&json!({
            "session": record.id,
            "queue": record.queue,
            "woken": was_asleep,
            "was_asleep_until": before.wake_at.filter(|_| was_asleep),
            "wake_at": record.wake_at,
        }));
    }
    match before.wake_at {
        Some(until) if was_asleep => outln!(
            "woke session `{shown}` (asleep until {}, {}): the next claim of a pool serving queue `{}` takes it",
            render::time(until),
            age(until, now),
            clip(&record.queue, NAME)
        ),
        _ if lease_live(&before, now) => outln!(
            "session `{shown}` is not asleep: it is running, leased by `{}`; nothing was changed",
            clip(before.lease_owner.as_deref().unwrap_or_default(), NAME)
        ),
        _ => outln!("session `{shown}` is not asleep; nothing was changed"),
    }
    Ok(())
}

pub async fn queue_limit(
    store: &dyn CheckpointStore,
    json: bool,
    args: QueueLimitArgs,
) -> Result<(), CliError> {
    let limit = if args.remove { None } else { args.limit };
    store.set_queue_limit(&args.queue, limit).await?;
    let now = store.now().await?;
    let row = store
        .queues()
        .await?
        .into_iter()
        .find(|q| q.name == args.queue)
        .unwrap_or_else(|| QueueInfo::new(args.queue.clone()));
    if json {
        return render::print_json(&row);
    }
    let queue = clip(&args.queue, NAME);
    match limit {
        Some(0) => outln!("queue `{queue}` paused: no worker claims its sessions (limit 0)"),
        Some(n) => outln!(
            "queue `{queue}` limited to {n} session{} running at once across every worker",
            if n == 1 { "" } else { "s" }
        ),
        None => outln!("queue `{queue}` has no limit any more"),
    }
    outln!();
    print_queues(std::slice::from_ref(&row), now);
    Ok(())
}
