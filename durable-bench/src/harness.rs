//! The figures both benches print, measured the same way on every backend: the durable
//! side through [`workload`], the raw side through the bench's
//! [`Baseline`], in interleaved rounds (so background load hits both alike), each figure
//! the median round. Each function adds its rows to the [`Report`] and returns the SVG of
//! its plot, if it has one.

use std::future::Future;
use std::time::{Duration, Instant};

use durable_core::{Durable, Message, ReplayClass, SessionId};
use serde_json::json;

use crate::svg::{BarChart, LineChart, Series};
use crate::workload::{self, micros_per};
use crate::{Report, Row, Samples, Target};

/// The raw sqlx side of every figure, in the backend's own SQL, with the durability
/// settings the store uses.
pub trait Baseline: Sync {
    /// One row in one transaction (`BEGIN [IMMEDIATE]; INSERT; COMMIT`). `n` is unique.
    fn one_commit(&self, n: u64) -> impl Future<Output = ()> + Send;
    /// The raw shape of an unsafe call: a row inserted and committed, then updated and
    /// committed (two transactions). `n` is unique.
    fn two_commits(&self, n: u64) -> impl Future<Output = ()> + Send;
    /// `tasks` tasks at once, each committing `per_task` single-row transactions; commits
    /// per second.
    fn throughput(&self, tasks: usize, per_task: usize) -> impl Future<Output = f64> + Send;
    /// One agent turn in one transaction: the model's reply into a journal-like table,
    /// the reply and the tool result into a messages table, for session `session`.
    fn turn(&self, session: &str, turn: usize) -> impl Future<Output = ()> + Send;
    /// The messages of `session` in order (only the last `last` of them, if given), each
    /// parsed into a [`Message`].
    fn read_messages(
        &self,
        session: &str,
        last: Option<usize>,
    ) -> impl Future<Output = Vec<Message>> + Send;
}

/// The durable side's targets that differ between backends.
#[derive(Debug, Clone, Copy)]
pub struct Targets {
    /// Journaled `pure` calls per second with 32 sessions at once, at least.
    pub pure_per_s: f64,
    /// Journaled `unsafe_on_replay` calls per second with 32 sessions at once, at least.
    pub unsafe_per_s: f64,
    /// Storage ÷ message bytes of a 1,000-turn session, at most.
    pub storage: f64,
    /// Milliseconds to resume a session of any length with a window of
    /// [`RESUME_WINDOW`] messages, at most.
    pub window_ms: f64,
}

/// The window of the bounded resume figure: the last 20 messages (ten turns).
pub const RESUME_WINDOW: usize = 20;

/// Row numbers of the raw commits measured beside the resumes' leases (unused by the
/// other figures).
const LEASE_COMMITS: u64 = 1 << 40;

/// Figures 1 and 2: µs per journaled call of each class against the raw commit (pure) and
/// the raw two-commit pair (the other two), `calls` calls per figure in `rounds` rounds.
pub async fn latency<B: Baseline>(
    report: &mut Report,
    durable: &Durable,
    raw: &B,
    calls: usize,
    rounds: usize,
) {
    let per_round = calls.div_ceil(rounds).max(1);
    let mut sessions = Vec::new();
    for class in ReplayClass::ALL {
        let session = workload::start(durable).await;
        let spec = workload::spec(class);
        // warm-up: the step cache, the durability check, prepared statements
        for n in 0..5 {
            workload::call(&session, &spec, 1_000_000_000 + n).await;
        }
        sessions.push((session, spec));
    }
    for n in 0..5 {
        raw.one_commit(1_000_000_000 + n).await;
        raw.two_commits(2_000_000_000 + n).await;
    }
    let mut samples = Samples::new();
    for round in 0..rounds {
        let from = (round * per_round) as u64;
        let ids = from..from + per_round as u64;
        let started = Instant::now();
        for n in ids.clone() {
            raw.one_commit(n).await;
        }
        samples.add("raw1", micros_per(started.elapsed(), per_round));
        let started = Instant::now();
        for n in ids.clone() {
            raw.two_commits(n).await;
        }
        samples.add("raw2", micros_per(started.elapsed(), per_round));
        for (session, spec) in &sessions {
            let started = Instant::now();
            for n in ids.clone() {
                workload::call(session, spec, n).await;
            }
            samples.add(
                spec.class.as_str(),
                micros_per(started.elapsed(), per_round),
            );
        }
    }
    for (session, _) in sessions {
        session.release().await.expect("release");
    }
    let (raw1, raw2) = (samples.median("raw1"), samples.median("raw2"));
    report.push(
        Row::new("`pure` call", "µs/call", samples.median("pure"), raw1)
            .target(Target::ratio_at_most(1.10))
            .note("raw: one commit"),
    );
    report.push(
        Row::new(
            "`unsafe_on_replay` call",
            "µs/call",
            samples.median("unsafe_on_replay"),
            raw2,
        )
        .target(Target::ratio_at_most(1.10))
        .note("raw: a two-commit pair"),
    );
    report.push(
        Row::new(
            "`idempotent_with_key` call (informational)",
            "µs/call",
            samples.median("idempotent_with_key"),
            raw2,
        )
        .note("raw: a two-commit pair"),
    );
}

/// Figure 3: calls per second with 1, 8 and 32 sessions at once (each a task with its own
/// session and lease) for `pure` and `unsafe_on_replay`, against as many raw tasks doing one
/// commit per row; `calls` calls per round split over the sessions.
pub async fn throughput<B: Baseline>(
    report: &mut Report,
    durable: &Durable,
    raw: &B,
    calls: usize,
    rounds: usize,
    targets: Targets,
) -> String {
    const SESSIONS: [usize; 3] = [1, 8, 32];
    let pure = workload::spec(ReplayClass::Pure);
    let unsafe_ = workload::spec(ReplayClass::UnsafeOnReplay);
    let mut medians = [Vec::new(), Vec::new(), Vec::new()];
    for sessions in SESSIONS {
        let per_session = (calls / sessions).max(1);
        let mut samples = Samples::new();
        for _ in 0..rounds {
            samples.add("raw", raw.throughput(sessions, per_session).await);
            let rate = workload::throughput(durable, &pure, sessions, per_session).await;
            samples.add("pure", rate);
            let rate = workload::throughput(durable, &unsafe_, sessions, per_session).await;
            samples.add("unsafe", rate);
        }
        for (i, figure) in ["pure", "unsafe", "raw"].iter().enumerate() {
            medians[i].push(samples.median(figure));
        }
        eprintln!(
            "  {sessions:>2} sessions: pure {:.0}/s, unsafe {:.0}/s, raw {:.0}/s",
            samples.median("pure"),
            samples.median("unsafe"),
            samples.median("raw")
        );
    }
    let [pure_rates, unsafe_rates, raw_rates] = medians;
    let last = SESSIONS.len() - 1;
    report.push(
        Row::new(
            "`pure` calls/s, 32 sessions",
            "calls/s",
            pure_rates[last],
            raw_rates[last],
        )
        .target(Target::at_least(targets.pure_per_s))
        .note("raw: 32 tasks, one commit per row"),
    );
    report.push(
        Row::new(
            "`unsafe_on_replay` calls/s, 32 sessions",
            "calls/s",
            unsafe_rates[last],
            raw_rates[last],
        )
        .target(Target::at_least(targets.unsafe_per_s))
        .note("raw: 32 tasks, one commit per row"),
    );
    report.series.insert(
        "throughput".into(),
        json!({
            "sessions": SESSIONS,
            "pure_per_s": pure_rates,
            "unsafe_on_replay_per_s": unsafe_rates,
            "raw_commits_per_s": raw_rates,
        }),
    );
    BarChart {
        title: format!("{}: calls/s against sessions at once", report.backend),
        x_label: "sessions at once (each a task with its own lease)".into(),
        y_label: "calls per second".into(),
        groups: SESSIONS.iter().map(ToString::to_string).collect(),
        series: vec![
            ("durable pure".into(), pure_rates),
            ("durable unsafe_on_replay".into(), unsafe_rates),
            ("raw: one commit per row".into(), raw_rates),
        ],
    }
    .render()
}

/// A session built by [`turns`] on both sides, kept for [`resume`].
#[derive(Debug, Clone)]
pub struct BuiltSession {
    /// The durable session (its lease released).
    pub id: SessionId,
    /// The raw side's session name.
    pub raw: String,
    /// Its turns.
    pub turns: usize,
}

/// Figure 4: `turns` agent turns (a journaled model reply, two messages pushed, a
/// checkpoint) on one session, in buckets of 100, each bucket followed by 100 raw turns;
/// the median turn's µs of the first and last buckets and their ratio (each bucket's mean
/// is kept in the JSON too). Returns the session (for
/// [`resume`]) and the plot.
pub async fn turns<B: Baseline>(
    report: &mut Report,
    durable: &Durable,
    raw: &B,
    turns: usize,
) -> (BuiltSession, String) {
    const BUCKET: usize = 100;
    // warm-up, on a session of its own
    workload::agent_session(durable, 20).await;
    for turn in 0..20 {
        raw.turn("warm-up", turn).await;
    }
    let mut session = workload::start(durable).await;
    let raw_name = format!("raw-{}", session.id());
    // Each turn is timed on its own and a bucket reports its median turn: on a shared
    // machine one descheduled turn would otherwise move a bucket's mean by its whole stall.
    let (mut durable_us, mut raw_us) = (Vec::new(), Vec::new());
    let (mut durable_mean, mut raw_mean) = (Vec::new(), Vec::new());
    let (mut durable_all, mut raw_all) = (Vec::with_capacity(turns), Vec::with_capacity(turns));
    for bucket in 0..turns.div_ceil(BUCKET) {
        let range = bucket * BUCKET..((bucket + 1) * BUCKET).min(turns);
        let mut each = Vec::with_capacity(BUCKET);
        for turn in range.clone() {
            let started = Instant::now();
            workload::agent_turn(&mut session, turn).await;
            each.push(micros_per(started.elapsed(), 1));
        }
        durable_us.push(crate::median(&each));
        durable_mean.push(each.iter().sum::<f64>() / each.len() as f64);
        durable_all.append(&mut each);
        for turn in range.clone() {
            let started = Instant::now();
            raw.turn(&raw_name, turn).await;
            each.push(micros_per(started.elapsed(), 1));
        }
        raw_us.push(crate::median(&each));
        raw_mean.push(each.iter().sum::<f64>() / each.len() as f64);
        raw_all.append(&mut each);
        if bucket % 20 == 19 {
            eprintln!(
                "  turn {}: {:.0} µs/turn durable, {:.0} raw (bucket medians)",
                range.end, durable_us[bucket], raw_us[bucket]
            );
        }
    }
    let id = session.id().clone();
    session.release().await.expect("release");
    let (first, last) = (0, durable_us.len() - 1);
    report.push(
        Row::new(
            "agent turn, first 100 (median turn)",
            "µs/turn",
            durable_us[first],
            raw_us[first],
        )
        .note("raw: one transaction, the reply into a journal table, both messages into a messages table"),
    );
    report.push(Row::new(
        format!(
            "agent turn, last 100 of {} (median turn)",
            crate::report::number(turns as f64)
        ),
        "µs/turn",
        durable_us[last],
        raw_us[last],
    ));
    report.push(
        Row::new(
            "agent turn, last 100 ÷ first 100",
            "×",
            durable_us[last] / durable_us[first],
            raw_us[last] / raw_us[first],
        )
        .target(Target::at_most(1.10)),
    );
    // The same growth over windows of 1,000 turns: a burst of load on a shared machine
    // can slow a whole bucket of 100, rarely ten of them.
    const WINDOW: usize = 1_000;
    if turns >= 2 * WINDOW {
        let growth =
            |all: &[f64]| crate::median(&all[all.len() - WINDOW..]) / crate::median(&all[..WINDOW]);
        report.push(
            Row::new(
                "agent turn, last 1,000 ÷ first 1,000 (informational)",
                "×",
                growth(&durable_all),
                growth(&raw_all),
            )
            .note("the median turn of each window"),
        );
    }
    let points = |us: &[f64]| -> Vec<(f64, f64)> {
        us.iter()
            .enumerate()
            .map(|(b, &v)| (((b + 1) * BUCKET).min(turns) as f64, v))
            .collect()
    };
    let svg = LineChart {
        title: format!(
            "{}: cost per agent turn over {} turns",
            report.backend,
            crate::report::number(turns as f64)
        ),
        x_label: format!("turn (the median turn of each bucket of {BUCKET})"),
        y_label: "µs per turn".into(),
        log_x: false,
        series: vec![
            Series::new("durable turn", points(&durable_us)),
            Series::new("raw turn", points(&raw_us)),
        ],
    }
    .render();
    report.series.insert(
        "turns".into(),
        json!({
            "bucket": BUCKET,
            "durable_median_us_per_turn": durable_us,
            "raw_median_us_per_turn": raw_us,
            "durable_mean_us_per_turn": durable_mean,
            "raw_mean_us_per_turn": raw_mean,
        }),
    );
    (
        BuiltSession {
            id,
            raw: raw_name,
            turns,
        },
        svg,
    )
}

/// Builds a session of `turns` agent turns on both sides (for [`resume`]).
pub async fn build_session<B: Baseline>(durable: &Durable, raw: &B, turns: usize) -> BuiltSession {
    let id = workload::agent_session(durable, turns).await;
    let raw_name = format!("raw-{id}");
    for turn in 0..turns {
        raw.turn(&raw_name, turn).await;
    }
    BuiltSession {
        id,
        raw: raw_name,
        turns,
    }
}

/// Figures 6 and 7: `Durable::resume` of each session against reading and parsing its
/// messages raw, whole and with a window of [`RESUME_WINDOW`] messages (`resume_window`),
/// and the lease each resume takes, `runs` interleaved runs each, the median. Returns the
/// plots of both figures.
pub async fn resume<B: Baseline>(
    report: &mut Report,
    durable: &Durable,
    raw: &B,
    sessions: &[BuiltSession],
    runs: usize,
    window_ms_target: f64,
) -> (String, String) {
    let windowed = Durable::builder(std::sync::Arc::clone(durable.store()))
        .owner(durable.config().owner.clone())
        .app_version(durable.config().app_version.clone())
        .resume_window(RESUME_WINDOW)
        .build();
    let mut samples = Samples::new();
    let mut commits = 0;
    for _ in 0..runs {
        for s in sessions {
            let took = workload::resume(durable, &s.id, 2 * s.turns).await;
            samples.add(&format!("d{}", s.turns), millis(took));
            let started = Instant::now();
            let messages = raw.read_messages(&s.raw, None).await;
            samples.add(&format!("r{}", s.turns), millis(started.elapsed()));
            assert_eq!(messages.len(), 2 * s.turns, "raw transcript");
            let took = workload::resume(&windowed, &s.id, RESUME_WINDOW).await;
            samples.add(&format!("wd{}", s.turns), millis(took));
            // What a resume must commit before it reads anything: the lease.
            let took = workload::lease(durable, &s.id).await;
            samples.add("lease", millis(took));
            let started = Instant::now();
            raw.one_commit(LEASE_COMMITS + commits).await;
            samples.add("commit", millis(started.elapsed()));
            commits += 1;
            let started = Instant::now();
            let messages = raw.read_messages(&s.raw, Some(RESUME_WINDOW)).await;
            samples.add(&format!("wr{}", s.turns), millis(started.elapsed()));
            assert_eq!(messages.len(), RESUME_WINDOW, "raw window");
        }
    }
    let (mut durable_ms, mut raw_ms) = (Vec::new(), Vec::new());
    for s in sessions {
        let (d, r) = (
            samples.median(&format!("d{}", s.turns)),
            samples.median(&format!("r{}", s.turns)),
        );
        report.push(
            Row::new(
                format!(
                    "resume a {}-turn session",
                    crate::report::number(s.turns as f64)
                ),
                "ms",
                d,
                r,
            )
            .target(Target::ratio_at_most(1.2))
            .note("raw: select the session's messages, parse each into `Message`"),
        );
        durable_ms.push((s.turns as f64, d));
        raw_ms.push((s.turns as f64, r));
    }
    report.push(
        Row::new(
            "of which: taking the lease (informational)",
            "ms",
            samples.median("lease"),
            samples.median("commit"),
        )
        .note("`acquire_lease` alone, which the raw read does not do; raw: one commit"),
    );
    let (mut window_ms, mut raw_window_ms) = (Vec::new(), Vec::new());
    for s in sessions {
        let (d, r) = (
            samples.median(&format!("wd{}", s.turns)),
            samples.median(&format!("wr{}", s.turns)),
        );
        report.push(
            Row::new(
                format!(
                    "resume a {}-turn session, window of {RESUME_WINDOW} messages",
                    crate::report::number(s.turns as f64)
                ),
                "ms",
                d,
                r,
            )
            .target(Target::at_most(window_ms_target))
            .note("`resume_window`; raw: select the last messages, parse each"),
        );
        window_ms.push((s.turns as f64, d));
        raw_window_ms.push((s.turns as f64, r));
    }
    report.series.insert(
        "resume".into(),
        json!({
            "turns": sessions.iter().map(|s| s.turns).collect::<Vec<_>>(),
            "durable_ms": durable_ms.iter().map(|p| p.1).collect::<Vec<_>>(),
            "raw_ms": raw_ms.iter().map(|p| p.1).collect::<Vec<_>>(),
            "window": RESUME_WINDOW,
            "window_ms": window_ms.iter().map(|p| p.1).collect::<Vec<_>>(),
            "raw_window_ms": raw_window_ms.iter().map(|p| p.1).collect::<Vec<_>>(),
        }),
    );
    let whole = LineChart {
        title: format!("{}: resume time against session length", report.backend),
        x_label: "turns in the session (2 messages each; log scale)".into(),
        y_label: "ms to resume (median run)".into(),
        log_x: true,
        series: vec![
            Series::new("Durable::resume", durable_ms),
            Series::new("raw: select + parse", raw_ms),
        ],
    }
    .render();
    let window = LineChart {
        title: format!(
            "{}: resume with a window of {RESUME_WINDOW} messages",
            report.backend
        ),
        x_label: "turns in the session (2 messages each; log scale)".into(),
        y_label: "ms to resume (median run)".into(),
        log_x: true,
        series: vec![
            Series::new("resume_window(20)", window_ms),
            Series::new("raw: last 20", raw_window_ms),
        ],
    }
    .render();
    (whole, window)
}

/// Figure 5's row: bytes the session added to the store and to the raw table, each ÷ the
/// message bytes.
pub fn storage(
    report: &mut Report,
    turns: usize,
    message_bytes: u64,
    durable_bytes: u64,
    raw_bytes: u64,
    target: f64,
    how: &str,
) {
    let per = |b: u64| b as f64 / message_bytes as f64;
    report.push(
        Row::new(
            format!(
                "storage ÷ message bytes, {}-turn session",
                crate::report::number(turns as f64)
            ),
            "×",
            per(durable_bytes),
            per(raw_bytes),
        )
        .target(Target::at_most(target))
        .note(format!(
            "{how}: durable {durable_bytes} B, raw table {raw_bytes} B, messages {message_bytes} B"
        )),
    );
    report.series.insert(
        "storage".into(),
        json!({
            "turns": turns,
            "message_bytes": message_bytes,
            "durable_bytes": durable_bytes,
            "raw_bytes": raw_bytes,
        }),
    );
}

fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Writes the report as `<backend>.json` and each `(name, svg)` as `<backend>-<name>.svg`
/// into `dir`, and prints the Markdown table and the paths.
pub fn write(report: &Report, dir: &std::path::Path, svgs: &[(&str, String)]) {
    let path = report.write_json(dir).expect("write the JSON report");
    println!("\n{}", report.markdown());
    println!("wrote {}", path.display());
    for (name, svg) in svgs {
        let path = dir.join(format!("{}-{name}.svg", report.backend));
        std::fs::write(&path, svg).expect("write an SVG");
        println!("wrote {}", path.display());
    }
}

/// A reply streamed as text deltas, for [`stream`].
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
struct StreamedText {
    text: String,
}

impl durable_core::journal::StreamedReply for StreamedText {
    type Chunk = String;

    fn push(&mut self, delta: &String) {
        self.text.push_str(delta);
    }

    fn replay(&self) -> Vec<String> {
        vec![self.text.clone()]
    }
}

/// A streamed model reply through [`Session::model_stream`] against the same
/// chunks iterated raw, `replies` replies of `chunks` chunks each in `rounds` rounds:
/// what the journal adds before the first chunk (target ≤ 1 ms) and per chunk (nothing
/// measurable: ≤ 1 µs), and what journaling the assembled reply at the end costs
/// against one raw commit.
///
/// [`Session::model_stream`]: durable_core::Session::model_stream
pub async fn stream<B: Baseline>(
    report: &mut Report,
    durable: &Durable,
    raw: &B,
    replies: usize,
    chunks: usize,
    rounds: usize,
) {
    use durable_core::journal::ReplyEvent;
    use futures_util::StreamExt;

    let deltas: Vec<String> = (0..chunks).map(|n| format!("token {n} ")).collect();
    let per_round = replies.div_ceil(rounds).max(1);
    let mut session = workload::start(durable).await;
    let mut samples = Samples::new();
    let mut n = 3_000_000_000u64;
    for _ in 0..rounds {
        let (mut raw_first, mut raw_chunks, mut raw_end) = (0.0, 0.0, 0.0);
        let (mut first, mut per_chunk, mut end) = (0.0, 0.0, 0.0);
        for _ in 0..per_round {
            // Raw: the same chunks, iterated, then one commit.
            let opened = Instant::now();
            let mut chunks_raw = futures_util::stream::iter(deltas.clone());
            let mut text = String::new();
            let got = chunks_raw.next().await.expect("a first chunk");
            raw_first += opened.elapsed().as_secs_f64();
            text.push_str(&got);
            let started = Instant::now();
            while let Some(delta) = chunks_raw.next().await {
                text.push_str(&delta);
            }
            raw_chunks += started.elapsed().as_secs_f64();
            let ended = Instant::now();
            n += 1;
            raw.one_commit(n).await;
            raw_end += ended.elapsed().as_secs_f64();

            // Durable: the same chunks through the journal.
            let opened = Instant::now();
            let source = deltas.clone();
            let mut reply = session
                .model_stream::<StreamedText, String, _, _>(|| {
                    futures_util::stream::iter(source.into_iter().map(Ok))
                })
                .await
                .expect("open the streamed reply");
            let event = reply.next().await.expect("a first event");
            first += opened.elapsed().as_secs_f64();
            assert!(matches!(event, Ok(ReplyEvent::Chunk(_))), "a chunk first");
            let started = Instant::now();
            let mut last = None;
            for _ in 1..chunks {
                last = reply.next().await;
            }
            per_chunk += started.elapsed().as_secs_f64();
            assert!(matches!(last, Some(Ok(ReplyEvent::Chunk(_)))), "{last:?}");
            let ended = Instant::now();
            let journaled = reply.next().await;
            end += ended.elapsed().as_secs_f64();
            assert!(
                matches!(journaled, Some(Ok(ReplyEvent::Reply(_)))),
                "{journaled:?}"
            );
            drop(reply);
            // A fresh step for the next reply (not timed).
            session.checkpoint().await.expect("checkpoint");
        }
        let per = per_round as f64;
        let per_chunks = per * (chunks.saturating_sub(1).max(1)) as f64;
        samples.add("first", first / per * 1e6);
        samples.add("raw_first", raw_first / per * 1e6);
        samples.add("chunk", per_chunk / per_chunks * 1e6);
        samples.add("raw_chunk", raw_chunks / per_chunks * 1e6);
        samples.add("end", end / per * 1e6);
        samples.add("raw_end", raw_end / per * 1e6);
    }
    session.release().await.expect("release");
    let added_first = samples.median("first") - samples.median("raw_first");
    report.push(
        Row::new(
            "streamed reply: added before the first chunk",
            "µs",
            added_first,
            samples.median("raw_first"),
        )
        .target(Target::at_most(1_000.0))
        .note("durable: µs added to opening the stream and pulling its first chunk; raw: the same in-process stream"),
    );
    let added_chunk = samples.median("chunk") - samples.median("raw_chunk");
    report.push(
        Row::new(
            "streamed reply: added per chunk",
            "µs",
            added_chunk,
            samples.median("raw_chunk"),
        )
        .target(Target::at_most(1.0))
        .note(format!(
            "{chunks} chunks per reply, the same chunks iterated raw"
        )),
    );
    report.push(
        Row::new(
            "streamed reply: journaled at its end",
            "µs",
            samples.median("end"),
            samples.median("raw_end"),
        )
        .target(Target::ratio_at_most(1.10))
        .note("durable: the last pull (the assembled reply journaled); raw: one commit"),
    );
}
