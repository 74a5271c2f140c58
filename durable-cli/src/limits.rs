//! `limits`: the fleet's rate limits, as every worker of the store shares them.

use clap::Args;
use durable::CheckpointStore;
use durable::limiter::{LimiterInfo, Quota};
use serde_json::json;

use crate::display::{NAME, clip};
use crate::error::CliError;
use crate::render::{self, age, table};

pub const LIMITS_HELP: &str = "\
One row per rate limit defined in the store (`DurableBuilder::rate_limit`), every time
relative to the store's clock:

  REQUESTS / TOKENS  the quotas: so many per period, and the burst capacity
  RATE               calls started in the last period (a sliding-window estimate)
  WAITERS            calls whose turn is still to come, held in memory by a worker or
                     asleep until their turn (served first come, first served)
  NEXT START         the latest turn given: a new call starts after it
  HELD UNTIL         a provider's 429 holds every call of the fleet until then
  429S / ADMITTED    429s reported and calls admitted so far

--json prints `{\"now\": ms, \"limits\": […]}`.";

#[derive(Debug, Args)]
pub struct LimitsArgs {}

/// `500/1m (burst 500)`.
fn quota(q: Option<Quota>) -> String {
    let Some(q) = q else {
        return "-".to_owned();
    };
    let period = match q.period_ms {
        ms if ms % 60_000 == 0 => format!("{}m", ms / 60_000),
        ms if ms % 1000 == 0 => format!("{}s", ms / 1000),
        ms => format!("{ms}ms"),
    };
    format!("{}/{period} (burst {})", q.amount, q.burst)
}

pub async fn limits(
    store: &dyn CheckpointStore,
    json: bool,
    _args: LimitsArgs,
) -> Result<(), CliError> {
    let now = store.now().await?;
    let limits: Vec<LimiterInfo> = store.limiters().await?;
    if json {
        return render::print_json(&json!({ "now": now, "limits": limits }));
    }
    if limits.is_empty() {
        outln!("no rate limit is defined in this store");
        return Ok(());
    }
    let mut t = table([
        "LIMIT",
        "REQUESTS",
        "TOKENS",
        "RATE",
        "WAITERS",
        "NEXT START",
        "HELD UNTIL",
        "429S",
        "ADMITTED",
    ]);
    for l in &limits {
        let when = |at: Option<i64>| {
            at.filter(|&at| at > now)
                .map_or_else(|| "-".to_owned(), |at| age(at, now))
        };
        t.add_row(vec![
            clip(&l.name, NAME),
            quota(l.limit.requests),
            quota(l.limit.tokens),
            l.current_requests
                .map_or_else(|| "-".to_owned(), |r| format!("{r:.1}")),
            l.waiters.to_string(),
            when(l.next_start_at),
            when(l.throttled_until),
            l.throttles.to_string(),
            l.admitted.to_string(),
        ]);
    }
    render::print_table(&t);
    Ok(())
}
