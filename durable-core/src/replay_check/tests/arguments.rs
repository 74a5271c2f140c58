//! The argument verdict: serde decides (aliases included), a masked secret gets a
//! placeholder, a tool that does not decode falls back to its schema; and over a family
//! of argument-struct mutations and generated values, the verdict is serde's.

use std::marker::PhantomData;
use std::net::IpAddr;

use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::canonical;
use crate::error::DurableError;
use crate::ids::{CallId, SessionId};
use crate::journal::Journal;
use crate::macro_support::{args_schema, decode_args};
use crate::replay::ReplayClass;
use crate::replay_check::{
    FIXTURE_FORMAT, FailureKind, Fixture, FixtureCall, ReplayCheckReport, check_fixtures,
};
use crate::store::{CallKind, CallStatus};
use crate::tool_spec::ToolSpec;
use crate::toolbox::BoxFuture;
use crate::toolbox::Toolbox;
use crate::toolbox::{Tool, ToolOutput};

/// A tool over argument type `A` whose `check_args` decodes, as `#[durable_tool]`
/// generates it; or, with `decodes: false`, a hand-written tool keeping the default.
struct Typed<A> {
    spec: ToolSpec,
    decodes: bool,
    args: PhantomData<fn() -> A>,
}

fn typed<A: JsonSchema>(secret: &[&str]) -> Typed<A> {
    Typed {
        spec: ToolSpec::new(
            "notify",
            "Notify.",
            ReplayClass::UnsafeOnReplay,
            args_schema::<A>(),
        )
        .with_secret_args(secret.iter().copied()),
        decodes: true,
        args: PhantomData,
    }
}

impl<A: DeserializeOwned + 'static> Tool for Typed<A> {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn invoke<'a>(
        &'a self,
        _journal: &'a Journal,
        _args: Value,
    ) -> BoxFuture<'a, Result<ToolOutput, DurableError>> {
        Box::pin(async { unreachable!("not run in these tests") })
    }

    fn check_args(&self, args: &Value) -> Result<(), DurableError> {
        if self.decodes {
            decode_args::<A>(&self.spec, args).map(drop)
        } else {
            Ok(())
        }
    }
}

/// Checks one completed call of `tool` recorded with `args` (a masked argument's clear
/// value is not known, so its hash is not checked anyway).
fn check(tool: impl Tool, args: Value) -> ReplayCheckReport {
    let toolbox = Toolbox::new().with(tool).expect("register");
    let spec = toolbox.get("notify").expect("registered").spec().clone();
    let call = FixtureCall {
        id: CallId::new("c1"),
        kind: CallKind::Tool,
        step: 1,
        tool: "notify".into(),
        input_hash: canonical::input_hash(&args).expect("hash"),
        ordinal: 0,
        class: ReplayClass::UnsafeOnReplay,
        status: CallStatus::Completed,
        args,
        idempotency_key: None,
        schema_hash: spec.fingerprint,
        result: Some(json!("sent")),
        error: None,
        spend: None,
        attempt: 1,
        issued_at: 1,
        finished_at: Some(2),
    };
    let fixture = Fixture {
        format: FIXTURE_FORMAT,
        durable: "test".into(),
        session: SessionId::new("s1"),
        version: 1,
        app_version: "v1".into(),
        created_at: 0,
        messages: vec![],
        plan: Value::Null,
        budget: Value::Null,
        state: Value::Null,
        calls: vec![call],
        path: None,
    };
    check_fixtures(&toolbox, &[fixture])
}

fn masked() -> Value {
    json!({"$secret": "v1:0123"})
}

fn kinds(report: &ReplayCheckReport) -> Vec<&FailureKind> {
    report.failures.iter().map(|f| &f.kind).collect()
}

/// The argument struct the calls were recorded with.
#[derive(Serialize, Deserialize, JsonSchema)]
struct Recorded {
    to: String,
    subject: Option<String>,
    priority: u8,
}

/// Today's argument structs: each a mutation of [`Recorded`].
mod today {
    use schemars::JsonSchema;
    use serde::{Deserialize, Serialize};

    macro_rules! args {
        ($($(#[$meta:meta])* $name:ident { $($(#[$field_meta:meta])* $field:ident: $ty:ty),* $(,)? })*) => {$(
            #[derive(Serialize, Deserialize, JsonSchema)]
            $(#[$meta])*
            pub struct $name { $($(#[$field_meta])* pub $field: $ty),* }
        )*};
    }

    args! {
        Unchanged { to: String, subject: Option<String>, priority: u8 }
        RenamedWithAlias { #[serde(alias = "to")] recipient: String, subject: Option<String>, priority: u8 }
        Renamed { recipient: String, subject: Option<String>, priority: u8 }
        #[serde(deny_unknown_fields)]
        RenamedStrict { recipient: String, subject: Option<String>, priority: u8 }
        #[serde(deny_unknown_fields)]
        RenamedStrictWithAlias { #[serde(alias = "to")] recipient: String, subject: Option<String>, priority: u8 }
        AddedOptional { to: String, subject: Option<String>, priority: u8, cc: Option<String> }
        AddedDefaulted { to: String, subject: Option<String>, priority: u8, #[serde(default)] retries: u32 }
        AddedRequired { to: String, subject: Option<String>, priority: u8, cc: String }
        Removed { to: String, priority: u8 }
        #[serde(deny_unknown_fields)]
        RemovedStrict { to: String, priority: u8 }
        Retyped { to: String, subject: Option<String>, priority: String }
        Narrowed { to: String, subject: Option<String>, priority: i8 }
        MadeRequired { to: String, subject: String, priority: u8 }
    }
}

#[test]
fn a_field_renamed_with_a_serde_alias_still_fits() {
    // The schema cannot see the alias: it asks for `recipient` and knows no `to`.
    let schema = args_schema::<today::RenamedWithAlias>();
    assert_eq!(
        schema["required"],
        json!(["recipient", "priority"]),
        "{schema}"
    );
    assert!(schema["properties"].get("to").is_none(), "{schema}");

    let args = json!({"to": "ann@example.com", "subject": "hi", "priority": 1});
    let report = check(typed::<today::RenamedWithAlias>(&[]), args.clone());
    report.assert_ok();
    // What the schema said is kept as a note.
    match report.notes.as_slice() {
        [note] => assert!(
            note.detail
                .contains("missing required argument `recipient`")
                && note.detail.contains("`#[serde(alias)]`"),
            "{note}"
        ),
        other => panic!("expected one note, got {other:?}"),
    }
    assert!(
        report
            .to_string()
            .contains("\n  note: session `s1` version 1 call `c1`")
    );
    check(typed::<today::RenamedStrictWithAlias>(&[]), args).assert_ok();
}

#[test]
fn a_field_renamed_without_an_alias_names_both_ways_out() {
    let args = json!({"to": "ann@example.com", "priority": 1});
    for report in [
        check(typed::<today::Renamed>(&[]), args.clone()),
        // `deny_unknown_fields`: serde names `to` as unknown rather than `recipient` as missing.
        check(typed::<today::RenamedStrict>(&[]), args.clone()),
    ] {
        match kinds(&report).as_slice() {
            [
                FailureKind::ArgumentRenamed {
                    missing, unread, ..
                },
            ] => {
                assert_eq!(
                    (missing.as_slice(), unread.as_slice()),
                    (&["recipient".to_owned()][..], &["to".to_owned()][..])
                );
            }
            other => panic!("expected ArgumentRenamed, got {other:?}"),
        }
        let text = report.to_string();
        assert!(
            text.contains("the recorded arguments lack `recipient` and hold `to`")
                && text.contains(
                    "if `to` was renamed to `recipient`, keep reading the old name with `#[serde(alias = \"to\")]` on `recipient`, or retarget the sessions recorded with the old name (`durable retarget`)"
                ),
            "{text}"
        );
    }
}

#[test]
fn a_masked_secret_is_decoded_with_a_placeholder_in_its_place() {
    // The other arguments are still decoded: a narrowed `priority` is caught although
    // `to` is masked (the schema's `integer` would have let 200 through).
    let report = check(
        typed::<today::Narrowed>(&["to"]),
        json!({"to": masked(), "priority": 200}),
    );
    match kinds(&report).as_slice() {
        [FailureKind::ArgumentsRejected(detail)] => {
            assert!(detail.starts_with("at `$.priority`:"), "{detail}");
        }
        other => panic!("expected ArgumentsRejected, got {other:?}"),
    }
    assert_eq!(report.calls_with_secrets, 1);

    // A masked argument recorded under a name today's type reads through an alias.
    check(
        typed::<today::RenamedWithAlias>(&["recipient"]),
        json!({"to": masked(), "priority": 1}),
    )
    .assert_ok();
    // Renamed without one, it is the rename that is reported (also where serde refuses
    // the old name as unknown, at its key).
    for report in [
        check(
            typed::<today::Renamed>(&["recipient"]),
            json!({"to": masked(), "priority": 1}),
        ),
        check(
            typed::<today::RenamedStrict>(&["recipient"]),
            json!({"to": masked(), "priority": 1}),
        ),
    ] {
        assert!(
            matches!(
                kinds(&report).as_slice(),
                [FailureKind::ArgumentRenamed { .. }]
            ),
            "{report}"
        );
    }

    // A structured secret: the placeholder is built from today's schema.
    #[derive(Serialize, Deserialize, JsonSchema)]
    struct Credentials {
        key: String,
        scope: u8,
        region: Option<String>,
    }
    #[derive(Serialize, Deserialize, JsonSchema)]
    struct Login {
        user: String,
        credentials: Credentials,
    }
    let report = check(
        typed::<Login>(&["credentials"]),
        json!({"user": "ann", "credentials": masked()}),
    );
    report.assert_ok();
    assert!(report.notes.is_empty(), "{report}");
    let report = check(
        typed::<Login>(&["credentials"]),
        json!({"user": 7, "credentials": masked()}),
    );
    assert!(
        matches!(kinds(&report).as_slice(), [FailureKind::ArgumentsRejected(d)] if d.starts_with("at `$.user`")),
        "{report}"
    );

    // A secret no placeholder stands in for (an address must parse): the schema decides,
    // and the report says so.
    #[derive(Serialize, Deserialize, JsonSchema)]
    struct Connect {
        host: IpAddr,
        port: u16,
    }
    let report = check(
        typed::<Connect>(&["host"]),
        json!({"host": masked(), "port": 5432}),
    );
    report.assert_ok();
    assert!(
        matches!(report.notes.as_slice(), [note] if note.detail.contains("masked secret `host` cannot be stood in for")),
        "{report}"
    );
    let report = check(typed::<Connect>(&["host"]), json!({"host": masked()}));
    assert!(
        matches!(kinds(&report).as_slice(), [FailureKind::ArgumentsRejected(d)] if d.contains("missing required argument `port`")),
        "{report}"
    );
}

#[test]
fn a_tool_that_does_not_decode_is_checked_against_its_schema() {
    let undecoded = || Typed::<today::RenamedStrict> {
        decodes: false,
        ..typed(&[])
    };
    let cases = [
        (
            json!({"subject": "x", "priority": 1}),
            "at `$`: missing required argument `recipient`",
        ),
        (
            json!({"recipient": "a", "priority": 1, "cc": "b"}),
            "at `$`: unknown argument `cc`",
        ),
        (
            json!({"recipient": 5, "priority": 1}),
            "at `$.recipient`: the schema expects `string`, found number",
        ),
    ];
    for (args, expected) in cases {
        let report = check(undecoded(), args.clone());
        match kinds(&report).as_slice() {
            [FailureKind::ArgumentsRejected(detail)] => {
                assert!(detail.contains(expected), "{args}: {detail}");
            }
            other => panic!("{args}: expected ArgumentsRejected, got {other:?}"),
        }
    }
    check(undecoded(), json!({"recipient": "a", "priority": 1})).assert_ok();
}

/// A small deterministic generator (xorshift64*), so a failure reproduces from its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Recorded arguments as a model or a typed call could have produced them: `subject`
/// null or left out when absent.
fn recorded(rng: &mut Rng) -> Value {
    const NAMES: [&str; 4] = ["ann@example.com", "", "bob", "ünïcødé"];
    let subject = match rng.below(3) {
        0 => None,
        1 => Some(String::new()),
        _ => Some(format!("order {}", rng.below(1000))),
    };
    let recorded = Recorded {
        to: NAMES[usize::try_from(rng.below(4)).expect("small")].to_owned(),
        subject,
        priority: u8::try_from(rng.below(256)).expect("a byte"),
    };
    let mut value = serde_json::to_value(&recorded).expect("encode");
    if recorded.subject.is_none() && rng.below(2) == 0 {
        value.as_object_mut().expect("object").remove("subject");
    }
    value
}

/// The check's verdict on `args` (clear, or with `to` masked) against today's type `A`
/// equals serde's on the clear arguments.
fn assert_verdict_is_serdes<A: DeserializeOwned + JsonSchema + 'static>(
    mutation: &str,
    clear: &Value,
    mask: bool,
    seen: &mut [usize; 2],
) -> bool {
    let serde_reads = serde_json::from_value::<A>(clear.clone()).is_ok();
    let mut stored = clear.clone();
    if mask {
        stored["to"] = masked();
    }
    let report = check(typed::<A>(if mask { &["to"] } else { &[] }), stored.clone());
    assert!(
        kinds(&report).iter().all(|k| matches!(
            k,
            FailureKind::ArgumentsRejected(_) | FailureKind::ArgumentRenamed { .. }
        )),
        "{mutation} {stored}: {report}"
    );
    assert_eq!(
        report.is_ok(),
        serde_reads,
        "{mutation}: serde {} {clear}, the check says: {report}",
        if serde_reads { "reads" } else { "refuses" }
    );
    seen[usize::from(serde_reads)] += 1;
    serde_reads
}

#[test]
fn the_verdict_is_serdes_over_argument_mutations() {
    use today::*;
    type Case = (&'static str, fn(&Value, bool, &mut [usize; 2]) -> bool);
    macro_rules! cases {
        ($($ty:ident),*) => {
            [$((stringify!($ty), (|v, m, s| assert_verdict_is_serdes::<$ty>(stringify!($ty), v, m, s)) as fn(&Value, bool, &mut [usize; 2]) -> bool)),*]
        };
    }
    let cases: [Case; 13] = cases!(
        Unchanged,
        RenamedWithAlias,
        Renamed,
        RenamedStrict,
        RenamedStrictWithAlias,
        AddedOptional,
        AddedDefaulted,
        AddedRequired,
        Removed,
        RemovedStrict,
        Retyped,
        Narrowed,
        MadeRequired
    );
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut seen = vec![[0usize; 2]; cases.len()];
    for _ in 0..150 {
        let clear = recorded(&mut rng);
        for ((_, case), seen) in cases.iter().zip(&mut seen) {
            case(&clear, false, seen);
            case(&clear, true, seen);
        }
    }
    let verdicts: Vec<(&str, [usize; 2])> = cases.iter().map(|(name, _)| *name).zip(seen).collect();
    // Every mutation was exercised, and the value-dependent ones both ways.
    for (name, [refused, read]) in &verdicts {
        let expect_both = matches!(*name, "RemovedStrict" | "Narrowed" | "MadeRequired");
        let always_read = matches!(
            *name,
            "Unchanged"
                | "RenamedWithAlias"
                | "RenamedStrictWithAlias"
                | "AddedOptional"
                | "AddedDefaulted"
                | "Removed"
        );
        if expect_both {
            assert!(*refused > 0 && *read > 0, "{verdicts:?}");
        } else if always_read {
            assert_eq!(*refused, 0, "{name}: {verdicts:?}");
        } else {
            assert_eq!(*read, 0, "{name}: {verdicts:?}");
        }
    }
}
