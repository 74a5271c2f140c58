//! Cases: per-tenant concurrency. A tenant's limit bounds how many of its sessions hold
//! a lease at once, across queues and claimers (concurrent ones included); sessions of
//! other tenants, or of none, are claimed past a full tenant; a place freed is taken.
//!
//! Every case uses tenants and queues of its own.

use std::sync::Arc;
use std::time::Duration;

use super::{LONG_TTL, MAX_ATTEMPTS, owner};
use durable_core::ids::SessionId;
use durable_core::runtime::{Durable, StartOptions};
use durable_core::store::{CheckpointStore, Claim, SessionStatus};
use durable_core::transcript::Message;

fn name(tag: &str) -> String {
    format!("{tag}-{}", uuid::Uuid::new_v4().simple())
}

fn runtime(store: &Arc<dyn CheckpointStore>) -> Durable {
    Durable::builder(Arc::clone(store))
        .owner(owner("submitter"))
        .app_version("v1")
        .priority_aging(Duration::from_secs(3600))
        .build()
}

async fn submit(durable: &Durable, queue: &str, tenant: Option<&str>) -> SessionId {
    let mut options = StartOptions::<Message>::new().with_queue(queue);
    if let Some(tenant) = tenant {
        options = options.with_tenant(tenant);
    }
    durable.submit(options).await.expect("submit")
}

fn claim(queue: &str, claimer: &str) -> Claim {
    Claim::new(owner(claimer), LONG_TTL, MAX_ATTEMPTS).with_queues([queue])
}

/// A tenant limited to 1: its second session waits while the first is leased, sessions
/// of another tenant and of none are claimed past it, and the place freed (the first
/// completes) is taken.
pub async fn worker_tenant_limit_bounds_claims(store: Arc<dyn CheckpointStore>) {
    let queue = name("tenants");
    let (acme, other) = (name("acme"), name("other"));
    let durable = runtime(&store);
    durable
        .operator()
        .set_tenant_limit(&acme, Some(1))
        .await
        .expect("set_tenant_limit");
    let a1 = submit(&durable, &queue, Some(&acme)).await;
    let a2 = submit(&durable, &queue, Some(&acme)).await;
    let b1 = submit(&durable, &queue, Some(&other)).await;
    let c1 = submit(&durable, &queue, None).await;

    let mut taken = Vec::new();
    while let Some(lease) = store
        .claim_expired(&claim(&queue, "pool"))
        .await
        .expect("claim")
    {
        taken.push(lease);
    }
    let ids: Vec<&SessionId> = taken.iter().map(|l| &l.session).collect();
    assert_eq!(
        ids,
        [&a1, &b1, &c1],
        "acme's second session waits while its first is leased; the others are claimed past it"
    );
    // Acme's first session completes: its place is free.
    store
        .set_status(taken[0].fence(), SessionStatus::Completed, None)
        .await
        .expect("complete acme's first");
    let next = store
        .claim_expired(&claim(&queue, "pool"))
        .await
        .expect("claim")
        .expect("acme's place is free again");
    assert_eq!(
        next.session, a2,
        "the place freed goes to acme's waiting session"
    );

    // Lifting the limit lets every session of the tenant run.
    durable
        .operator()
        .set_tenant_limit(&acme, None)
        .await
        .expect("lift");
    let a3 = submit(&durable, &queue, Some(&acme)).await;
    let lease = store
        .claim_expired(&claim(&queue, "pool"))
        .await
        .expect("claim")
        .expect("no limit any more");
    assert_eq!(lease.session, a3);
}

/// Concurrent claimers of a tenant limited to 3, in two queues: exactly 3 win.
pub async fn worker_concurrent_claims_respect_the_tenant_limit(store: Arc<dyn CheckpointStore>) {
    const LIMIT: u32 = 3;
    const SESSIONS: usize = 10;
    let tenant = name("contended");
    let queues = [name("tq-a"), name("tq-b")];
    let durable = runtime(&store);
    for n in 0..SESSIONS {
        submit(&durable, &queues[n % 2], Some(&tenant)).await;
    }
    durable
        .operator()
        .set_tenant_limit(&tenant, Some(LIMIT))
        .await
        .expect("set_tenant_limit");
    let handles: Vec<_> = (0..SESSIONS)
        .map(|n| {
            let store = Arc::clone(&store);
            let claim = Claim::new(owner(&format!("claimer-{n}")), LONG_TTL, MAX_ATTEMPTS)
                .with_queues(queues.clone());
            tokio::spawn(async move { store.claim_expired(&claim).await })
        })
        .collect();
    let mut granted = 0_u32;
    for handle in handles {
        if handle
            .await
            .expect("a claimer task")
            .expect("claim_expired")
            .is_some()
        {
            granted += 1;
        }
    }
    assert_eq!(
        granted, LIMIT,
        "{SESSIONS} concurrent claims of a tenant limited to {LIMIT}, across two queues"
    );
}

/// `tenants()` shows each tenant's limit and its active sessions, running (leased) and
/// queued, at one moment; a tenant without a limit is listed while it has active
/// sessions, and one with a limit even without sessions.
pub async fn worker_tenants_are_listed_with_their_figures(store: Arc<dyn CheckpointStore>) {
    let queue = name("listed");
    let (acme, free, idle) = (name("acme"), name("free"), name("idle"));
    let durable = runtime(&store);
    let operator = durable.operator();
    operator
        .set_tenant_limit(&acme, Some(1))
        .await
        .expect("limit acme");
    operator
        .set_tenant_limit(&idle, Some(4))
        .await
        .expect("limit idle");
    for tenant in [&acme, &acme, &free] {
        submit(&durable, &queue, Some(tenant)).await;
    }
    submit(&durable, &queue, None).await;
    // Acme's first and the free tenant's session are leased; acme's second waits.
    let mut taken = Vec::new();
    while let Some(lease) = store
        .claim_expired(&claim(&queue, "pool"))
        .await
        .expect("claim")
    {
        taken.push(lease);
    }
    assert_eq!(taken.len(), 3, "acme's second session is held back");
    let tenants = operator.tenants().await.expect("tenants");
    let figures = |tenant: &str| {
        tenants
            .iter()
            .find(|t| t.name == tenant)
            .map(|t| (t.max_running, t.running, t.queued))
    };
    assert_eq!(figures(&acme), Some((Some(1), 1, 1)));
    assert_eq!(figures(&free), Some((None, 1, 0)));
    assert_eq!(figures(&idle), Some((Some(4), 0, 0)));
    let mut names: Vec<&str> = tenants.iter().map(|t| t.name.as_str()).collect();
    let sorted = {
        let mut n = names.clone();
        n.sort_unstable();
        n
    };
    assert_eq!(names, sorted, "by name");
    names.retain(|n| [&acme, &free, &idle].iter().any(|t| t.as_str() == *n));
    assert_eq!(names.len(), 3, "each tenant once");
}
