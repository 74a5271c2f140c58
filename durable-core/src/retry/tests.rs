//! Unit tests of the parent module.

use super::*;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[test]
fn default_delays_double_and_cap() {
    let p = RetryPolicy::default().with_jitter(false);
    let got: Vec<_> = (0..8).map(|a| p.delay_for(a)).collect();
    assert_eq!(
        got,
        [
            ms(500),
            ms(1000),
            ms(2000),
            ms(4000),
            ms(8000),
            ms(16000),
            ms(30000),
            ms(30000)
        ]
    );
    assert_eq!(p.delay_for(u32::MAX), ms(30000));
}

#[test]
fn delays_are_exact_for_any_base_and_never_pass_the_cap() {
    let p = RetryPolicy::default()
        .with_jitter(false)
        .with_base_delay(Duration::from_nanos(300_000_001))
        .with_max_delay(ms(5000));
    let got: Vec<_> = (0..6).map(|a| p.delay_for(a).as_nanos()).collect();
    assert_eq!(
        got,
        [
            300_000_001,
            600_000_002,
            1_200_000_004,
            2_400_000_008,
            4_800_000_016,
            5_000_000_000
        ]
    );
    // No cap below Duration::MAX: saturates instead of overflowing.
    let p = RetryPolicy::default()
        .with_jitter(false)
        .with_max_delay(Duration::MAX);
    assert_eq!(p.delay_for(u32::MAX), Duration::MAX);
    // A base above the cap starts at the cap; a zero base never waits.
    let p = RetryPolicy::default()
        .with_jitter(false)
        .with_base_delay(ms(9000))
        .with_max_delay(ms(1000));
    assert_eq!(p.delay_for(0), ms(1000));
    let p = RetryPolicy::default()
        .with_jitter(false)
        .with_base_delay(Duration::ZERO);
    assert_eq!(p.delay_for(3), Duration::ZERO);
}

#[test]
fn jitter_stays_within_half_to_full_delay_and_varies() {
    let p = RetryPolicy::default();
    for attempt in [0, 3, 10] {
        let base = p.base_delay_for(attempt);
        let samples: Vec<_> = (0..200).map(|_| p.delay_for(attempt)).collect();
        for d in &samples {
            assert!(
                *d >= base / 2 && *d <= base,
                "attempt {attempt}: {d:?} vs {base:?}"
            );
        }
        assert!(samples.iter().any(|d| *d != samples[0]), "jitter is random");
    }
    assert_eq!(jittered(ms(1000), 0.0), ms(500));
    assert_eq!(jittered(ms(1000), 1.0), ms(1000));
    assert_eq!(jittered(ms(1000), 0.5), ms(750));
    assert_eq!(jittered(ms(1000), 7.0), ms(1000));
    assert_eq!(jittered(ms(1000), -1.0), ms(500));
    assert_eq!(jittered(ms(1000), f64::NAN), ms(1000));
    for _ in 0..1000 {
        let u = random_unit();
        assert!((0.0..1.0).contains(&u));
    }
}

#[test]
fn after_failure_counts_total_attempts() {
    let p = RetryPolicy::default(); // 4 attempts
    assert_eq!(p.after_failure(0, true), AfterFailure::Retry { attempt: 1 });
    assert_eq!(p.after_failure(2, true), AfterFailure::Retry { attempt: 3 });
    assert_eq!(
        p.after_failure(3, true),
        AfterFailure::Exhausted { attempts: 4 }
    );
    // Past the budget (e.g. the policy shrank between processes): still exhausted.
    assert_eq!(
        p.after_failure(9, true),
        AfterFailure::Exhausted { attempts: 10 }
    );
    assert_eq!(p.after_failure(0, false), AfterFailure::NotRetryable);
    for max in [0, 1] {
        let p = RetryPolicy::default().with_max_attempts(max);
        assert_eq!(
            p.after_failure(0, true),
            AfterFailure::Exhausted { attempts: 1 }
        );
    }
    assert_eq!(RetryPolicy::no_retry().effective_max_attempts(), 1);
}

fn err(step: i64, context: &str, attempt: i32, message: &str) -> ErrorRecord {
    ErrorRecord {
        session: SessionId::new("s"),
        step,
        context: context.to_owned(),
        attempt,
        message: message.to_owned(),
        at: 0,
    }
}

#[test]
fn history_continues_after_the_highest_attempt_of_the_same_step_and_context() {
    assert_eq!(
        AttemptHistory::from_errors(&[], 1, "model#0"),
        AttemptHistory::default()
    );
    let rows = [
        err(1, "model#0", 0, "503"),
        err(1, "model#1", 5, "other context"),
        err(2, "model#0", 7, "other step"),
        err(1, "model#0", 2, "429"), // attempt 1 was never recorded: gaps are not reused
        err(1, "model#0", -3, "foreign row"),
    ];
    assert_eq!(
        AttemptHistory::from_errors(&rows, 1, "model#0"),
        AttemptHistory {
            next_attempt: 3,
            last_message: Some("429".into())
        }
    );
    assert_eq!(
        AttemptHistory::from_errors(&rows, 3, "model#0").next_attempt,
        0
    );
    let tie = [err(1, "c", 1, "first"), err(1, "c", 1, "second")];
    assert_eq!(
        AttemptHistory::from_errors(&tie, 1, "c")
            .last_message
            .as_deref(),
        Some("second")
    );
    let huge = [err(1, "c", i32::MAX, "x")];
    assert_eq!(
        AttemptHistory::from_errors(&huge, 1, "c").next_attempt,
        1u32 << 31
    );
}

#[test]
fn a_resumed_budget_runs_only_the_remaining_attempts() {
    // Two attempts recorded by a crashed process, policy of 4: attempts 2 and 3 remain.
    let p = RetryPolicy::default();
    let rows = [err(4, "model#0", 0, "503"), err(4, "model#0", 1, "503")];
    let mut attempt = AttemptHistory::from_errors(&rows, 4, "model#0").next_attempt;
    let mut ran = vec![];
    loop {
        ran.push(attempt);
        match p.after_failure(attempt, true) {
            AfterFailure::Retry { attempt: next } => attempt = next,
            other => {
                assert_eq!(other, AfterFailure::Exhausted { attempts: 4 });
                break;
            }
        }
    }
    assert_eq!(ran, [2, 3]);
}

#[test]
fn policy_json_is_pinned_partial_and_strict() {
    let json = serde_json::to_string(&RetryPolicy::default()).expect("serialize");
    assert_eq!(
        json,
        r#"{"max_attempts":4,"base_delay_ms":500,"max_delay_ms":30000,"jitter":true}"#
    );
    let partial: RetryPolicy =
        serde_json::from_str(r#"{"max_attempts":2}"#).expect("partial config");
    assert_eq!(partial, RetryPolicy::default().with_max_attempts(2));
    assert!(serde_json::from_str::<RetryPolicy>(r#"{"max_attempt":2}"#).is_err());
    assert!(serde_json::from_str::<RetryPolicy>(r#"{"base_delay_ms":-1}"#).is_err());
}

#[test]
fn errors_read_well() {
    let e: RetryError<String> = RetryError::Exhausted {
        attempts: 4,
        last: "HTTP 503".into(),
    };
    assert_eq!(e.to_string(), "gave up after 4 attempts: HTTP 503");
    assert_eq!(e.last_error().map(String::as_str), Some("HTTP 503"));
    let e: RetryError<String> = RetryError::AlreadyExhausted {
        attempts: 4,
        last_message: "HTTP 429".into(),
    };
    assert!(
        e.to_string()
            .starts_with("retry budget already spent: 4 attempts"),
        "{e}"
    );
    assert_eq!(e.last_error(), None);
}

#[test]
fn long_messages_are_truncated_at_a_char_boundary() {
    let short = "x".repeat(10);
    assert_eq!(truncate_message(short.clone()), short);
    let long = "é".repeat(MAX_RECORDED_MESSAGE_LEN); // 2 bytes each
    let cut = truncate_message(format!("a{long}"));
    assert!(cut.ends_with("… (truncated)"));
    assert!(cut.len() <= MAX_RECORDED_MESSAGE_LEN + "… (truncated)".len());
}
