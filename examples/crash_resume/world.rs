//! The outside world the agent acts on, kept in files beside the database and never in
//! it: whatever the store says, these files say what really happened.
//!
//! - **Channels** (`outbox`, `slack`, `warehouse`): systems that cannot deduplicate. Every
//!   delivery appends one line; a second call delivers a second time. Each line carries
//!   the journal call id the tool passed along (as a mail client sets a `Message-ID`
//!   header), which is what a verify hook or an operator looks for.
//! - **Receivers** (`payments`, `stock`, `orders`): upstream APIs that deduplicate on an
//!   idempotency key, as Stripe does. Every request appends one line; only the first
//!   request with a key is *applied*, later ones get the first one's response back.
//! - **Executions**: one line per tool body run, whatever the class: how the tests count
//!   that a tool ran zero more times.
//!
//! Every line is written with one `write` and then `fsync`ed, so a process killed at
//! any instant leaves whole lines only.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Channels with no deduplication: a delivery per call.
#[allow(dead_code)] // read by tests/torture.rs; the demo audits the ones it uses
pub const CHANNELS: [&str; 3] = ["outbox", "slack", "warehouse"];

/// Receivers that deduplicate by idempotency key.
#[allow(dead_code)] // read by tests/torture.rs; the demo audits the ones it uses
pub const RECEIVERS: [&str; 3] = ["payments", "stock", "orders"];

/// One delivery on a channel.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Delivery {
    /// 1, 2, 3… in the order of delivery.
    pub seq: u64,
    /// The journal call id the tool passed along.
    pub call: String,
    /// What was delivered.
    pub args: Value,
    /// What the channel answered (the tool's result).
    pub result: Value,
}

/// One request to a receiver.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Request {
    /// The idempotency key.
    pub key: String,
    /// The journal's execution attempt (2 = re-run after a crash).
    pub attempt: i32,
    /// Whether this request was applied (`false`: deduplicated).
    pub applied: bool,
    /// The receiver's answer (the first one's, for a deduplicated request).
    pub result: Value,
}

/// One run of a tool body.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Execution {
    /// The tool.
    pub tool: String,
    /// The journal call id.
    pub call: String,
    /// The journal's execution attempt.
    pub attempt: i32,
}

/// The directory holding the world's files.
#[derive(Debug, Clone)]
pub struct World {
    dir: PathBuf,
}

static WORLD: OnceLock<World> = OnceLock::new();

/// Sets the world the tools of this process act on (once).
pub fn install(dir: PathBuf) {
    let _ = WORLD.set(World::new(dir));
}

/// The world installed in this process.
pub fn world() -> io::Result<&'static World> {
    WORLD
        .get()
        .ok_or_else(|| io::Error::other("no world installed: call world::install first"))
}

impl World {
    /// The world in `dir` (created if missing).
    pub fn new(dir: PathBuf) -> Self {
        World { dir }
    }

    /// Its directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn file(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.jsonl"))
    }

    /// Delivers on a channel: appends a line whose result `answer` builds from the
    /// delivery's sequence number, and returns that result.
    pub fn deliver(
        &self,
        channel: &str,
        call: &str,
        args: Value,
        answer: impl FnOnce(u64) -> Value,
    ) -> io::Result<Value> {
        let seq = self.deliveries(channel)?.len() as u64 + 1;
        let result = answer(seq);
        let line = Delivery {
            seq,
            call: call.to_owned(),
            args,
            result: result.clone(),
        };
        self.append(channel, &line)?;
        Ok(result)
    }

    /// The delivery made for journal call `call`, if any.
    pub fn delivery_for(&self, channel: &str, call: &str) -> io::Result<Option<Delivery>> {
        Ok(self
            .deliveries(channel)?
            .into_iter()
            .find(|d| d.call == call))
    }

    /// Every delivery on a channel, in order.
    pub fn deliveries(&self, channel: &str) -> io::Result<Vec<Delivery>> {
        self.read(channel)
    }

    /// Sends a keyed request to a receiver: applied (with the result `answer` builds from
    /// the number of applied requests) if the key is new, otherwise answered with the
    /// first request's result.
    pub fn request(
        &self,
        receiver: &str,
        key: &str,
        attempt: i32,
        answer: impl FnOnce(u64) -> Value,
    ) -> io::Result<Value> {
        let seen = self.requests(receiver)?;
        let line = match seen.iter().find(|r| r.applied && r.key == key) {
            Some(first) => Request {
                key: key.to_owned(),
                attempt,
                applied: false,
                result: first.result.clone(),
            },
            None => Request {
                key: key.to_owned(),
                attempt,
                applied: true,
                result: answer(seen.iter().filter(|r| r.applied).count() as u64 + 1),
            },
        };
        self.append(receiver, &line)?;
        Ok(line.result)
    }

    /// Every request a receiver got, in order.
    pub fn requests(&self, receiver: &str) -> io::Result<Vec<Request>> {
        self.read(receiver)
    }

    /// Logs a run of a tool body.
    pub fn executed(&self, tool: &str, call: &str, attempt: i32) -> io::Result<()> {
        self.append(
            "executions",
            &Execution {
                tool: tool.to_owned(),
                call: call.to_owned(),
                attempt,
            },
        )
    }

    /// Every run of a tool body, in order.
    pub fn executions(&self) -> io::Result<Vec<Execution>> {
        self.read("executions")
    }

    fn append<T: Serialize>(&self, name: &str, line: &T) -> io::Result<()> {
        std::fs::create_dir_all(&self.dir)?;
        let mut text = serde_json::to_string(line).map_err(io::Error::other)?;
        text.push('\n');
        let mut file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.file(name))?;
        // One write: a kill leaves the whole line or none of it.
        file.write_all(text.as_bytes())?;
        file.sync_all()
    }

    fn read<T: for<'de> Deserialize<'de>>(&self, name: &str) -> io::Result<Vec<T>> {
        let path = self.file(name);
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        text.lines()
            .enumerate()
            .map(|(i, line)| {
                serde_json::from_str(line).map_err(|e| {
                    io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("{}:{}: {e}", path.display(), i + 1),
                    )
                })
            })
            .collect()
    }

    /// Makes sure the directory exists (so a reader finds it even before any effect).
    pub fn create(&self) -> io::Result<()> {
        std::fs::create_dir_all(&self.dir)?;
        File::open(&self.dir).map(drop)
    }
}
