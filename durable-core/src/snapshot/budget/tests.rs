//! Unit tests of `Budget` and `Spend`.

use super::*;
use crate::store::limit::format_usd;

fn spend(usd: f64, input: u64, output: u64) -> Spend {
    Spend::new(usd, input, output).expect("valid spend")
}

#[test]
fn spend_refuses_amounts_that_cannot_be_counted() {
    assert_eq!(
        Spend::new(f64::NAN, 0, 0).map_err(|e| matches!(e, InvalidAmount::NotFinite(_))),
        Err(true)
    );
    assert_eq!(
        Spend::new(f64::INFINITY, 0, 0),
        Err(InvalidAmount::NotFinite(f64::INFINITY))
    );
    assert_eq!(
        Spend::new(f64::NEG_INFINITY, 0, 0),
        Err(InvalidAmount::NotFinite(f64::NEG_INFINITY))
    );
    assert_eq!(
        Spend::new(-0.000_001, 0, 0),
        Err(InvalidAmount::Negative(-0.000_001))
    );
    assert_eq!(Spend::new(2e10, 0, 0), Err(InvalidAmount::TooLarge(2e10)));
    assert_eq!(Spend::new(-0.0, 0, 0), Ok(Spend::ZERO));
    assert_eq!(
        spend(18_000_000_000.0, 0, 0).nano_usd(),
        18_000_000_000 * NANO_USD_PER_USD
    );
    // Sub-micro-dollar prices survive.
    assert_eq!(spend(0.000_000_02, 1, 0).nano_usd(), 20);
    assert!(
        Spend::new(f64::NAN, 0, 0)
            .expect_err("nan")
            .to_string()
            .contains("not a finite number")
    );
}

#[test]
fn charging_accumulates_and_limits_trip_at_the_limit() {
    let mut b = Budget::unlimited()
        .with_limit_usd(1.0)
        .expect("limit")
        .with_limit_tokens(1000);
    assert_eq!(b.check(), Ok(()));
    b.charge(&spend(0.25, 300, 100));
    b.charge(&spend(0.5, 200, 100));
    assert_eq!(b.spent_nano_usd, 750_000_000);
    assert_eq!(
        (b.input_tokens, b.output_tokens, b.total_tokens()),
        (500, 200, 700)
    );
    assert_eq!(b.spent_usd(), 0.75);
    assert_eq!(b.remaining_usd(), Some(0.25));
    assert_eq!(b.remaining_tokens(), Some(300));
    assert!(!b.is_exhausted());

    b.charge(&Spend::from_nano_usd(0, 250, 50));
    assert_eq!(
        b.check(),
        Err(BudgetExceeded {
            session: None,
            limit: Limit::Tokens,
            ceiling: 1000,
            spent: 1000,
            asked: None,
        })
    );
    b.charge(&spend(0.3, 0, 0));
    // Money is reported first, and spend past the limit is still recorded.
    assert_eq!(
        b.check(),
        Err(BudgetExceeded {
            session: None,
            limit: Limit::Usd,
            ceiling: 1_000_000_000,
            spent: 1_050_000_000,
            asked: None,
        })
    );
    assert_eq!(b.remaining_usd(), Some(0.0));
    assert_eq!(
        b.check().expect_err("exhausted").to_string(),
        "budget exceeded: $1.05 spent of the $1.00 dollar ceiling; nothing ran. Raise the limit or end the session"
    );
}

#[test]
fn float_sums_that_drift_reach_the_limit_exactly() {
    // 0.1 + 0.2 > 0.3 in f64; in nano-dollars it is exactly the limit.
    let mut b = Budget::unlimited().with_limit_usd(0.3).expect("limit");
    b.charge(&spend(0.1, 0, 0));
    b.charge(&spend(0.2, 0, 0));
    assert_eq!(b.remaining_nano_usd(), Some(0));
    assert_eq!(b.spent_nano_usd, b.limit_nano_usd.expect("limit"));
}

#[test]
fn unlimited_and_zero_limits() {
    let mut b = Budget::unlimited();
    b.charge(&Spend::from_nano_usd(u64::MAX, u64::MAX, 1));
    b.charge(&Spend::from_nano_usd(1, 1, 1));
    assert_eq!(b.spent_nano_usd, u64::MAX, "saturates, never wraps");
    assert_eq!(b.remaining_usd(), None);
    assert_eq!(b.check(), Ok(()));
    assert!(Budget::unlimited().with_limit_tokens(0).is_exhausted());
    assert!(Budget::unlimited().with_limit_nano_usd(0).is_exhausted());
}

#[test]
fn json_is_pinned_and_byte_stable_across_a_checkpoint_round_trip() {
    let spends = [
        spend(0.001_234_567, 1500, 230),
        spend(0.1, 20, 5),
        spend(0.2, 7, 0),
        spend(0.000_000_015, 1, 1),
    ];
    // Crash-free: charge everything in one process.
    let mut straight = Budget::unlimited().with_limit_usd(2.5).expect("limit");
    for s in &spends {
        straight.charge(s);
    }
    // Replayed: checkpoint after two spends, restore from JSON, charge the rest as
    // read back from journal-row JSON.
    let mut first = Budget::unlimited().with_limit_usd(2.5).expect("limit");
    first.charge(&spends[0]);
    first.charge(&spends[1]);
    let snapshot = serde_json::to_string(&first).expect("serialize");
    let mut resumed: Budget = serde_json::from_str(&snapshot).expect("deserialize");
    for s in &spends[2..] {
        let row = serde_json::to_string(s).expect("serialize spend");
        resumed.charge(&serde_json::from_str::<Spend>(&row).expect("deserialize spend"));
    }
    let a = serde_json::to_string(&straight).expect("serialize");
    let b = serde_json::to_string(&resumed).expect("serialize");
    assert_eq!(a, b);
    assert_eq!(
        a,
        r#"{"spent_nano_usd":301234582,"input_tokens":1528,"output_tokens":236,"limit_nano_usd":2500000000,"limit_tokens":null}"#
    );
    assert_eq!(
        serde_json::to_string(&spends[0]).expect("serialize"),
        r#"{"nano_usd":1234567,"input_tokens":1500,"output_tokens":230}"#
    );
}

#[test]
fn stored_json_with_floats_or_negatives_is_refused() {
    for bad in [
        r#"{"spent_nano_usd":1.5,"input_tokens":0,"output_tokens":0}"#,
        r#"{"spent_nano_usd":-1,"input_tokens":0,"output_tokens":0}"#,
        r#"{"spent_usd":0.5,"input_tokens":0,"output_tokens":0}"#,
    ] {
        assert!(serde_json::from_str::<Budget>(bad).is_err(), "{bad}");
    }
    assert!(
        serde_json::from_str::<Spend>(r#"{"nano_usd":-5,"input_tokens":0,"output_tokens":0}"#)
            .is_err()
    );
}

#[test]
fn a_budget_written_before_the_new_ceilings_loads_with_none() {
    let old = r#"{"spent_nano_usd":5,"input_tokens":1,"output_tokens":2,"limit_nano_usd":null,"limit_tokens":9}"#;
    let b: Budget = serde_json::from_str(old).expect("old budget");
    assert_eq!(
        (b.model_calls, b.tool_calls, b.limit_model_calls),
        (0, 0, None)
    );
    assert!(b.limit_per_tool.is_empty() && b.tool_counts.is_empty());
    assert_eq!(b.limit_tokens, Some(9));
    // Unused, the new fields are not written: the JSON is as before.
    assert_eq!(
        serde_json::to_string(&b).expect("json"),
        r#"{"spent_nano_usd":5,"input_tokens":1,"output_tokens":2,"limit_nano_usd":null,"limit_tokens":9}"#
    );
}

#[test]
fn counts_and_ceilings_round_trip_and_bind_before_the_call() {
    let mut b = Budget::unlimited()
        .with_limit_model_calls(1)
        .with_limit_tool_calls(2)
        .with_limit_tool("send", 1)
        .with_limit_wall_time(std::time::Duration::from_secs(60));
    assert_eq!(b.check_call(Ask::Model, 0), Ok(()));
    b.count_call(Ask::Model);
    let refused = b.check_call(Ask::Model, 0).expect_err("model ceiling");
    assert_eq!(
        (refused.limit, refused.ceiling, refused.spent, refused.asked),
        (Limit::ModelCalls, 1, 1, Some(1))
    );
    b.count_call(Ask::Tool("send"));
    assert_eq!(
        b.check_call(Ask::Tool("send"), 0).map_err(|e| e.limit),
        Err(Limit::Tool("send".into()))
    );
    assert_eq!(b.check_call(Ask::Tool("read"), 0), Ok(()));
    b.count_call(Ask::Tool("read"));
    assert_eq!(
        b.check_call(Ask::Tool("read"), 0).map_err(|e| e.limit),
        Err(Limit::ToolCalls)
    );
    assert_eq!(
        b.check_call(Ask::Model, 60_000).map_err(|e| e.limit),
        Err(Limit::ModelCalls),
        "money, tokens and counts come before the clock"
    );
    let fresh = Budget::unlimited().with_limit_wall_time(std::time::Duration::from_secs(60));
    let late = fresh.check_call(Ask::Model, 60_000).expect_err("wall time");
    assert_eq!(
        (late.limit, late.spent, late.asked),
        (Limit::WallTime, 60_000, None)
    );
    assert_eq!(fresh.check_call(Ask::Model, 59_999), Ok(()));
    let json = serde_json::to_string(&b).expect("json");
    assert_eq!(serde_json::from_str::<Budget>(&json).expect("back"), b);
    assert_eq!(
        b.ceilings(5)
            .iter()
            .map(|c| (c.limit.to_string(), c.spent, c.ceiling))
            .collect::<Vec<_>>(),
        [
            ("model_calls".to_owned(), 1, 1),
            ("tool_calls".to_owned(), 2, 2),
            ("wall_time".to_owned(), 5, 60_000),
            ("tool:send".to_owned(), 1, 1),
        ]
    );
}

#[test]
fn a_raise_never_lowers_and_defaults_fill_only_unset_ceilings() {
    let mut b = Budget::unlimited().with_limit_model_calls(5);
    assert!(!b.raise(&Limit::ModelCalls, 3), "never lowers");
    assert!(b.raise(&Limit::ModelCalls, 8));
    assert!(
        !b.raise(&Limit::Usd, 1),
        "an unlimited ceiling stays unlimited"
    );
    assert_eq!((b.limit_model_calls, b.limit_nano_usd), (Some(8), None));
    let defaults = Budget::unlimited()
        .with_limit_model_calls(1)
        .with_limit_tokens(100)
        .with_limit_tool("send", 2);
    let mut spent = Budget::unlimited().with_limit_model_calls(8);
    spent.charge(&spend(1.0, 1, 1));
    let merged = spent.clone().with_defaults(&defaults);
    assert_eq!(merged.limit_model_calls, Some(8), "the session's own wins");
    assert_eq!(merged.limit_tokens, Some(100));
    assert_eq!(merged.limit(&Limit::Tool("send".into())), Some(2));
    assert_eq!(merged.spent_nano_usd, spent.spent_nano_usd, "spend is kept");
}

#[test]
fn limits_read_and_write_as_text() {
    for limit in [
        Limit::Usd,
        Limit::Tokens,
        Limit::ModelCalls,
        Limit::ToolCalls,
        Limit::WallTime,
        Limit::Tool("send_email".into()),
    ] {
        assert_eq!(limit.to_string().parse::<Limit>(), Ok(limit.clone()));
        let json = serde_json::to_value(&limit).expect("json");
        assert_eq!(serde_json::from_value::<Limit>(json).expect("back"), limit);
    }
    assert!("tool:".parse::<Limit>().is_err());
    assert!("dollars".parse::<Limit>().is_err());
    assert_eq!(Limit::Usd.parse_amount("$2.50"), Ok(2_500_000_000));
    assert!(Limit::Usd.parse_amount("-1").is_err());
    assert!(Limit::Usd.parse_amount("NaN").is_err());
    assert_eq!(Limit::WallTime.parse_amount("15m"), Ok(900_000));
    assert_eq!(Limit::WallTime.parse_amount("2h"), Ok(7_200_000));
    assert_eq!(Limit::WallTime.parse_amount("5000ms"), Ok(5_000));
    assert_eq!(Limit::WallTime.parse_amount("90"), Ok(90_000));
    assert!(Limit::WallTime.parse_amount("soon").is_err());
    assert!(Limit::WallTime.parse_amount("99999999999999999h").is_err());
    assert!(Limit::ModelCalls.parse_amount("1.5").is_err());
    assert_eq!(Limit::WallTime.format_amount(90_000), "90s");
}

#[test]
fn usd_formatting_is_exact() {
    assert_eq!(format_usd(0), "$0.00");
    assert_eq!(format_usd(1_500_000), "$0.0015");
    assert_eq!(format_usd(5 * NANO_USD_PER_USD), "$5.00");
    assert_eq!(format_usd(1), "$0.000000001");
    assert_eq!(format_usd(12_340_000_000), "$12.34");
}
