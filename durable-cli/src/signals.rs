//! `durable signal`: send a signal into a session, and list a session's signals.

use std::sync::Arc;

use clap::{Args, Subcommand};
use durable::store::NewSignal;
use durable::{CheckpointStore, Durable, SessionId};
use serde_json::{Value, json};

use crate::display::{ID, NAME, TEXT, clip};
use crate::error::{CliError, Code};
use crate::operate::CLI_OWNER;
use crate::render::{self, table};

pub(crate) const SIGNAL_HELP: &str = "\
A signal is a message into a session from outside its turn: it waits in the store until
the session reads it (Session::recv_signal, Session::wait_signal), and each one is read
once, at one place of the turn, whatever crashes. A session waiting for a signal of that
name is woken at once, on any worker. This is how a person steers a running agent:

  durable signal send <session> steer --payload '\"use the other account\"'
  durable signal send <session> approve --payload '{\"ok\": true}' --key ticket-42
  durable signal list <session>                  pending and read, oldest first

--payload is JSON (default: null). With --key, a send retried (after a lost reply, say)
sends nothing more; the same key with another payload is refused. A session that ended
takes no signal.";

#[derive(Debug, Args)]
pub(crate) struct SignalArgs {
    #[command(subcommand)]
    pub(crate) action: SignalAction,
}

#[derive(Debug, Subcommand)]
pub(crate) enum SignalAction {
    /// Send a signal into a session (it waits until the session reads it).
    Send {
        /// The session.
        session: String,
        /// The signal's name (what the session reads or waits for).
        name: String,
        /// What it carries, as JSON (default: null).
        #[arg(long, value_name = "JSON")]
        payload: Option<String>,
        /// An idempotency key: a send retried with it sends nothing more.
        #[arg(long, value_name = "KEY")]
        key: Option<String>,
        /// Who sends it (default: $USER).
        #[arg(long, value_name = "NAME")]
        by: Option<String>,
    },
    /// List a session's signals, pending and read, oldest first.
    List {
        /// The session.
        session: String,
        /// Only the pending ones.
        #[arg(long)]
        pending: bool,
    },
}

impl SignalAction {
    pub(crate) fn writes(&self) -> bool {
        matches!(self, SignalAction::Send { .. })
    }
}

pub(crate) async fn signal(
    store: &Arc<dyn CheckpointStore>,
    json: bool,
    args: SignalArgs,
) -> Result<(), CliError> {
    match args.action {
        SignalAction::Send {
            session,
            name,
            payload,
            key,
            by,
        } => {
            let by = crate::operator(by)?;
            let payload: Value = match payload {
                None => Value::Null,
                Some(text) => serde_json::from_str(&text).map_err(|e| {
                    CliError::new(
                        Code::InvalidInput,
                        format!(
                            "--payload is not JSON ({e}); quote a string as JSON too: --payload '\"text\"'"
                        ),
                    )
                })?,
            };
            let mut signal = NewSignal::new(SessionId::new(session), name, payload, by);
            if let Some(key) = key {
                signal = signal.with_key(key);
            }
            let durable = Durable::builder(Arc::clone(store)).owner(CLI_OWNER).build();
            let sent = durable.operator().send_signal_with(signal).await?;
            if json {
                return render::print_json(&sent);
            }
            outln!(
                "sent signal `{}` #{} to session `{}`{}",
                clip(&sent.name, NAME),
                sent.id,
                clip(sent.session.as_str(), ID),
                if sent.is_pending() {
                    ": it waits until the session reads it"
                } else {
                    " (sent before under this key, and already read)"
                }
            );
            Ok(())
        }
        SignalAction::List { session, pending } => {
            let id = SessionId::new(session);
            let mut signals = store.signals(&id).await?;
            if pending {
                signals.retain(|s| s.is_pending());
            }
            if json {
                return render::print_json(&signals);
            }
            if signals.is_empty() {
                outln!(
                    "no {}signals for session `{}`",
                    if pending { "pending " } else { "" },
                    clip(id.as_str(), ID)
                );
                return Ok(());
            }
            let mut t = table(["#", "NAME", "FROM", "SENT", "READ", "PAYLOAD"]);
            for s in &signals {
                t.add_row(vec![
                    s.id.to_string(),
                    clip(&s.name, NAME),
                    clip(&s.sent_by, NAME),
                    render::time(s.sent_at),
                    s.consumed_at
                        .map_or_else(|| "pending".to_owned(), render::time),
                    clip(&json!(s.payload).to_string(), TEXT),
                ]);
            }
            render::print_table(&t);
            Ok(())
        }
    }
}
