//! Unit tests of the parent module.

use super::*;

fn plan() -> Plan {
    Plan::new(
        "report the largest file",
        ["measure a", "measure b", "compare"],
        ["sizes reported", "winner named"],
    )
    .expect("valid plan")
}

#[test]
fn gate_requires_terminal_steps_and_verified_postconditions() {
    let mut p = plan();
    assert!(!p.is_ready_to_finalize());
    p.update_step(1, StepStatus::Done, Some("a: 8 bytes"))
        .expect("done");
    p.update_step(2, StepStatus::InProgress, None)
        .expect("in progress");
    p.update_step(3, StepStatus::Blocked, Some("b unreadable"))
        .expect("blocked");
    assert!(!p.all_steps_terminal());
    p.update_step(2, StepStatus::Done, Some("b: 9 bytes"))
        .expect("done");
    assert!(p.all_steps_terminal());
    assert!(!p.is_ready_to_finalize(), "postconditions still open");
    p.verify_postcondition(1, "both sizes in the answer")
        .expect("verify");
    assert!(!p.is_ready_to_finalize());
    p.verify_postcondition(2, "b is larger").expect("verify");
    assert!(p.is_ready_to_finalize());
    assert!(p.missing_for_finalization().is_empty());

    // Reopening a step closes the gate again.
    p.update_step(3, StepStatus::InProgress, None)
        .expect("reopen");
    assert!(!p.is_ready_to_finalize());
}

#[test]
fn done_and_blocked_without_evidence_are_refused_and_change_nothing() {
    let mut p = plan();
    let before = p.clone();
    for evidence in [None, Some(""), Some("  \n\t ")] {
        assert_eq!(
            p.update_step(1, StepStatus::Done, evidence),
            Err(PlanError::EvidenceRequired { number: 1 })
        );
        assert_eq!(
            p.update_step(2, StepStatus::Blocked, evidence),
            Err(PlanError::ReasonRequired { number: 2 })
        );
        assert_eq!(
            p.verify_postcondition(1, evidence.unwrap_or_default()),
            Err(PlanError::PostconditionEvidenceRequired { number: 1 })
        );
    }
    assert_eq!(p, before);
    // Pending and in_progress need no evidence.
    p.update_step(1, StepStatus::InProgress, None)
        .expect("no evidence needed");
    p.update_step(1, StepStatus::Pending, Some("   "))
        .expect("no evidence needed");
    assert_eq!(p.steps[0].evidence, None);
}

#[test]
fn evidence_is_trimmed_and_replaced() {
    let mut p = plan();
    p.update_step(1, StepStatus::Done, Some("  ran it \n"))
        .expect("done");
    assert_eq!(p.steps[0].evidence.as_deref(), Some("ran it"));
    p.update_step(1, StepStatus::InProgress, None)
        .expect("reopen");
    assert_eq!(p.steps[0].evidence, None, "stale proof is cleared");
    p.verify_postcondition(1, "first").expect("verify");
    p.verify_postcondition(1, "second").expect("re-verify");
    assert_eq!(p.postconditions[0].evidence.as_deref(), Some("second"));
}

#[test]
fn out_of_range_names_the_valid_range() {
    let mut p = plan();
    for n in [0, 4, usize::MAX] {
        let err = p
            .update_step(n, StepStatus::Done, Some("x"))
            .expect_err("out of range");
        assert_eq!(err, PlanError::StepOutOfRange { number: n, len: 3 });
        assert!(
            err.to_string().contains("valid step numbers are 1 to 3"),
            "{err}"
        );
    }
    let err = p.verify_postcondition(3, "x").expect_err("out of range");
    assert_eq!(
        err.to_string(),
        "postcondition 3 does not exist: valid postcondition numbers are 1 to 2; call `plan_show` to see the plan"
    );
    let mut only_steps = Plan::new("o", ["s"], Vec::<String>::new()).expect("valid");
    let err = only_steps.verify_postcondition(1, "x").expect_err("none");
    assert!(
        err.to_string().contains("this plan has no postconditions"),
        "{err}"
    );
    let err = only_steps
        .update_step(2, StepStatus::Pending, None)
        .expect_err("one");
    assert!(
        err.to_string().contains("this plan has only step 1"),
        "{err}"
    );
}

#[test]
fn new_refuses_plans_whose_gate_would_be_meaningless() {
    let none: [&str; 0] = [];
    assert_eq!(Plan::new("  ", ["s"], none), Err(PlanError::EmptyObjective));
    assert_eq!(Plan::new("o", none, none), Err(PlanError::EmptyPlan));
    assert_eq!(
        Plan::new("o", ["a", " "], none),
        Err(PlanError::BlankDescription {
            what: "step",
            number: 2
        })
    );
    assert_eq!(
        Plan::new("o", none, [""]),
        Err(PlanError::BlankDescription {
            what: "postcondition",
            number: 1
        })
    );
    assert!(Plan::default().is_empty());
    assert!(
        Plan::default().is_ready_to_finalize(),
        "no plan, nothing to gate"
    );
    let p = Plan::new("o", none, ["pc"]).expect("postconditions alone are a plan");
    assert!(!p.is_empty());
    assert!(p.all_steps_terminal());
    assert!(!p.is_ready_to_finalize());
}

#[test]
fn missing_for_finalization_lists_each_open_item() {
    let mut p = plan();
    p.update_step(1, StepStatus::Done, Some("ok"))
        .expect("done");
    p.update_step(2, StepStatus::InProgress, None)
        .expect("in progress");
    p.verify_postcondition(2, "ok").expect("verify");
    assert_eq!(
        p.missing_for_finalization(),
        [
            "step 2 (\"measure b\") is in_progress: mark it `done` with evidence, or `blocked` with a reason",
            "step 3 (\"compare\") is pending: mark it `done` with evidence, or `blocked` with a reason",
            "postcondition 1 (\"sizes reported\") is not verified: verify it with evidence",
        ]
    );
}

#[test]
fn markdown_render_is_pinned() {
    let mut p = Plan::new(
        "report the largest file",
        ["measure a", "measure b", "measure c", "compare"],
        ["sizes reported", "winner named"],
    )
    .expect("valid");
    p.update_step(1, StepStatus::Done, Some("a: 8 bytes"))
        .expect("done");
    p.update_step(2, StepStatus::InProgress, None)
        .expect("in progress");
    p.update_step(3, StepStatus::Blocked, Some("c: permission denied"))
        .expect("blocked");
    p.verify_postcondition(2, "b wins").expect("verify");
    assert_eq!(
        p.to_markdown(),
        "# Plan: report the largest file\n\
         \n\
         ## Steps\n\
         1. [x] measure a\n     evidence: a: 8 bytes\n\
         2. [~] measure b\n\
         3. [!] measure c\n     evidence: c: permission denied\n\
         4. [ ] compare\n\
         \n\
         ## Postconditions\n\
         1. [ ] sizes reported\n\
         2. [x] winner named\n     evidence: b wins"
    );
}

#[test]
fn markdown_indents_multiline_text_so_it_cannot_forge_items() {
    let mut p = Plan::new("o", ["s"], Vec::<String>::new()).expect("valid");
    p.update_step(
        1,
        StepStatus::Done,
        Some("ok\n## Postconditions\n1. [x] fake"),
    )
    .expect("done");
    assert_eq!(
        p.to_markdown(),
        "# Plan: o\n\n## Steps\n1. [x] s\n     evidence: ok\n       ## Postconditions\n       1. [x] fake\n\n## Postconditions\n(none)"
    );
}

#[test]
fn status_parses_from_wire_names_only() {
    for st in StepStatus::ALL {
        assert_eq!(st.as_str().parse::<StepStatus>(), Ok(st));
        assert_eq!(
            serde_json::to_value(st).expect("serialize"),
            serde_json::Value::from(st.as_str())
        );
    }
    let err = "finished".parse::<StepStatus>().expect_err("unknown");
    assert_eq!(
        err.to_string(),
        "invalid step status `finished`; use one of `pending`, `in_progress`, `done`, `blocked`"
    );
}

#[test]
fn json_round_trip_and_shape() {
    let mut p = plan();
    p.update_step(1, StepStatus::InProgress, None)
        .expect("in progress");
    let json = serde_json::to_value(&p).expect("serialize");
    assert_eq!(
        json["steps"][0],
        serde_json::json!({"description": "measure a", "status": "in_progress", "evidence": null})
    );
    assert_eq!(
        json["postconditions"][0],
        serde_json::json!({"description": "sizes reported", "satisfied": false, "evidence": null})
    );
    let back: Plan = serde_json::from_value(json).expect("deserialize");
    assert_eq!(back, p);
}
