//! The world outside the store: the ledgers of real effects (an outbox, a payment API),
//! what the harness was told about each call, and the invariants over them. It lives in
//! the simulation, not in any worker, so it survives every crash.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use serde_json::{Value, json};

use crate::faulty::lock;

/// One logical call of a session's program: `<session>/<step>/<index>` (`model` for the
/// step's model reply).
pub type CallKey = String;

/// The ledgers and observations of one run.
#[derive(Debug, Default)]
pub struct World {
    /// Every email sent: the logical call it served, with the message id the outbox gave.
    emails: Mutex<Vec<Effect>>,
    /// The payment API: charges by idempotency key (applied once each, as a real payment
    /// API deduplicates), with how often each key was presented.
    charges: Mutex<BTreeMap<String, Charge>>,
    /// The first result the harness got for each logical call.
    observed: Mutex<HashMap<CallKey, Value>>,
    /// Model replies asked for (a counter: a reply asked again differs).
    replies: Mutex<u64>,
    /// Invariant violations found while the run went on.
    violations: Mutex<Vec<String>>,
    /// Every wire sent: the logical call, the session that sent it, its result.
    wires: Mutex<Vec<Effect>>,
    /// The operator's decisions on wires, by logical call and the session asking: `true`
    /// approved. Each fork asks anew, and a person decides each request.
    decisions: Mutex<BTreeMap<(CallKey, String), bool>>,
    /// How often each step of each session was run (by session and step).
    attempts: Mutex<BTreeMap<(String, i64), u32>>,
    /// Every signal a harness read: by signal id, the logical call that read it.
    signal_reads: Mutex<BTreeMap<i64, CallKey>>,
}

/// An effect a ledger holds (an email sent, a wire sent).
#[derive(Debug, Clone)]
pub struct Effect {
    /// The logical call.
    pub call: CallKey,
    /// The session whose approved call sent it.
    pub session: String,
    /// What the bank answered.
    pub result: Value,
}

/// Whether `a` and `b` are one session's line: the same session, or one a fork (of a
/// fork…) of the other. Two forks of one session are two lines: a person decides each
/// one's requests, and each may run what the other ran.
pub fn same_line(a: &str, b: &str) -> bool {
    a == b || a.starts_with(&format!("{b}.")) || b.starts_with(&format!("{a}."))
}

/// The result of `call`'s effect as `session` made it, else as a session of its line did.
fn sent_by(effects: &[Effect], call: &CallKey, session: &str) -> Option<Value> {
    let mine = |e: &&Effect| &e.call == call && e.session == session;
    let line = |e: &&Effect| &e.call == call && same_line(&e.session, session);
    effects
        .iter()
        .find(mine)
        .or_else(|| effects.iter().find(line))
        .map(|e| e.result.clone())
}

/// A charge the payment API applied.
#[derive(Debug, Clone)]
pub struct Charge {
    /// The logical call that presented the key first.
    pub call: CallKey,
    /// What the API answered (the same for every presentation of the key).
    pub result: Value,
    /// How often the key was presented.
    pub attempts: usize,
}

impl World {
    /// A worker starts running `step` of `session`: the how-manieth time (1 for the
    /// first), which decides whether the step re-plans.
    pub fn attempt(&self, session: &durable_core::SessionId, step: i64) -> u32 {
        let mut attempts = lock(&self.attempts);
        let n = attempts
            .entry((session.as_str().to_owned(), step))
            .or_insert(0);
        *n += 1;
        *n
    }

    /// A harness read signal `id` at logical call `call`: a signal is read at one place
    /// (a replay, or a fork's replay of an inherited read, reads it at the same one).
    pub fn read_signal(&self, call: &CallKey, id: i64) {
        let mut reads = lock(&self.signal_reads);
        match reads.get(&id) {
            Some(first) if first != call => self.violation(format!(
                "a signal read twice: #{id} read at {first}, then at {call}"
            )),
            Some(_) => {}
            None => {
                reads.insert(id, call.clone());
            }
        }
    }

    /// How many signals the harnesses read.
    pub fn signals_read(&self) -> usize {
        lock(&self.signal_reads).len()
    }

    /// Whether a harness read signal `id`.
    pub fn signal_read(&self, id: i64) -> bool {
        lock(&self.signal_reads).contains_key(&id)
    }

    /// Records a violation.
    pub fn violation(&self, message: String) {
        lock(&self.violations).push(message);
    }

    /// The violations found so far.
    pub fn violations(&self) -> Vec<String> {
        lock(&self.violations).clone()
    }

    /// The outbox sends an email for `call`; a second send for one call is the effect
    /// an `unsafe_on_replay` tool must never repeat.
    /// Sibling forks are two lines (see [`same_line`]).
    pub fn send_email(&self, call: &CallKey, session: &str, attempt: &str) -> Value {
        let mut emails = lock(&self.emails);
        let result = json!({ "message_id": emails.len() + 1 });
        if let Some(first) = emails
            .iter()
            .find(|e| &e.call == call && same_line(&e.session, session))
        {
            self.violation(format!(
                "unsafe effect twice: email for {call} sent again (first {} by {}, now {result} \
                 by {attempt} in {session})",
                first.result, first.session
            ));
        }
        emails.push(Effect {
            call: call.clone(),
            session: session.to_owned(),
            result: result.clone(),
        });
        result
    }

    /// The operator decided on `call`'s wire, as `session` asked for it.
    pub fn decide(&self, call: &CallKey, session: &str, approved: bool) {
        lock(&self.decisions).insert((call.clone(), session.to_owned()), approved);
    }

    /// The bank wires money for `call` from `session`: only once a person approved that
    /// session's request, and once in its line.
    pub fn wire(&self, call: &CallKey, session: &str, amount: u64) -> Value {
        let mut wires = lock(&self.wires);
        let result = json!({ "wire_id": wires.len() + 1, "amount": amount });
        match lock(&self.decisions).get(&(call.clone(), session.to_owned())) {
            Some(true) => {}
            Some(false) => self.violation(format!("a denied call ran: wire for {call}")),
            None => self.violation(format!("a call ran before its approval: wire for {call}")),
        }
        if let Some(first) = wires
            .iter()
            .find(|w| &w.call == call && same_line(&w.session, session))
        {
            self.violation(format!(
                "an approved call ran twice: wire for {call} (first {} by {}, now {result} by \
                 {session})",
                first.result, first.session
            ));
        }
        wires.push(Effect {
            call: call.clone(),
            session: session.to_owned(),
            result: result.clone(),
        });
        result
    }

    /// What the bank knows about `call`'s wire as `session` sent it (or a session of its
    /// line).
    pub fn wire_sent(&self, call: &CallKey, session: &str) -> Option<Value> {
        sent_by(&lock(&self.wires), call, session)
    }

    /// Every wire sent.
    pub fn wires(&self) -> Vec<Effect> {
        lock(&self.wires).clone()
    }

    /// What the outbox knows about `call`'s email: its result if it was sent.
    /// as `session` (or a session of its line) sent it.
    pub fn email_sent(&self, call: &CallKey, session: &str) -> Option<Value> {
        sent_by(&lock(&self.emails), call, session)
    }

    /// Every email sent.
    pub fn emails(&self) -> Vec<Effect> {
        lock(&self.emails).clone()
    }

    /// The payment API charges `amount` for `call` under `key`, deduplicating by key. A
    /// logical call that reaches the API under two keys is charged twice.
    pub fn charge(&self, call: &CallKey, key: &str, amount: u64) -> Value {
        let mut charges = lock(&self.charges);
        if let Some(charge) = charges.get_mut(key) {
            charge.attempts += 1;
            return charge.result.clone();
        }
        if let Some((other, _)) = charges.iter().find(|(_, c)| &c.call == call) {
            self.violation(format!(
                "keyed charge applied twice: {call} charged under key {key} and under {other}"
            ));
        }
        let result = json!({ "charge_id": format!("ch-{}", charges.len() + 1), "amount": amount });
        charges.insert(
            key.to_owned(),
            Charge {
                call: call.clone(),
                result: result.clone(),
                attempts: 1,
            },
        );
        result
    }

    /// What the payment API knows about `key`.
    pub fn charge_applied(&self, key: &str) -> Option<Value> {
        lock(&self.charges).get(key).map(|c| c.result.clone())
    }

    /// Every charge applied, by key.
    pub fn charges(&self) -> BTreeMap<String, Charge> {
        lock(&self.charges).clone()
    }

    /// A new model reply (a counter in it, so that a reply asked for again differs).
    pub fn reply(&self, call: &CallKey) -> Value {
        let mut n = lock(&self.replies);
        *n += 1;
        json!({ "reply": format!("{call} #{n}") })
    }

    /// Model replies asked for.
    pub fn replies(&self) -> u64 {
        *lock(&self.replies)
    }

    /// The harness got `result` for `call`: it must be the result it got every other
    /// time (a recorded result is never lost nor changed).
    pub fn observe(&self, call: &CallKey, result: &Value) {
        let mut observed = lock(&self.observed);
        match observed.get(call) {
            Some(first) if first != result => self.violation(format!(
                "recorded result changed: {call} returned {first} first, now {result}"
            )),
            Some(_) => {}
            None => {
                observed.insert(call.clone(), result.clone());
            }
        }
    }
}
