//! The parent side of worker processes: spawn this binary as a worker, read its lines,
//! signal it, wait for it with a deadline.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::time::{Duration, Instant};

use crate::backend::Backend;
use crate::worker;

/// Where a worker's output goes.
pub enum Output {
    /// Stdout lines are read by the parent (stderr is inherited).
    Lines,
    /// Stdout and stderr are appended to a log file.
    Log(PathBuf),
}

/// A running worker process.
pub struct Worker {
    /// The process.
    pub child: Child,
    /// Its owner name.
    pub owner: String,
    stdin: Option<ChildStdin>,
    lines: Option<Receiver<String>>,
    log: Option<PathBuf>,
}

impl Worker {
    /// Spawns this test binary as a worker playing `role` for `owner` on `backend`.
    pub fn spawn(
        role: &str,
        backend: &Backend,
        owner: &str,
        ttl: Duration,
        extra: &[(&str, &str)],
        output: Output,
    ) -> Worker {
        let exe = std::env::current_exe().expect("current exe");
        let mut cmd = Command::new(exe);
        cmd.env(worker::ROLE, role)
            .env(worker::STORE, backend.store_url())
            .env(worker::LEDGER, backend.ledger_url())
            .env(worker::OWNER, owner)
            .env(worker::TTL_MS, ttl.as_millis().to_string())
            .stdin(Stdio::piped());
        for (k, v) in extra {
            cmd.env(k, v);
        }
        let log = match &output {
            Output::Lines => {
                cmd.stdout(Stdio::piped()).stderr(Stdio::inherit());
                None
            }
            Output::Log(path) => {
                let file = || {
                    std::fs::OpenOptions::new()
                        .create(true)
                        .append(true)
                        .open(path)
                        .expect("open worker log")
                };
                cmd.stdout(file()).stderr(file());
                Some(path.clone())
            }
        };
        let mut child = cmd.spawn().expect("spawn worker");
        let stdin = child.stdin.take();
        let lines = child.stdout.take().map(|out| {
            let (tx, rx) = channel();
            std::thread::spawn(move || {
                for line in BufReader::new(out).lines() {
                    let Ok(line) = line else { break };
                    if tx.send(line).is_err() {
                        break;
                    }
                }
            });
            rx
        });
        Worker {
            child,
            owner: owner.to_owned(),
            stdin,
            lines,
            log,
        }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Writes one line to its stdin.
    pub fn send(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("stdin is piped");
        writeln!(stdin, "{line}").expect("write to worker");
        stdin.flush().expect("flush worker stdin");
    }

    /// Closes its stdin (end of input).
    pub fn close_stdin(&mut self) {
        self.stdin = None;
    }

    /// The next stdout line, within `timeout`.
    pub fn line(&self, timeout: Duration) -> String {
        let lines = self.lines.as_ref().expect("stdout is read as lines");
        match lines.recv_timeout(timeout) {
            Ok(line) => line,
            Err(RecvTimeoutError::Timeout) => panic!("{}: no line within {timeout:?}", self.owner),
            Err(RecvTimeoutError::Disconnected) => panic!("{}: stdout closed", self.owner),
        }
    }

    /// Reads lines until one starts with `prefix`; returns it with the lines before.
    pub fn line_starting(&self, prefix: &str, timeout: Duration) -> (String, Vec<String>) {
        let deadline = Instant::now() + timeout;
        let mut before = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = self.line(left);
            if line.starts_with(prefix) {
                return (line, before);
            }
            before.push(line);
        }
    }

    /// The stdout lines printed so far and not yet read (never waits).
    pub fn ready_lines(&self) -> Vec<String> {
        self.lines
            .as_ref()
            .map(|rx| rx.try_iter().collect())
            .unwrap_or_default()
    }

    /// Every remaining stdout line (after the process exited).
    pub fn rest(&self) -> Vec<String> {
        self.lines
            .as_ref()
            .map(|rx| rx.iter().collect())
            .unwrap_or_default()
    }

    /// Waits for the process to exit, killing it (and failing) after `timeout`.
    pub fn wait(&mut self, timeout: Duration) -> ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            if Instant::now() >= deadline {
                signal(self.pid(), "CONT");
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!(
                    "{} did not exit within {timeout:?}{}",
                    self.owner,
                    self.log_text()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILL, then reap.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Its log file's text, for failure messages (empty without a log).
    pub fn log_text(&self) -> String {
        self.log
            .as_deref()
            .map(|p| format!("\n--- log of {}:\n{}", self.owner, tail(p)))
            .unwrap_or_default()
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        // Never leave a stopped or running worker behind a failed test.
        if let Ok(None) = self.child.try_wait() {
            signal(self.pid(), "CONT");
            self.kill();
        }
    }
}

/// Sends a signal by name (`STOP`, `CONT`) with kill(1): the workspace forbids `unsafe`.
pub fn signal(pid: u32, name: &str) {
    let status = Command::new("kill")
        .arg(format!("-{name}"))
        .arg(pid.to_string())
        .stderr(Stdio::null())
        .status()
        .expect("run kill(1)");
    assert!(
        status.success() || name == "CONT",
        "kill -{name} {pid} failed"
    );
}

/// The last 60 lines of a file.
fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(60)..].join("\n")
}
