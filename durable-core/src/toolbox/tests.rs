use futures_util::future::BoxFuture;
use serde_json::json;

use super::*;
use crate::replay::ReplayClass;

/// A tool that is never invoked here (dispatch is tested against a real store in the
/// facade's `tests/toolbox.rs`).
struct Named(ToolSpec);

impl Tool for Named {
    fn spec(&self) -> &ToolSpec {
        &self.0
    }

    fn invoke<'a>(
        &'a self,
        _journal: &'a Journal,
        _args: Value,
    ) -> BoxFuture<'a, Result<ToolOutput, DurableError>> {
        Box::pin(async {
            Err(DurableError::Encode {
                what: "invoke".into(),
                detail: "not invoked in unit tests".into(),
            })
        })
    }
}

fn named(name: &str, class: ReplayClass) -> Named {
    Named(ToolSpec::new(
        name,
        format!("The {name} tool."),
        class,
        json!({"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}),
    ))
}

#[test]
fn registration_refuses_duplicates_and_bad_names() {
    let mut tools = Toolbox::new()
        .with(named("search", ReplayClass::Pure))
        .expect("first");
    let err = tools
        .register(named("search", ReplayClass::UnsafeOnReplay))
        .expect_err("duplicate");
    assert_eq!(err, ToolboxError::Duplicate("search".into()));
    assert_eq!(
        tools.get("search").map(|t| t.spec().class),
        Some(ReplayClass::Pure),
        "the first registration is kept"
    );
    for bad in ["", "two words", "@model", "a.b"] {
        let err = Toolbox::new()
            .with(named(bad, ReplayClass::Pure))
            .expect_err("bad name");
        assert!(matches!(err, ToolboxError::InvalidName(_)), "{bad}: {err}");
    }
    let shared: Arc<dyn Tool> = Arc::new(named("fetch", ReplayClass::Pure));
    tools.register_arc(Arc::clone(&shared)).expect("arc");
    assert_eq!(tools.len(), 2);
    assert!(!tools.is_empty());
}

#[test]
fn exports_are_in_name_order() {
    let tools = Toolbox::new()
        .with(named("send_email", ReplayClass::UnsafeOnReplay))
        .and_then(|t| t.with(named("charge", ReplayClass::IdempotentWithKey)))
        .and_then(|t| t.with(named("read", ReplayClass::Pure)))
        .expect("register");
    assert_eq!(
        tools.names().collect::<Vec<_>>(),
        ["charge", "read", "send_email"]
    );
    let names = |tools: Vec<Value>, pick: fn(&Value) -> &Value| {
        tools
            .iter()
            .map(|t| pick(t).as_str().unwrap_or_default().to_owned())
            .collect::<Vec<_>>()
    };
    let expected = ["charge", "read", "send_email"];
    assert_eq!(
        names(
            tools.openai_tools().all().expect("openai"),
            |t| &t["function"]["name"]
        ),
        expected
    );
    assert_eq!(
        names(
            tools.openai_response_tools().all().expect("responses"),
            |t| &t["name"]
        ),
        expected
    );
    assert_eq!(
        names(
            tools.anthropic_tools().all().expect("anthropic"),
            |t| &t["name"]
        ),
        expected
    );
    let list = tools.mcp_tools_list().expect("mcp");
    assert_eq!(
        names(list["tools"].as_array().cloned().unwrap_or_default(), |t| {
            &t["name"]
        }),
        expected
    );
    assert_eq!(list["tools"][2]["annotations"]["destructiveHint"], true);
    assert_eq!(list["tools"][1]["annotations"]["readOnlyHint"], true);

    // One tool the strict dialect cannot express fails the OpenAI export, naming it.
    let map = Named(ToolSpec::new(
        "headers",
        "",
        ReplayClass::Pure,
        json!({"type": "object", "properties": {"h": {"type": "object", "additionalProperties": {"type": "string"}}}}),
    ));
    let tools = tools.with(map).expect("register");
    let openai = tools.openai_tools();
    // The others are still exported, in name order; the map is listed with its reason.
    assert_eq!(
        names(openai.tools().to_vec(), |t| &t["function"]["name"]),
        expected
    );
    let [err] = openai.skipped() else {
        panic!("one tool skipped: {:?}", openai.skipped());
    };
    assert_eq!(err.tool, "headers");
    assert_eq!(err.pointer, "/properties/h/additionalProperties");
    assert!(
        matches!(err.kind, crate::SchemaErrorKind::OpenMap(_)),
        "{err}"
    );
    assert_eq!(
        tools.openai_response_tools().skipped(),
        std::slice::from_ref(err)
    );
    // `all` refuses the partial export, naming the tool and what to change.
    let whole = openai.clone().all().expect_err("partial");
    assert_eq!(whole.skipped, std::slice::from_ref(err));
    let text = whole.to_string();
    assert!(
        text.starts_with("1 tool cannot be exported in this dialect: tool `headers`: schema at `/properties/h/additionalProperties`")
            && text.contains("use a struct with named fields"),
        "{text}"
    );
    // Anthropic and MCP express maps: every tool.
    assert_eq!(tools.anthropic_tools().all().map(|t| t.len()), Ok(4));
    assert_eq!(
        tools
            .mcp_tools_list()
            .map(|l| l["tools"].as_array().map(Vec::len)),
        Ok(Some(4))
    );
}

#[test]
fn calls_are_read_from_the_transcript_and_from_provider_json() {
    let message = Message::assistant(vec![
        Block::text("Let me check."),
        Block::tool_call("c1", "read", json!(r#"{"q": "a"}"#)),
        Block::tool_call("c2", "read", json!({"q": "b"})),
    ]);
    assert_eq!(
        ModelToolCall::from_message(&message),
        [
            ModelToolCall {
                id: "c1".into(),
                name: "read".into(),
                arguments: ToolArguments::Text(r#"{"q": "a"}"#.into()),
            },
            ModelToolCall {
                id: "c2".into(),
                name: "read".into(),
                arguments: ToolArguments::Json(json!({"q": "b"})),
            },
        ]
    );

    let chat = json!({"id": "call_9", "type": "function",
                      "function": {"name": "read", "arguments": "{\"q\":\"x\"}"}});
    let responses = json!({"type": "function_call", "call_id": "call_9", "name": "read",
                           "arguments": "{\"q\":\"x\"}"});
    let expected = ModelToolCall::new("call_9", "read", r#"{"q":"x"}"#);
    assert_eq!(ModelToolCall::from_openai(&chat), Some(expected.clone()));
    assert_eq!(ModelToolCall::from_openai(&responses), Some(expected));
    assert_eq!(
        ModelToolCall::from_anthropic(
            &json!({"type": "tool_use", "id": "toolu_1", "name": "read", "input": {"q": "x"}})
        ),
        Some(ModelToolCall::new("toolu_1", "read", json!({"q": "x"})))
    );
    assert_eq!(
        ModelToolCall::from_anthropic(&json!({"type": "text", "text": "hi"})),
        None
    );
    assert_eq!(
        ModelToolCall::from_openai(&json!({"function": {"name": "x"}})),
        None
    );
}

#[test]
fn results_render_for_every_provider() {
    let ok = ToolResult {
        call_id: "c1".into(),
        name: "read".into(),
        output: ToolOutput {
            content: json!({"bytes": 8}),
            is_error: false,
        },
    };
    let failed = ToolResult {
        call_id: "c2".into(),
        name: "read".into(),
        output: ToolOutput {
            content: json!("no such file"),
            is_error: true,
        },
    };
    assert_eq!(ok.content_text(), r#"{"bytes":8}"#);
    assert_eq!(failed.content_text(), "no such file");
    assert_eq!(
        ok.openai_message(),
        json!({"role": "tool", "tool_call_id": "c1", "content": "{\"bytes\":8}"})
    );
    assert_eq!(
        failed.openai_response_item(),
        json!({"type": "function_call_output", "call_id": "c2", "output": "no such file"})
    );
    assert_eq!(
        failed.anthropic_block(),
        json!({"type": "tool_result", "tool_use_id": "c2", "content": "no such file", "is_error": true})
    );
    assert_eq!(
        ok.mcp_result(),
        json!({"content": [{"type": "text", "text": "{\"bytes\":8}"}], "isError": false,
               "structuredContent": {"bytes": 8}})
    );
    assert!(failed.mcp_result().get("structuredContent").is_none());

    let message = ToolResult::message(&[ok.clone(), failed.clone()]);
    assert_eq!(message.role, Role::Tool);
    assert_eq!(message.content, vec![ok.to_block(), failed.to_block()]);
    assert_eq!(
        failed.into_message(),
        Message::tool_result("c2", json!("no such file"), true)
    );
}

#[test]
fn only_mistakes_of_the_model_are_sent_back_to_it() {
    let call = ModelToolCall::new("c", "x", "{}");
    let unknown = DurableError::UnknownTool {
        name: "x".into(),
        available: "read".into(),
    };
    let answer = ToolResult::refused(&call, &unknown).expect("model error");
    assert_eq!(
        answer.output.content,
        json!({"error": "unknown tool `x`; registered tools: read"})
    );
    let store = DurableError::Store(crate::StoreError::Unsupported {
        operation: "x",
        backend: "test",
    });
    assert!(ToolResult::refused(&call, &store).is_none());
    assert!(
        ToolResult::refused(
            &call,
            &DurableError::BudgetExceeded(crate::snapshot::BudgetExceeded {
                session: None,
                limit: crate::snapshot::Limit::Tokens,
                ceiling: 1,
                spent: 1,
                asked: None
            })
        )
        .is_none()
    );
}

#[test]
fn long_unknown_names_are_shortened_in_errors() {
    let long = "x".repeat(10_000);
    let quoted = quoted_name(&long);
    assert_eq!(quoted.chars().count(), MAX_QUOTED_NAME + 1);
    assert!(quoted.ends_with('…'));
    assert_eq!(quoted_name("short"), "short");
}

/// Dispatch futures can be spawned on a multi-threaded runtime (checked at compile time).
#[allow(dead_code)]
fn dispatch_futures_are_send(tools: &Toolbox, journal: &Journal, calls: &[ModelToolCall]) {
    fn assert_send<T: Send>(_: &T) {}
    assert_send(&tools.dispatch(journal, &calls[0]));
    assert_send(&tools.dispatch_all(journal, calls));
    fn assert_send_sync<T: Send + Sync + Clone>() {}
    assert_send_sync::<Toolbox>();
}

/// A tool whose `check_args` refuses a `q` that is not a string, as a generated tool's
/// deserialization would.
struct Checked(ToolSpec);

impl Tool for Checked {
    fn spec(&self) -> &ToolSpec {
        &self.0
    }

    fn invoke<'a>(
        &'a self,
        journal: &'a Journal,
        args: Value,
    ) -> BoxFuture<'a, Result<ToolOutput, DurableError>> {
        let _ = (journal, args);
        Box::pin(async {
            Err(DurableError::Encode {
                what: "invoke".into(),
                detail: "not invoked".into(),
            })
        })
    }

    fn check_args(&self, args: &Value) -> Result<(), DurableError> {
        if args.get("q").is_some_and(Value::is_string) {
            Ok(())
        } else {
            Err(DurableError::ArgumentsMismatch {
                tool: self.0.name.clone(),
                path: "$.q".into(),
                message: "expected a string".into(),
            })
        }
    }
}

#[test]
fn check_refuses_what_dispatch_would_and_returns_the_hashed_arguments() {
    let spec = ToolSpec::new(
        "search",
        "Search.",
        ReplayClass::Pure,
        json!({"type": "object", "properties": {"q": {"type": "string"}, "n": {"type": "integer"}}, "required": ["q"]}),
    );
    let tools = Toolbox::new().with(Checked(spec)).expect("register");
    let check = |name: &str, args: ToolArguments| tools.check(&ModelToolCall::new("c", name, args));

    let ok = check(
        "search",
        ToolArguments::Text(r#"{"q": "tea", "n": null}"#.into()),
    );
    assert_eq!(
        ok.ok(),
        Some(json!({"q": "tea"})),
        "null for an optional argument dropped"
    );
    assert!(matches!(
        check("find", json!({"q": "tea"}).into()),
        Err(DurableError::UnknownTool { .. })
    ));
    match check(
        "search",
        ToolArguments::Text(r#"{"q": "a", "q": "b"}"#.into()),
    ) {
        Err(DurableError::InvalidArguments { source, .. }) => assert_eq!(source.path, "$.q"),
        other => panic!("duplicate key: {other:?}"),
    }
    match check("search", json!({"q": 7}).into()) {
        Err(DurableError::ArgumentsMismatch { path, .. }) => assert_eq!(path, "$.q"),
        other => panic!("wrong type: {other:?}"),
    }
    assert!(matches!(
        check("search", json!([1]).into()),
        Err(DurableError::InvalidArguments { .. })
    ));
}

#[test]
fn a_budget_refusal_is_a_result_the_model_can_read() {
    let call = ModelToolCall::new("call_7", "send_email", json!({"to": "ann"}));
    let refusal = crate::snapshot::BudgetExceeded {
        session: Some(crate::SessionId::new("s-1")),
        limit: crate::snapshot::Limit::Tool("send_email".into()),
        ceiling: 3,
        spent: 3,
        asked: Some(1),
    };
    let result = ToolResult::over_budget(&call, &refusal);
    assert!(result.is_error());
    assert_eq!(
        (result.call_id.as_str(), result.name.as_str()),
        ("call_7", "send_email")
    );
    assert_eq!(
        result.output.content,
        json!({
            "error": "budget exceeded: 3 spent of the 3 `send_email` call ceiling, 1 more asked; nothing ran. \
                      Raise it (`durable budget raise s-1 tool:send_email <amount>`) or end the session",
            "limit": "tool:send_email",
            "spent": 3,
            "ceiling": 3,
        })
    );
}
