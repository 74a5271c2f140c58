//! The vocabulary of harness programs: the generated steps, their text form (one step a
//! line, the form of the corpus files and of every printed failure) and the proptest
//! strategy that generates and shrinks them.

use std::fmt;

use proptest::prelude::*;

/// What a model's tool call does to the world.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Class {
    /// `lookup`: `pure`.
    Pure,
    /// `charge`: `idempotent_with_key`, applied by a receiver that deduplicates by key.
    Keyed,
    /// `send_email`: `unsafe_on_replay` with a verify hook.
    Email,
    /// `post_webhook`: `unsafe_on_replay` without a verify hook.
    Webhook,
}

impl Class {
    pub const ALL: [Class; 4] = [Class::Pure, Class::Keyed, Class::Email, Class::Webhook];

    pub fn word(self) -> &'static str {
        match self {
            Class::Pure => "pure",
            Class::Keyed => "keyed",
            Class::Email => "email",
            Class::Webhook => "webhook",
        }
    }
}

/// Where a turn is interrupted. `n` counts the tool bodies that actually run in this
/// attempt of the turn (a recorded result returned runs no body), from 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Disrupt {
    /// The turn runs to its checkpoint.
    None,
    /// The worker dies once the model's reply is journaled, before any call.
    CrashAfterModel,
    /// The worker dies inside the n-th tool body: its row is issued, the effect not done.
    CrashBeforeEffect(u8),
    /// The worker dies inside the n-th tool body after its effect, before the result is
    /// recorded (the in-doubt window).
    CrashAfterEffect(u8),
    /// The worker dies after the last call, before the checkpoint.
    CrashBeforeCheckpoint,
    /// Another worker takes the session once the reply is journaled; this worker goes on
    /// with the turn as a zombie.
    LoseLeaseAfterModel,
    /// Another worker takes the session while the n-th tool body runs (after its effect);
    /// this worker goes on as a zombie.
    LoseLeaseInCall(u8),
}

/// Which registration of the tools a worker runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Schema {
    /// The original argument names.
    V1,
    /// One field of every tool renamed; the old name is no longer accepted.
    V2,
    /// The same rename with a serde alias, so arguments of the old shape still decode.
    V2Alias,
}

/// What the email tool's verify hook answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum VerifyMode {
    /// It looks in the outbox (the ledger): happened or did not happen.
    Truthful,
    /// It cannot tell.
    Unknown,
}

/// One step of a harness program.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Op {
    /// A turn of the ordinary harness: ask the model (journaled; a fresh model proposes
    /// one call of each listed class, with new intents), dispatch every call it proposes
    /// one after the other, turn every refusal into a tool-result message, checkpoint.
    /// After a crash the next turn re-runs the step (the journaled reply replays).
    Turn { calls: Vec<Class>, disrupt: Disrupt },
    /// The worker dies between turns; the next step resumes with a new worker.
    Restart,
    /// A new release of the harness whose model-reply format differs: a journaled reply
    /// of the old format is ignored and the model is asked again, at the next position;
    /// it proposes the same intents with other arguments. The worker stops and releases.
    ReAsk,
    /// A new release registers the tools under another schema. The worker stops and
    /// releases.
    SchemaChange(Schema),
    /// An operator resolves every in-doubt call of the session, truthfully from the ledger.
    Operator,
    /// The email verify hook's behaviour from now on.
    Verify(VerifyMode),
    /// Fork the session from its latest checkpoint minus `back` versions; work moves to
    /// the fork, whose model uses intents of its own.
    Fork { back: u8 },
    /// Work moves to the next session of the program (source or fork).
    Switch,
    /// From now on, every call with a side effect needs a person's approval (`on`), or
    /// none does (`off`): the runtime's approval policy of every new worker.
    Approvals(bool),
    /// A person decides every call of the session awaiting approval.
    Decide(Verdict),
}

/// A person's decision in [`Op::Decide`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Verdict {
    /// Approve as requested.
    Approve,
    /// Deny with a reason.
    Deny,
}

impl fmt::Display for Disrupt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Disrupt::None => Ok(()),
            Disrupt::CrashAfterModel => f.write_str(" crash-after-model"),
            Disrupt::CrashBeforeEffect(n) => write!(f, " crash-before-effect:{n}"),
            Disrupt::CrashAfterEffect(n) => write!(f, " crash-after-effect:{n}"),
            Disrupt::CrashBeforeCheckpoint => f.write_str(" crash-before-checkpoint"),
            Disrupt::LoseLeaseAfterModel => f.write_str(" lose-lease-after-model"),
            Disrupt::LoseLeaseInCall(n) => write!(f, " lose-lease-in-call:{n}"),
        }
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Op::Turn { calls, disrupt } => {
                let words: Vec<&str> = calls.iter().map(|c| c.word()).collect();
                write!(f, "turn {}{disrupt}", words.join(","))
            }
            Op::Restart => f.write_str("restart"),
            Op::ReAsk => f.write_str("reask"),
            Op::SchemaChange(Schema::V1) => f.write_str("schema v1"),
            Op::SchemaChange(Schema::V2) => f.write_str("schema v2"),
            Op::SchemaChange(Schema::V2Alias) => f.write_str("schema v2-alias"),
            Op::Operator => f.write_str("operator"),
            Op::Verify(VerifyMode::Truthful) => f.write_str("verify truthful"),
            Op::Verify(VerifyMode::Unknown) => f.write_str("verify unknown"),
            Op::Fork { back } => write!(f, "fork {back}"),
            Op::Switch => f.write_str("switch"),
            Op::Approvals(true) => f.write_str("approvals on"),
            Op::Approvals(false) => f.write_str("approvals off"),
            Op::Decide(Verdict::Approve) => f.write_str("decide approve"),
            Op::Decide(Verdict::Deny) => f.write_str("decide deny"),
        }
    }
}

/// A program as text: one step a line.
pub fn render(program: &[Op]) -> String {
    program.iter().map(|op| format!("{op}\n")).collect()
}

fn parse_index(word: &str, prefix: &str) -> Option<u8> {
    word.strip_prefix(prefix)?.parse().ok()
}

fn parse_disrupt(word: Option<&str>) -> Result<Disrupt, String> {
    let Some(word) = word else {
        return Ok(Disrupt::None);
    };
    let parsed = match word {
        "crash-after-model" => Some(Disrupt::CrashAfterModel),
        "crash-before-checkpoint" => Some(Disrupt::CrashBeforeCheckpoint),
        "lose-lease-after-model" => Some(Disrupt::LoseLeaseAfterModel),
        _ => parse_index(word, "crash-before-effect:")
            .map(Disrupt::CrashBeforeEffect)
            .or_else(|| parse_index(word, "crash-after-effect:").map(Disrupt::CrashAfterEffect))
            .or_else(|| parse_index(word, "lose-lease-in-call:").map(Disrupt::LoseLeaseInCall)),
    };
    parsed.ok_or_else(|| format!("unknown disruption `{word}`"))
}

fn parse_op(line: &str) -> Result<Op, String> {
    let mut words = line.split_whitespace();
    let head = words.next().unwrap_or_default();
    let arg = words.next();
    let op = match (head, arg) {
        ("turn", Some(classes)) => {
            let calls = classes
                .split(',')
                .map(|w| {
                    Class::ALL
                        .into_iter()
                        .find(|c| c.word() == w)
                        .ok_or_else(|| format!("unknown call class `{w}`"))
                })
                .collect::<Result<Vec<_>, _>>()?;
            let disrupt = parse_disrupt(words.next())?;
            Op::Turn { calls, disrupt }
        }
        ("restart", None) => Op::Restart,
        ("reask", None) => Op::ReAsk,
        ("schema", Some("v1")) => Op::SchemaChange(Schema::V1),
        ("schema", Some("v2")) => Op::SchemaChange(Schema::V2),
        ("schema", Some("v2-alias")) => Op::SchemaChange(Schema::V2Alias),
        ("operator", None) => Op::Operator,
        ("verify", Some("truthful")) => Op::Verify(VerifyMode::Truthful),
        ("verify", Some("unknown")) => Op::Verify(VerifyMode::Unknown),
        ("fork", Some(n)) => Op::Fork {
            back: n.parse().map_err(|e| format!("fork `{n}`: {e}"))?,
        },
        ("switch", None) => Op::Switch,
        ("approvals", Some("on")) => Op::Approvals(true),
        ("approvals", Some("off")) => Op::Approvals(false),
        ("decide", Some("approve")) => Op::Decide(Verdict::Approve),
        ("decide", Some("deny")) => Op::Decide(Verdict::Deny),
        _ => return Err(format!("cannot read step `{line}`")),
    };
    if let Some(extra) = words.next() {
        return Err(format!("unexpected `{extra}` in `{line}`"));
    }
    Ok(op)
}

/// Reads a program: one step a line; `#` starts a comment; blank lines are skipped.
pub fn parse(text: &str) -> Result<Vec<Op>, String> {
    text.lines()
        .map(|line| line.split('#').next().unwrap_or_default().trim())
        .filter(|line| !line.is_empty())
        .map(parse_op)
        .collect()
}

// ---------------------------------------------------------------------------------------
// Generation. Variants are listed simplest first: proptest shrinks a `prop_oneof!`
// towards its first arm, and a `Vec` by dropping elements.

fn class() -> impl Strategy<Value = Class> {
    prop_oneof![
        Just(Class::Pure),
        Just(Class::Keyed),
        Just(Class::Email),
        Just(Class::Webhook),
    ]
}

fn disrupt() -> impl Strategy<Value = Disrupt> {
    prop_oneof![
        8 => Just(Disrupt::None),
        2 => Just(Disrupt::CrashAfterModel),
        2 => (0u8..3).prop_map(Disrupt::CrashBeforeEffect),
        4 => (0u8..3).prop_map(Disrupt::CrashAfterEffect),
        2 => Just(Disrupt::CrashBeforeCheckpoint),
        1 => Just(Disrupt::LoseLeaseAfterModel),
        1 => (0u8..3).prop_map(Disrupt::LoseLeaseInCall),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        12 => (proptest::collection::vec(class(), 1..=3), disrupt())
            .prop_map(|(calls, disrupt)| Op::Turn { calls, disrupt }),
        2 => Just(Op::Restart),
        2 => Just(Op::ReAsk),
        2 => prop_oneof![
            Just(Schema::V1),
            Just(Schema::V2),
            Just(Schema::V2Alias)
        ]
        .prop_map(Op::SchemaChange),
        2 => Just(Op::Operator),
        3 => prop_oneof![Just(VerifyMode::Unknown), Just(VerifyMode::Truthful)].prop_map(Op::Verify),
        1 => (0u8..3).prop_map(|back| Op::Fork { back }),
        1 => Just(Op::Switch),
        3 => prop_oneof![Just(true), Just(false)].prop_map(Op::Approvals),
        4 => prop_oneof![Just(Verdict::Approve), Just(Verdict::Deny)].prop_map(Op::Decide),
    ]
}

/// Programs of 1 to `max_len` steps.
pub fn programs(max_len: usize) -> impl Strategy<Value = Vec<Op>> {
    proptest::collection::vec(op(), 1..=max_len)
}

/// Every rendered program reads back as itself (checked on each generated program).
pub fn round_trips(program: &[Op]) -> bool {
    parse(&render(program)).as_deref() == Ok(program)
}
