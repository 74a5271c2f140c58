//! Support of `tests/secrets.rs`: a tracing subscriber that records everything, and the
//! generated signatures.

use std::fmt::{Debug, Write as _};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::subscriber::Interest;
use tracing::{Event, Metadata, Subscriber};

pub mod generated;

/// Generated cases of the property (`DURABLE_SECRETS_CASES`, default 48).
pub fn proptest_cases() -> u32 {
    std::env::var("DURABLE_SECRETS_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(48)
}

/// Everything traced in this process, at every level: span names and fields (as
/// created and as recorded later) and events with their fields.
pub struct Trace {
    text: Arc<Mutex<String>>,
}

static TRACE: OnceLock<Arc<Mutex<String>>> = OnceLock::new();

impl Trace {
    /// Installs the recording subscriber as the global default (once per process).
    pub fn install() -> Trace {
        let text = TRACE.get_or_init(|| {
            let text = Arc::new(Mutex::new(String::new()));
            let recorder = Recorder {
                text: Arc::clone(&text),
                next: AtomicU64::new(1),
            };
            tracing::subscriber::set_global_default(recorder).expect("the only subscriber");
            text
        });
        Trace {
            text: Arc::clone(text),
        }
    }

    /// What was recorded so far.
    pub fn text(&self) -> String {
        self.text
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

struct Recorder {
    text: Arc<Mutex<String>>,
    next: AtomicU64,
}

impl Recorder {
    fn write(&self, head: &str, fields: impl FnOnce(&mut Fields)) {
        let mut line = Fields(String::from(head));
        fields(&mut line);
        let mut text = self.text.lock().unwrap_or_else(PoisonError::into_inner);
        text.push_str(&line.0);
        text.push('\n');
    }
}

struct Fields(String);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn Debug) {
        let _ = write!(self.0, " {}={value:?}", field.name());
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        let _ = write!(self.0, " {}={value}", field.name());
    }
}

impl Subscriber for Recorder {
    fn register_callsite(&self, _: &'static Metadata<'static>) -> Interest {
        Interest::always()
    }

    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }

    fn max_level_hint(&self) -> Option<tracing::level_filters::LevelFilter> {
        Some(tracing::level_filters::LevelFilter::TRACE)
    }

    fn new_span(&self, span: &Attributes<'_>) -> Id {
        let meta = span.metadata();
        self.write(&format!("span {} {}", meta.target(), meta.name()), |f| {
            span.record(f);
        });
        Id::from_u64(self.next.fetch_add(1, Ordering::Relaxed))
    }

    fn record(&self, _: &Id, values: &Record<'_>) {
        self.write("record", |f| values.record(f));
    }

    fn record_follows_from(&self, _: &Id, _: &Id) {}

    fn event(&self, event: &Event<'_>) {
        let meta = event.metadata();
        self.write(&format!("event {} {}", meta.level(), meta.target()), |f| {
            event.record(f);
        });
    }

    fn enter(&self, _: &Id) {}

    fn exit(&self, _: &Id) {}
}
