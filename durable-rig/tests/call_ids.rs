//! What traces see: the model's call id of each tool call reaches durable's
//! `execute_tool` span (rig announces it only to hooks), and the journaled model call is
//! named by the provider's model id with its token usage.

mod common;

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::sync::{Arc, Mutex};

use durable::telemetry as otel;
use durable::{CheckpointStore, Durable, SessionId, StartOptions};
use durable_openai_stub::Stub;
use durable_rig::DurableRig;
use rig_core::providers::openai::OpenAIConfig;
use serde_json::Value;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

use common::{FINAL, PROMPT, script, toolbox};

#[derive(Default)]
struct Fields(BTreeMap<String, String>);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(field.name().to_owned(), value.to_string());
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().to_owned(), value.to_string());
    }
}

/// Every span's fields as last recorded, in creation order.
#[derive(Clone, Default)]
struct Capture {
    spans: Arc<Mutex<Vec<BTreeMap<String, String>>>>,
}

#[derive(Clone, Copy)]
struct Slot(usize);

impl<S: tracing::Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Capture {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut fields = Fields::default();
        attrs.record(&mut fields);
        let mut spans = self.spans.lock().expect("capture");
        spans.push(fields.0);
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(Slot(spans.len() - 1));
        }
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let Some(Slot(slot)) = span.extensions().get::<Slot>().copied() else {
            return;
        };
        let mut fields = Fields(std::mem::take(
            &mut self.spans.lock().expect("capture")[slot],
        ));
        values.record(&mut fields);
        self.spans.lock().expect("capture")[slot] = fields.0;
    }
}

#[tokio::test(flavor = "current_thread")]
async fn the_models_call_ids_and_model_name_reach_durables_spans() {
    let capture = Capture::default();
    let _guard =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(capture.clone()));

    let stub = Stub::start(script()).await.expect("stub");
    let dir = tempfile::tempdir().expect("dir");
    let url = format!("sqlite:{}", dir.path().join("store.db").display());
    let store: Arc<dyn CheckpointStore> = durable::connect(&url).await.expect("store");
    let durable = Durable::builder(store).owner("rig-tests").build();
    let session = durable
        .start::<Value>(StartOptions::new().with_id(SessionId::new("traced")))
        .await
        .expect("session");
    let rig = DurableRig::new(session.journal().clone(), toolbox());
    let model = OpenAIConfig::new("test-key")
        .with_base_url(stub.base_url())
        .client()
        .chat("stub-model");
    let agent = rig.agent(model).expect("tools").build();
    let reply = agent.prompt(PROMPT).max_turns(5).run().await.expect("run");
    assert_eq!(reply.output(), FINAL);

    let spans = capture.spans.lock().expect("capture").clone();
    // durable's own spans carry `durable.replay.class` (rig's tool span does not).
    let tool_calls: Vec<(&str, &str)> = spans
        .iter()
        .filter(|s| s.contains_key(otel::DURABLE_REPLAY_CLASS))
        .filter_map(|s| {
            Some((
                s.get(otel::GEN_AI_TOOL_NAME)?.as_str(),
                s.get(otel::GEN_AI_TOOL_CALL_ID)?.as_str(),
            ))
        })
        .collect();
    assert_eq!(
        tool_calls,
        [
            ("lookup", "call_lookup"),
            ("send_email", "call_email"),
            ("charge", "call_charge")
        ],
        "{spans:#?}"
    );
    let chats: Vec<_> = spans
        .iter()
        .filter(|s| {
            s.get(otel::OTEL_NAME)
                .is_some_and(|n| n.starts_with("chat"))
        })
        .collect();
    assert_eq!(chats.len(), 2, "{spans:#?}");
    for chat in chats {
        assert_eq!(
            chat.get(otel::GEN_AI_REQUEST_MODEL).map(String::as_str),
            Some("stub-model")
        );
        assert_eq!(
            chat.get(otel::GEN_AI_USAGE_INPUT_TOKENS)
                .map(String::as_str),
            Some("120")
        );
    }
}
