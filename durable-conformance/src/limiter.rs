//! Cases: fleet-wide rate limits kept in the store. A definition is shared and the last
//! one wins; starts honour the rate and never burst above the capacity, concurrent
//! callers included; waiters are served first come, first served and keep their place
//! when they come back; a provider's `429` holds every caller; tokens charged after a
//! reply delay the calls after it.
//!
//! Every case uses limits named after a fresh id, so cases share nothing.

use std::sync::Arc;
use std::time::Duration;

use super::expect_err;
use durable_core::error::StoreError;
use durable_core::limiter::{Acquire, Defined, Quota, RateLimit};
use durable_core::store::CheckpointStore;

/// A fresh limit name.
fn limit_name(tag: &str) -> String {
    format!("conformance:{tag}:{}", uuid::Uuid::new_v4())
}

/// Defines `name` as `limit` (panics on failure).
async fn define(store: &dyn CheckpointStore, name: &str, limit: RateLimit) {
    store
        .define_limit(name, &limit)
        .await
        .unwrap_or_else(|e| panic!("define_limit(`{name}`) failed: {e:?}"));
}

/// The figures of `name` from `limiters()`.
async fn info(store: &dyn CheckpointStore, name: &str) -> durable_core::limiter::LimiterInfo {
    store
        .limiters()
        .await
        .expect("limiters")
        .into_iter()
        .find(|l| l.name == name)
        .unwrap_or_else(|| panic!("limiters() does not list `{name}`"))
}

/// Definitions: created, unchanged, replaced by the last one (keeping the buckets),
/// listed for operators; bad ones and unknown names refused with typed errors.
pub async fn limiter_definition_is_shared_and_the_last_wins(store: Arc<dyn CheckpointStore>) {
    let store = &*store;
    let name = limit_name("define");
    let first = RateLimit::requests(Quota::per_second(10));
    assert_eq!(
        store.define_limit(&name, &first).await.expect("define"),
        Defined::Created
    );
    assert_eq!(
        store
            .define_limit(&name, &first)
            .await
            .expect("define again"),
        Defined::Unchanged,
        "the same definition changes nothing"
    );
    let second =
        RateLimit::requests(Quota::per_minute(500)).with_tokens(Quota::per_minute(200_000));
    assert_eq!(
        store.define_limit(&name, &second).await.expect("redefine"),
        Defined::Replaced { previous: first },
        "another definition replaces the stored one and says which it was"
    );
    let listed = info(store, &name).await;
    assert_eq!(
        listed.limit, second,
        "every worker reads the last definition"
    );
    assert_eq!(listed.waiters, 0);
    assert_eq!(listed.admitted, 0);

    expect_err!(
        store
            .define_limit(
                &limit_name("zero"),
                &RateLimit::requests(Quota::per_second(0))
            )
            .await,
        StoreError::InvalidLimit { .. },
        "a quota of 0 per period is refused"
    );
    expect_err!(
        store
            .define_limit("", &RateLimit::requests(Quota::per_second(1)))
            .await,
        StoreError::InvalidLimit { .. },
        "an empty name is refused"
    );
    let unknown = limit_name("unknown");
    expect_err!(
        store.acquire_limit(&Acquire::new(&unknown)).await,
        StoreError::LimitNotDefined { name } => assert_eq!(name, unknown),
        "acquiring an undefined limit"
    );
    expect_err!(
        store.throttle_limit(&unknown, Duration::from_secs(1)).await,
        StoreError::LimitNotDefined { .. },
        "throttling an undefined limit"
    );
    expect_err!(
        store.charge_limit(&unknown, 10).await,
        StoreError::LimitNotDefined { .. },
        "charging an undefined limit"
    );
}

/// Starts honour the rate and the capacity: a burst of `burst` at once, then one every
/// interval, for callers in one task and for many at once.
pub async fn limiter_starts_honour_the_rate_and_the_capacity(store: Arc<dyn CheckpointStore>) {
    let name = limit_name("rate");
    // 20 per second (one every 50 ms), at most 3 at once.
    define(
        &*store,
        &name,
        RateLimit::requests(Quota::per_second(20).with_burst(3)),
    )
    .await;
    // 8 tasks, 5 calls each, all at once.
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let store = Arc::clone(&store);
            let name = name.clone();
            tokio::spawn(async move {
                let mut out = Vec::new();
                for _ in 0..5 {
                    out.push(
                        store
                            .acquire_limit(&Acquire::new(&name))
                            .await
                            .expect("acquire"),
                    );
                }
                out
            })
        })
        .collect();
    let mut admissions = Vec::new();
    for task in tasks {
        admissions.extend(task.await.expect("task"));
    }
    let first_now = admissions.iter().map(|a| a.now).min().expect("calls");
    let mut starts: Vec<i64> = admissions.iter().map(|a| a.start_at).collect();
    starts.sort_unstable();
    // In any window, at most `burst + length / interval` starts (1 ms of rounding).
    for i in 0..starts.len() {
        for j in i + 1..starts.len() {
            let count = (j - i + 1) as i64;
            let allowed = 3 + (starts[j] - starts[i] + 1) / 50;
            assert!(
                count <= allowed,
                "{count} calls started within {} ms; a limit of 20/s with a burst of 3 allows {allowed}: {starts:?}",
                starts[j] - starts[i]
            );
        }
    }
    // And no slower than the rate: 40 calls, 3 at once, then one per 50 ms.
    let last = *starts.last().expect("calls");
    assert!(
        last - first_now <= 37 * 50 + 250,
        "the 40th call starts {} ms after the first acquire; the rate allows it after {} ms",
        last - first_now,
        37 * 50
    );
    assert_eq!(info(&*store, &name).await.admitted, 40);
}

/// Waiters are served in the order they arrived, each keeps its place when it comes
/// back (the same start, no new reservation), takes it once due, and is counted as a
/// waiter until then.
pub async fn limiter_waiters_are_served_first_come_first_served(store: Arc<dyn CheckpointStore>) {
    let store = &*store;
    let name = limit_name("fifo");
    // One every 100 ms, no burst above 1.
    define(
        store,
        &name,
        RateLimit::requests(Quota::per_second(10).with_burst(1)),
    )
    .await;
    let mut admissions = Vec::new();
    for i in 0..6 {
        let acquire = Acquire::new(&name).with_waiter(format!("w{i}"));
        admissions.push(store.acquire_limit(&acquire).await.expect("acquire"));
    }
    assert!(
        admissions[0].is_granted(),
        "the first call of a quiet limit starts at once"
    );
    for (i, pair) in admissions.windows(2).enumerate() {
        assert!(
            pair[1].start_at >= pair[0].start_at + 99,
            "waiter w{} arrived after w{i} and must start at least 100 ms after it: {admissions:?}",
            i + 1
        );
    }
    for (i, a) in admissions.iter().enumerate().skip(1) {
        assert_eq!(
            a.ahead,
            i as i64 - 1,
            "waiter w{i} has the waiters before it ahead (w0 started at once): {admissions:?}"
        );
    }
    assert_eq!(info(store, &name).await.waiters, 5, "five waiters wait");

    // w3 comes back early: the same place, no new reservation.
    let again = store
        .acquire_limit(&Acquire::new(&name).with_waiter("w3"))
        .await
        .expect("acquire again");
    assert_eq!(
        again.start_at, admissions[3].start_at,
        "a waiter keeps its place"
    );
    assert!(!again.is_granted());
    let newcomer = store
        .acquire_limit(&Acquire::new(&name).with_waiter("late"))
        .await
        .expect("newcomer");
    assert!(
        newcomer.start_at >= admissions[5].start_at + 99,
        "a newcomer queues behind every waiter, and w3 coming back took no second place: {newcomer:?} after {admissions:?}"
    );

    // Once due, w1 takes its place: granted, and no longer a waiter.
    let due = admissions[1].start_at;
    super::wait_past(store, due).await;
    let taken = store
        .acquire_limit(&Acquire::new(&name).with_waiter("w1"))
        .await
        .expect("take");
    assert!(taken.is_granted(), "a due waiter is granted: {taken:?}");
    assert_eq!(taken.start_at, due, "at the start it was given");
    let listed = info(store, &name).await;
    assert!(
        listed.waiters <= 5,
        "w1 no longer waits: {} waiters",
        listed.waiters
    );
    // Coming back after taking it is a new call: a new place at the back.
    let back = store
        .acquire_limit(&Acquire::new(&name).with_waiter("w1"))
        .await
        .expect("back");
    assert!(
        back.start_at > newcomer.start_at,
        "a place once taken is not given twice: {back:?}"
    );
}

/// A provider's `429` with `retry-after` holds every caller until then, and the fleet
/// resumes at the sustained rate, not with a burst.
pub async fn limiter_a_429_holds_the_whole_fleet(store: Arc<dyn CheckpointStore>) {
    let store = &*store;
    let name = limit_name("throttle");
    define(
        store,
        &name,
        RateLimit::requests(Quota::per_second(10).with_burst(5)),
    )
    .await;
    let before = store
        .acquire_limit(&Acquire::new(&name))
        .await
        .expect("acquire");
    assert!(before.is_granted());
    // A waiter queued before the 429 (the burst used up first).
    for _ in 0..4 {
        store
            .acquire_limit(&Acquire::new(&name))
            .await
            .expect("burst");
    }
    let queued = store
        .acquire_limit(&Acquire::new(&name).with_waiter("queued"))
        .await
        .expect("queued");
    assert!(!queued.is_granted(), "the burst is used up: {queued:?}");
    let until = store
        .throttle_limit(&name, Duration::from_secs(2))
        .await
        .expect("throttle");
    assert!(
        until >= before.now + 2000,
        "held for the retry-after: until {until}, asked at about {}",
        before.now
    );
    // A shorter one does not shorten it.
    let still = store
        .throttle_limit(&name, Duration::from_millis(10))
        .await
        .expect("throttle again");
    assert_eq!(
        still, until,
        "a shorter retry-after does not end the hold early"
    );
    let held: Vec<_> = {
        let mut out = Vec::new();
        for _ in 0..3 {
            out.push(
                store
                    .acquire_limit(&Acquire::new(&name))
                    .await
                    .expect("acquire"),
            );
        }
        out
    };
    assert!(
        held[0].start_at >= until,
        "no call starts before the hold ends: {held:?}, until {until}"
    );
    assert!(
        held[1].start_at >= held[0].start_at + 99 && held[2].start_at >= held[1].start_at + 99,
        "after a 429 the fleet resumes at the rate, not with a burst: {held:?}"
    );
    // The waiter queued before the 429 comes back: its place fell inside the hold, so
    // it is given a new one after it.
    let back = store
        .acquire_limit(&Acquire::new(&name).with_waiter("queued"))
        .await
        .expect("queued again");
    assert!(
        back.start_at >= until && !back.is_granted(),
        "a place inside the hold moves after it: {back:?}, until {until}"
    );
    let listed = info(store, &name).await;
    assert_eq!(listed.throttles, 2);
    assert_eq!(listed.throttled_until, Some(until));
}

/// Tokens charged after a reply push the next call back by the time they take at the
/// tokens rate.
pub async fn limiter_tokens_charged_after_a_reply_delay_the_next_call(
    store: Arc<dyn CheckpointStore>,
) {
    let store = &*store;
    let name = limit_name("tokens");
    // 1000 tokens per second, bucket of 1000.
    define(store, &name, RateLimit::tokens(Quota::per_second(1000))).await;
    let first = store
        .acquire_limit(&Acquire::new(&name))
        .await
        .expect("acquire");
    assert!(first.is_granted());
    // The reply used 2500 tokens: the bucket (1000) and 1.5 s more.
    store.charge_limit(&name, 2500).await.expect("charge");
    let next = store
        .acquire_limit(&Acquire::new(&name).with_tokens(1))
        .await
        .expect("acquire");
    let wait = next.start_at - first.now;
    assert!(
        (1400..=1700).contains(&wait),
        "2500 tokens at 1000/s with a bucket of 1000 hold the next call about 1.5 s; it waits {wait} ms"
    );
}
